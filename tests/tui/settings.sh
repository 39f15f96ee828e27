#!/usr/bin/env bash
# settings.sh - settings and resume: F5 `s` writes only what was changed (the policy only with a
# budget); a session resumes under its own last policy, not the settings file's; a policy named on the
# command line holds for the session it continues, and the re-prefill that takes saves its
# snapshot, so the next launch restores it at once.
# usage: tests/tui/settings.sh KVCHAT MODEL DOCUMENT
set -euo pipefail
name=settings
. "$(dirname "$0")/lib.sh"
bin=$(abs "$1") model=$(abs "$2") doc=$(abs "$3")
work=$(mktemp -d)
db=$work/s.db
T new-session -d -s "$s" -x 120 -y 40 -c "$work" \
    "$bin tui -t 1 -m $model -d $doc -n 4 --db $db --policy chess:preset=aggressive"
wait_for 'p2\.txt \| chess:preset=aggressive \|'
wait_for '^-- chess: '
T send-keys -t "$s" 'What is it about?' Enter
wait_for 'saved in session 1( \(snapshot| *(│|$))'
T send-keys -t "$s" F5
wait_for 'n_predict +4 '
T send-keys -t "$s" Down Down Down Down Down Down Right
wait_for 'n_predict +36 '
T send-keys -t "$s" s
wait_for "saved (n_predict )?to $cfg/kvchat/config"
[ "$(grep -cv '^#' "$cfg/kvchat/config")" = 1 ] || fail "more than the changed setting was written: $(cat "$cfg/kvchat/config")"
grep -q '^n_predict = 36$' "$cfg/kvchat/config" || fail "n_predict = 36 was not written"
T send-keys -t "$s" Escape
T send-keys -t "$s" F10
wait_exit

# the settings file's policy is for new documents: the session resumes under its own
echo 'policy = quest:budget=0.2' >> "$cfg/kvchat/config"
T new-session -d -s "$s" -x 120 -y 40 -c "$work" "$bin tui -t 1 -m $model --db $db"
wait_for 'session 1: restored [0-9]+ tokens \(full\) from a'
wait_for 'p2\.txt \| chess:preset=aggressive \|'
T send-keys -t "$s" F10
wait_exit

# a prefill policy from the command line: prefilled once, its snapshot saved, then restored
T new-session -d -s "$s" -x 120 -y 40 -c "$work" "$bin tui -t 1 -m $model --db $db --policy snapkv:budget=0.5"
wait_for 'session 1: no snapshot under snapkv:budget=0\.5, prefilling'
wait_for 'session 1: its snapshot under snapkv:budget=0\.5 is saved'
wait_for '\| ready \| #1 p2\.txt \| snapkv:budget=0\.5 \|'
T send-keys -t "$s" F10
wait_exit
T new-session -d -s "$s" -x 120 -y 40 -c "$work" "$bin tui -t 1 -m $model --db $db --policy snapkv:budget=0.5"
wait_for 'session 1: restored [0-9]+ tokens \(snapkv:budget=0\.5\) from a'
absent 'prefilling' "the second launch prefilled again"
T send-keys -t "$s" F10
wait_exit
rm -rf "$work" "$cfg"
echo "tui test settings: ok"
