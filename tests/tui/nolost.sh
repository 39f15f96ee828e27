#!/usr/bin/env bash
# nolost.sh - no lost work: Ctrl-C when idle clears the input (Up brings it back) and asks before
# quitting; a question typed while a document is prefilled waits (shown as pending) and is asked
# when the prefill ends; Ctrl-C during a prefill puts a waiting question back in the input, and
# the conversation before it stays loaded.
# usage: tests/tui/nolost.sh KVCHAT MODEL DOCUMENT
set -euo pipefail
name=nolost
. "$(dirname "$0")/lib.sh"
bin=$(abs "$1") model=$(abs "$2") doc=$(abs "$3")
work=$(mktemp -d)
for _ in 1 2 3 4 5 6 7 8 9; do cat "$doc"; done > "$work/big.txt"   # seconds of prefill on one thread
{ echo "Another copy."; cat "$work/big.txt"; } > "$work/big2.txt"     # long enough to stop part-way
T new-session -d -s "$s" -x 120 -y 40 -c "$work" "$bin tui -t 1 -m $model -d $doc -n 4 --no-db"
wait_for '\| ready \|'

# Ctrl-C when idle: the input goes (and comes back with Up), then it asks before quitting
T send-keys -t "$s" 'a draft question'
wait_for '^> a draft question'
T send-keys -t "$s" C-c
wait_gone '^> a draft question' "Ctrl-C did not clear the input"
T has-session -t "$s" 2>/dev/null || fail "Ctrl-C with text typed quit"
T send-keys -t "$s" Up
wait_for '^> a draft question'
T send-keys -t "$s" C-c C-c
wait_for 'Quit kvchat\? y quits'
T send-keys -t "$s" n
wait_gone 'Quit kvchat\?' "the quit question stayed"
T has-session -t "$s" 2>/dev/null || fail "n quit"

# a question typed while a document loads waits, and is asked when it is in
T send-keys -t "$s" "/open $work/big.txt" Enter
wait_for '\| prefill [0-9]+/[0-9]+ tokens'
T send-keys -t "$s" 'What is in it?' Enter
wait_for '^pending \(asked when the current job ends'
absent 'busy' "the question was refused"
wait_for '^you> What is in it\?'
wait_for '^-- 4 tokens'
wait_gone '^pending' "the question stayed pending"

# Ctrl-C during a prefill: the waiting question back in the input, the loaded document kept
T send-keys -t "$s" "/open $work/big2.txt" Enter
wait_for '\| prefill [0-9]+/[0-9]+ tokens'
T send-keys -t "$s" 'Second question?' Enter
wait_for '^pending'
T send-keys -t "$s" C-c
wait_for 'prefill cancelled; back to big\.txt as it was'
wait_for '^> Second question\?'
wait_for '\| ready \| big\.txt \|'
T send-keys -t "$s" Enter
wait_for '^you> Second question\?'
wait_count '^-- 4 tokens' 2

# F10 quits at once
T send-keys -t "$s" F10
wait_exit
rm -rf "$work" "$cfg"
echo "tui test nolost: ok"
