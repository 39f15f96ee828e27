#!/usr/bin/env bash
# input.sh - the input line as oterm, elia and a shell have it: a bracketed paste of several lines
# is inserted, not sent; Alt-Enter and Ctrl-J start a new line of a visible multi-line input; the
# readline keys (Ctrl-A/E/K/U/W/Y, Alt-B/F, Ctrl-R history search); /open with ~ and a quoted path
# with spaces; /compare, /resume and /edit without arguments print their usage.
# usage: tests/tui/input.sh KVCHAT MODEL DOCUMENT
set -euo pipefail
name=input
. "$(dirname "$0")/lib.sh"
bin=$(abs "$1") model=$(abs "$2") doc=$(abs "$3")
home=$(mktemp -d)
mkdir -p "$home/my docs"
cp "$doc" "$home/my docs/the notes.txt"
T new-session -d -s "$s" -x 120 -y 40 -c "$home" "HOME=$home $bin tui -t 1 -m $model -d $doc -n 4 --no-db"
wait_for '\| ready \|'

# a paste of two lines lands in the input, both lines, and nothing is sent
T set-buffer -b paste "$(printf 'first pasted line\nsecond pasted line')"
T paste-buffer -p -b paste -t "$s"
wait_for '^  second pasted line'
cap | grep -q '^> first pasted line' || fail "the paste's first line is not in the input"
absent 'you> first pasted line' "a pasted line was sent"
T send-keys -t "$s" Up C-a C-k C-k C-k   # up a line, its start; kill the line, the newline, the next line
wait_gone 'pasted line' "Up, Ctrl-A and Ctrl-K did not clear the pasted lines"

# Alt-Enter and Ctrl-J: new lines in the input; Enter sends all of it
T send-keys -t "$s" 'line one' M-Enter 'line two' C-j 'line three'
wait_for '^  line three'
cap | grep -q '^  line two' || fail "Alt-Enter did not start a new line"
absent 'you> line one' "Alt-Enter sent the question"
T send-keys -t "$s" Enter
wait_for '^you> line one'
wait_for '^line two'
wait_for '^-- 4 tokens'

# readline keys on one line
T send-keys -t "$s" 'world' C-a 'hello ' C-e '!'
wait_for '^> hello world!'
T send-keys -t "$s" C-w
wait_for '^> hello ?$'
T send-keys -t "$s" 'big world' M-b M-b C-k
wait_for '^> hello ?$'
T send-keys -t "$s" C-y
wait_for '^> hello big world'
T send-keys -t "$s" M-b C-u
wait_for '^> world'
T send-keys -t "$s" C-a M-f ' peace' C-e C-u
wait_gone '^> world peace' "Ctrl-U at the end did not clear the line"
# Ctrl-R: the history, searched backwards
T send-keys -t "$s" C-r 'one'
wait_for "history search\\)'one': line one"
T send-keys -t "$s" Escape
wait_gone 'history search' "Esc did not leave the history search"
T send-keys -t "$s" C-r 'one' Right
wait_for '^> line one'
wait_for '^  line three'
T send-keys -t "$s" Enter
wait_count '^you> line one' 2

# usage instead of "unknown command"
for c in compare resume edit; do
    T send-keys -t "$s" "/$c" Enter
    wait_for "^!! usage: /$c "
done
absent 'unknown command' "a command without arguments was called unknown"

# ~ and a quoted path with spaces
T send-keys -t "$s" '/open "~/my docs/the notes.txt"' Enter
wait_for "$home/my docs/the notes.txt: [0-9]+ tokens of"
wait_for '\| ready \| the notes\.txt \|'
T send-keys -t "$s" '/open ~/my\ docs/the\ notes.txt' Enter
wait_count "$home/my docs/the notes.txt: [0-9]+ tokens of" 2
T send-keys -t "$s" '/quit' Enter
wait_exit
rm -rf "$home" "$cfg"
echo "tui test input: ok"
