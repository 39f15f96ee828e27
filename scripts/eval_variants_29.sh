#!/usr/bin/env bash
# eval_variants_29.sh - issue 29's robustness check: the standard pass-key documents in forms no
# policy was tuned on, asked through `kvchat ask` (not eval). Documents: the standard filler ("The
# grass is green. ...") repeated to about 2K and 4K tokens, the needle "The pass key is N. Remember
# it. N is the pass key." between two repetitions at 10, 30, 50, 70 and 90% depth, keys from a fixed
# list; with and without the standard instruction header; asked "What is the pass key?" and "Which
# number is the pass key?". Every seed method at 20% (CHESS also at 10%), Quest at 10%, the full
# cache. One CSV row per answer: reps,depth,header,question,policy,answer_ok,answer.
# Usage: scripts/eval_variants_29.sh OUT.csv   (resumes: rows already in OUT.csv are skipped)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: eval_variants_29.sh OUT.csv}
BIN=${KVCHAT_BIN:-./kvchat}
THREADS=${THREADS:-1}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
FILLER="The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
HEADER="There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about the important information there."
KEYS=(48213 90517 26634 71902 35578 62049 17386 84751 53120 29867)
QUESTIONS=("What is the pass key?" "Which number is the pass key?")
CONFIGS=("full" "chess 0.1" "chess 0.2" "sentkv 0.2" "take 0.2" "laser 0.2" "chelsea 0.2" "quest 0.1")
[ -f "$OUT" ] || echo "reps,depth,header,question,policy,answer_ok,answer" > "$OUT"
i=0
for reps in 85 170; do                      # about 2K and 4K tokens of this filler
    for depth in 10 30 50 70 90; do
        key=${KEYS[$((i % ${#KEYS[@]}))]}
        i=$((i + 1))
        at=$(( (reps * depth + 50) / 100 ))
        for header in 0 1; do
            doc="$TMP/doc.txt"
            {
                [ "$header" = 1 ] && printf '%s ' "$HEADER"
                for ((r = 0; r < reps; r++)); do
                    [ "$r" = "$at" ] && printf 'The pass key is %s. Remember it. %s is the pass key. ' "$key" "$key"
                    printf '%s' "$FILLER"
                    [ "$r" -lt $((reps - 1)) ] && printf ' '
                done
            } > "$doc"
            for q in "${QUESTIONS[@]}"; do
                for cfg in "${CONFIGS[@]}"; do
                    set -- $cfg
                    pol=$1 budget=${2:-}
                    tag="$reps,$depth,$header,\"$q\",${pol}${budget:+ $budget}"
                    grep -qF "$tag," "$OUT" && continue
                    args=(ask -d "$doc" -q "$q" -n 12 -t "$THREADS" --policy "$pol")
                    [ -n "$budget" ] && args+=(--budget "$budget")
                    # a run that fails is reported and left out, so a rerun tries it again
                    if ! out=$("$BIN" "${args[@]}" 2>"$TMP/err"); then
                        echo "failed: $tag: $(tail -1 "$TMP/err")" >&2
                        continue
                    fi
                    ans=$(printf '%s' "$out" | tr '\n\r' '  ' | tr -d '"')   # one CSV field
                    ok=0
                    case "$ans" in *"$key"*) ok=1 ;; esac
                    echo "$tag,$ok,\"$ans\"" >> "$OUT"
                done
            done
        done
    done
done
