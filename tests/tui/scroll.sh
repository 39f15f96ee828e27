#!/usr/bin/env bash
# scroll.sh - the scrollback: scrolled up, the view holds still while an answer streams below it,
# with a "more below" line; End and Home jump; ^F searches the conversation; /copy puts an answer
# on the clipboard through OSC 52 (tmux takes it as a paste buffer) and into a file; F8 turns mouse
# capture off (the terminal selects text) and on.
# usage: tests/tui/scroll.sh KVCHAT MODEL DOCUMENT
set -euo pipefail
name=scroll
. "$(dirname "$0")/lib.sh"
bin=$(abs "$1") model=$(abs "$2") doc=$(abs "$3")
work=$(mktemp -d)
T new-session -d -s "$s" -x 100 -y 30 -c "$work" "$bin tui -t 1 -m $model -d $doc -n 4000 --no-db"
T set-option -s set-clipboard on
wait_for '\| ready \|'
wait_for '^-- full: '
T send-keys -t "$s" 'What is it about?' Enter
wait_gone '^-- /.*p2\.txt' "the answer did not grow past the screen"   # a screen and more of it
T send-keys -t "$s" PgUp
wait_for '^-- more below \([0-9]+ rows\): End jumps to the end --'
a=$(cap | sed -n '2,20p' | cut -c1-60)   # the conversation's column (the panel changes)
b=$a
for _ in $(seq 1 20); do   # while at least two seconds of text arrive below
    sleep 0.1
    b=$(cap | sed -n '2,20p' | cut -c1-60)
done
cap | head -1 | grep -q 'answering\|working' || fail "the answer ended before the view was checked (a faster machine: raise -n)"
[ "$a" = "$b" ] || fail "the view moved while scrolled back"
T send-keys -t "$s" End
wait_gone 'more below' "End did not go to the end"
T send-keys -t "$s" C-c
wait_for '\| ready \|'
T send-keys -t "$s" Home
wait_for '^-- /.*p2\.txt: [0-9]+ tokens of'
cap | sed -n 2p | grep -q '^-- /' || fail "Home did not show the start"
T send-keys -t "$s" End
wait_gone 'more below' "End did not go to the end"

# search: the match is scrolled to and counted
T send-keys -t "$s" C-f 'full cache would'
wait_for '^find \(1 of 1;'
wait_for 'full cache would need'
T send-keys -t "$s" Enter
wait_gone '^find ' "Enter did not end the search"

# /copy: OSC 52 to the terminal (here tmux's paste buffer) and a file
T send-keys -t "$s" '/copy' Enter
wait_for 'answer copied to the clipboard through the terminal \(OSC 52'
first=$(T show-buffer | head -c 30)
[ -n "$first" ] || fail "the clipboard is empty"
T send-keys -t "$s" "/copy 1 $work/answer.txt" Enter
wait_for 'and written to'
[ -f "$work/answer.txt" ] || fail "no $work/answer.txt"
head -c 30 "$work/answer.txt" | grep -qF "$first" || fail "the file is not the answer: $(head -c 60 "$work/answer.txt")"
T send-keys -t "$s" "/copy 1 $work/answer.txt" Enter
wait_for 'it exists'

# mouse capture off and on
[ "$(T display -p -t "$s" '#{mouse_any_flag}')" = 1 ] || fail "mouse capture is not on at the start"
T send-keys -t "$s" F8
wait_for 'mouse capture off: the terminal selects'
[ "$(T display -p -t "$s" '#{mouse_any_flag}')" = 0 ] || fail "F8 did not turn mouse capture off"
T send-keys -t "$s" F8
wait_for 'mouse capture on'
[ "$(T display -p -t "$s" '#{mouse_any_flag}')" = 1 ] || fail "F8 did not turn mouse capture on"
T send-keys -t "$s" F10
wait_exit
rm -rf "$work" "$cfg"
echo "tui test scroll: ok"
