#!/usr/bin/env bash
# eval_passkey_std.sh - the run behind the issue-22 pass-key section of docs/results-earlier.md: the
# standard pass-key test, and the niah and passkey tasks rechecked, on the default model, at budgets
# of 5%, 10% and 20%, 20 samples a cell, all into one resumable CSV (docs/results/passkey-std/
# samples.csv). Run it again after an interruption: finished rows are skipped. The first stage took
# 49 minutes on the 2-core VM (2 threads); the second ran in part (docs/results-earlier.md says how far); the
# stages after it have not run yet.
set -uo pipefail   # a failed stage is reported and the next one runs
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/results/passkey-std}
THREADS=${THREADS:-2}
BIN=${KVCHAT_BIN:-./kvchat}
E=("$BIN" eval --out "$OUT" --threads "$THREADS" --seed 1 --samples 20 --budget 0.05,0.1,0.2)
"${E[@]}" --task passkey-std --ctx 2K --policy all
# the other formats: the policies issue 22 changed (chelsea, laser), and the seed methods
"${E[@]}" --task niah,passkey --ctx 2K --policy full,chelsea,laser,take,sentkv,chess
# CHESS with a one-page recent window (docs/policies.md: the anchor's mix of question and filler)
"${E[@]}" --task passkey-std --ctx 2K --policy chess:window=1
"${E[@]}" --task niah,passkey --ctx 2K --policy streaming,quest,chess:window=1
"${E[@]}" --task passkey-std --ctx 4K --policy full,streaming,quest,chess,sentkv,take,laser,chelsea,snapkv,h2o,chess:window=1
"${E[@]}" --task niah,passkey --ctx 4K --policy full,laser,chelsea
"${E[@]}" --task niah,passkey --ctx 2K --policy take,snapkv,h2o
"${E[@]}" --task niah,passkey --ctx 4K --policy streaming,quest,chess,sentkv,take,snapkv,h2o
