#!/usr/bin/env bash
# eval_passkey_std_29.sh - the standard pass-key test rerun after issue 29 (CHESS rebuilt; TAKE,
# LASER-KV and Chelsea brought to their papers; the kernels' bits fixed across instruction sets):
# every policy at 5%, 10% and 20%, 20 samples a cell, seed 1 (the documents of the issue-22 table
# in docs/results.md), 2K then 4K, into one resumable CSV (docs/results/passkey-std-29/samples.csv).
# Run it again after an interruption: finished rows are skipped. docs/results.md says what ran.
set -uo pipefail   # a failed stage is reported and the next one runs
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/results/passkey-std-29}
THREADS=${THREADS:-2}
BIN=${KVCHAT_BIN:-./kvchat}
E=("$BIN" eval --out "$OUT" --threads "$THREADS" --seed 1 --samples 20 --budget 0.05,0.1,0.2 --task passkey-std)
"${E[@]}" --ctx 2K --policy all
"${E[@]}" --ctx 4K --policy all
