#!/usr/bin/env bash
# editors.sh - the line editors: a value prompt (F5) starts with the old value selected, so typing
# replaces it; Ctrl-U clears the find line; an invalid UTF-8 byte typed in the input never swallows
# the character after it; the input history comes back at the next launch (from
# $XDG_STATE_HOME/kvchat/history).
# usage: tests/tui/editors.sh KVCHAT MODEL DOCUMENT
set -euo pipefail
name=editors
. "$(dirname "$0")/lib.sh"
bin=$(abs "$1") model=$(abs "$2") doc=$(abs "$3")
work=$(mktemp -d)
export XDG_STATE_HOME=$work/state
T new-session -d -s "$s" -x 120 -y 40 -c "$work" "$bin tui -t 1 -m $model -d $doc -n 4 --no-db"
wait_for '\| ready \|'

# F5: Enter on a row, and what is typed replaces the value shown
T send-keys -t "$s" F5
wait_for 'temperature +0\.00 '
T send-keys -t "$s" Enter
wait_for 'temperature: 0\.00_'
T send-keys -t "$s" '0.5' Enter
wait_for 'temperature +0\.50 '
T send-keys -t "$s" Escape
wait_gone 'temperature +0\.50' "the settings did not close"

# Ctrl-U clears the find line
T send-keys -t "$s" '/find nothing like this' Enter
wait_for 'find \(no match\): nothing like this'
T send-keys -t "$s" C-u
wait_for '^find: ?$'
T send-keys -t "$s" Escape

# an invalid byte between two characters: a replacement character, and both characters stay
T send-keys -t "$s" 'ab'
T send-keys -t "$s" -H ff
T send-keys -t "$s" 'cd'
wait_for '^> ab.cd'
T send-keys -t "$s" C-u
wait_for '^> ?$'

# the history: asked here, there at the next launch
T send-keys -t "$s" 'remember this question' Enter
wait_for '^-- 4 tokens'
T send-keys -t "$s" F10
wait_exit
[ -f "$XDG_STATE_HOME/kvchat/history" ] || fail "no history file at $XDG_STATE_HOME/kvchat/history"
T new-session -d -s "$s" -x 120 -y 40 -c "$work" "$bin tui -t 1 -m $model -d $doc -n 4 --no-db"
wait_for '\| ready \|'
T send-keys -t "$s" Up
wait_for '^> remember this question'
T send-keys -t "$s" F10
wait_exit
rm -rf "$work" "$cfg"
echo "tui test editors: ok"
