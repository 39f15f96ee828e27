#!/usr/bin/env bash
# eval_passkey_std.sh - the run behind the passkey-std section of docs/results.md (issue 22): the
# standard pass-key test at 2K and 4K, and the niah and passkey tasks rechecked, on the default model,
# at budgets of 5%, 10% and 20%, 20 samples a cell, all into one resumable CSV
# (docs/results/passkey-std/samples.csv). Run it again after an interruption: finished rows are
# skipped. Stages in the order they ran; on a shared 2-core machine the whole took about N hours.
set -uo pipefail   # a failed stage is reported and the next one runs
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/results/passkey-std}
THREADS=${THREADS:-2}
BIN=${KVCHAT_BIN:-./kvchat}
E=("$BIN" eval --out "$OUT" --threads "$THREADS" --seed 1 --samples 20 --budget 0.05,0.1,0.2)
"${E[@]}" --task passkey-std --ctx 2K --policy all
# CHESS with a one-page recent window (docs/policies.md: the anchor's mix of question and filler)
"${E[@]}" --task passkey-std --ctx 2K --policy chess:window=1
# the other formats: the policies issue 22 changed (chelsea everywhere, laser above 4,096 tokens) and
# the decode-time ones (cheap: one shared prefill) first
"${E[@]}" --task niah,passkey --ctx 2K --policy full,streaming,quest,chess,sentkv,chelsea,laser,chess:window=1
"${E[@]}" --task passkey-std --ctx 4K --policy full,streaming,quest,chess,sentkv,take,laser,chelsea,snapkv,h2o,chess:window=1
"${E[@]}" --task niah,passkey --ctx 4K --policy full,laser,chelsea
"${E[@]}" --task niah,passkey --ctx 2K --policy take,snapkv,h2o
"${E[@]}" --task niah,passkey --ctx 4K --policy streaming,quest,chess,sentkv,take,snapkv,h2o
