#!/usr/bin/env bash
# layout.sh - what the screen says and where: a separator stays on its own row and inside the
# conversation pane (a newline in its text shown as a space, cut by the cells the pane has); the
# memory figure under the full policy explains why it is under 100% (the model's sliding-window
# layers hold only their window), in the status bar and the side panel.
# usage: tests/tui/layout.sh KVCHAT MODEL DOCUMENT
set -euo pipefail
name=layout
. "$(dirname "$0")/lib.sh"
bin=$(abs "$1") model=$(abs "$2") doc=$(abs "$3")
work=$(mktemp -d)
T new-session -d -s "$s" -x 150 -y 40 -c "$work" "$bin tui -t 1 -m $model -d $doc -n 4 --db $work/s.db"
wait_for '\| ready \|'
# under full, every layer but the sliding-window ones holds the whole context: said beside the share
wait_for '\| full \| ctx [0-9]+/[0-9]+ \| KV [0-9]+% of context \(sliding-window layers hold [0-9]+; [0-9.]+ MiB\) \|'
wait_for '│ window layers hold [0-9]+ tokens'
# a separator whose text holds a newline: one row, the rule to its end, the panel's border intact
T send-keys -t "$s" '/resume 1' C-j 'and a second line' Enter
wait_for '^── session 1 and a second line ─+ │'
cap | grep -A1 '^── session 1' | tail -n +2 | grep -q '^and a second line' && fail "the separator's text ran onto the next row"
T send-keys -t "$s" F10
wait_exit
rm -rf "$work" "$cfg"
echo "tui test layout: ok"
