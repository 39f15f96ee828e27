#!/usr/bin/env bash
# compare_cost.sh - what a 3-way /compare costs against one answer, in the terminal interface, on
# one document: the wall time from Enter to the answer's footer (one answer: the question read and
# answered) and to the comparison's end (/compare P1,P2 answers the current policy and each listed
# one from the same cache), then the next question, which must read only itself.
# usage: bench/compare_cost.sh [KVCHAT] [MODEL] [DOCUMENT] [THREADS]   (needs tmux)
set -euo pipefail
bin=$(realpath "${1:-./kvchat}")
model=$(realpath "${2:-$HOME/.cache/kvchat/models/gemma-3-270m-q4_k_m.gguf}")
doc=$(realpath "${3:-/usr/share/common-licenses/GPL-3}")
threads=${4:-2}
sock=kvchat-bench-$$ s=b work=$(mktemp -d)
T() { tmux -L "$sock" "$@"; }
trap 'T kill-server 2>/dev/null || true; rm -rf "$work"' EXIT
export XDG_CONFIG_HOME=$work XDG_DATA_HOME=$work XDG_STATE_HOME=$work
now() { date +%s.%N; }
wait_count() {   # at least $2 lines matching $1 (ten minutes at most)
    for _ in $(seq 1 6000); do [ "$(T capture-pane -p -t "$s" | grep -Ec -- "$1")" -ge "$2" ] && return 0; sleep 0.1; done
    echo "timed out waiting for /$1/" >&2; T capture-pane -p -t "$s" >&2; exit 1
}
T new-session -d -s "$s" -x 200 -y 60 "$bin tui -t $threads -m $model --db $work/k.db --temp 0 -n 32 -d $doc"
wait_count '\| ready \| (#[0-9]+ )?' 1
ask() { T send-keys -t "$s" "$1" Enter; }
t0=$(now); ask 'What does this text say about the source code?'; wait_count '^-- [0-9]+ tokens, ' 1; t1=$(now)
ask '/compare chess,quest What does it say about patents?'; wait_count '^== compare' 1
wait_count '^\[chess\]|\[quest\].*\[chess\]|\[chess\].*\[quest\]' 1
for _ in $(seq 1 6000); do T capture-pane -p -t "$s" | head -1 | grep -q '| ready |' && break; sleep 0.1; done; t2=$(now)
ask 'What does it say about warranties?'; wait_count '^-- [0-9]+ tokens, ' 2; t3=$(now)
one=$(echo "$t1 - $t0" | bc) cmp=$(echo "$t2 - $t1" | bc) next=$(echo "$t3 - $t2" | bc)
printf 'commit %s, %s, %s threads, %s\n' "$(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo '?')" \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" "$threads" "$(basename "$doc")"
printf 'one answer %.1f s; /compare full,chess,quest %.1f s (%.2fx); the next answer %.1f s\n' "$one" "$cmp" \
    "$(echo "$cmp / $one" | bc -l)" "$next"
T send-keys -t "$s" F10
