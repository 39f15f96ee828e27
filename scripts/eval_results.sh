#!/usr/bin/env bash
# eval_results.sh - the run behind docs/results-earlier.md: kvchat eval on the default model, every policy at
# budgets of 1%, 5%, 10% and 20%, in stages ordered by what matters most, all into one resumable
# CSV (docs/results/samples.csv). Run it again after an interruption: finished rows are skipped.
# About 70 minutes on a 2-core machine; see docs/results-earlier.md for what it measured.
set -uo pipefail   # a failed stage is reported and the next one runs
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/results}
THREADS=${THREADS:-2}
BIN=${KVCHAT_BIN:-./kvchat}
E=("$BIN" eval --out "$OUT" --threads "$THREADS" --seed 1 --depths 3)
ALL=(--policy all --budget 0.01,0.05,0.1,0.2)
# needle-in-a-haystack at three depths (0%, 50%, 100%) at 2K and 4K
"${E[@]}" "${ALL[@]}" --task niah --ctx 2K --samples 3
"${E[@]}" "${ALL[@]}" --task niah --ctx 4K --samples 3
# one sample of each other scored task at 2K
"${E[@]}" "${ALL[@]}" --task passkey,multikey,ppl,multiturn --ctx 2K --samples 1
# 8K, depths 0% and 50% (an 8K prefill takes about 25 s here); the prefill policies at 5% and 20% first
"${E[@]}" --policy full,streaming,quest,chess,sentkv --budget 0.01,0.05,0.1,0.2 --task niah --ctx 8K --samples 2
"${E[@]}" --policy take,laser,chelsea,snapkv,h2o --budget 0.05,0.2 --task niah --ctx 8K --samples 2
# what the model does with the full cache on the tasks it finds hard (cheap: no compression)
"${E[@]}" --policy full --task multivalue,babi1,babi2 --ctx 2K --samples 2
"${E[@]}" "${ALL[@]}" --task ppl,multiturn --ctx 4K --samples 1
# then their other two budgets at 8K, and three more 2K needles (a second document per depth)
"${E[@]}" --policy take,laser,chelsea,snapkv,h2o --budget 0.01,0.1 --task niah --ctx 8K --samples 2
"${E[@]}" "${ALL[@]}" --task niah --ctx 2K --samples 6
