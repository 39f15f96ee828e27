#!/usr/bin/env bash
# eval_rerun_29.sh - docs/results.md's tables rerun after issue 29 (CHESS rebuilt; TAKE, LASER-KV
# and Chelsea brought to their papers; the kernels' bits fixed across instruction sets): every
# policy at 5%, 10% and 20%, 20 samples a cell, seed 1, for the standard pass-key test, the needle
# in a haystack and the perplexity task at 2K, 4K and 8K, into one resumable CSV
# (docs/results/rerun-29/samples.csv). The pass-key documents are those of the issue-22 table.
# Run it again after an interruption: finished rows are skipped. docs/results.md says what ran.
set -uo pipefail   # a failed stage is reported and the next one runs
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/results/rerun-29}
THREADS=${THREADS:-2}
BIN=${KVCHAT_BIN:-./kvchat}
E=("$BIN" eval --out "$OUT" --threads "$THREADS" --seed 1 --samples 20 --budget 0.05,0.1,0.2 --policy all)
# cheapest first, so an interrupted run leaves whole lengths behind it
for ctx in 2K 4K 8K; do
    for task in passkey-std niah ppl; do
        "${E[@]}" --task "$task" --ctx "$ctx"
    done
done
