#!/usr/bin/env bash
# views.sh - the views at 60 columns: F2 "what the model sees" wraps at word boundaries, follows the
# conversation while it is open and closes with Esc; the help (F1) and the lists (F4) wrap their
# lines instead of cutting them.
# usage: tests/tui/views.sh KVCHAT MODEL DOCUMENT
set -euo pipefail
name=views
. "$(dirname "$0")/lib.sh"
bin=$(abs "$1") model=$(abs "$2") doc=$(abs "$3")
T new-session -d -s "$s" -x 60 -y 40 "$bin tui -t 1 -m $model -d $doc -n 8 --no-db"
wait_for '^-- full: '

# F2: every word on the screen is a word of the document (none cut in two)
T send-keys -t "$s" F2
wait_for 'PgUp/PgDn scroll\.'
words=$(tr -s ' \t\n' '\n' < "$doc" | tr -cd 'A-Za-z\n' | sort -u)
shown=$(cap | sed -n '/PgUp\/PgDn scroll\./,/^───/p' | sed '1d;$d' | tr -s ' ' '\n' | tr -cd 'A-Za-z\n' | sort -u)
[ -n "$shown" ] || fail "F2 shows no text"
cut_words=$(comm -23 <(echo "$shown") <(echo "$words") | tr '\n' ' ')
[ -z "$cut_words" ] || fail "F2 cut words in two: $cut_words"

# it follows the conversation while open: a question asked now shows up in it
T send-keys -t "$s" 'What is it about?' Enter
wait_for '\| ready \|'
T send-keys -t "$s" End
wait_for 'Question: What is it about\?'
T send-keys -t "$s" Escape
wait_gone 'What the model sees' "Esc did not close the view"
wait_for '^you> What is it about\?'

# the help and a list wrap at 60 columns
T send-keys -t "$s" F1
wait_for 'kvchat keys and commands'
T send-keys -t "$s" PgDn PgDn PgDn
wait_for 'by side'
wait_for 'any other key closes'
T send-keys -t "$s" x
wait_gone 'kvchat keys and commands' "the help did not close"
T send-keys -t "$s" F4
wait_for 'Decode-time selection'
wait_for 'Esc close'
T send-keys -t "$s" Escape
wait_gone 'Decode-time selection' "Esc did not close the policy list"
T send-keys -t "$s" F10
wait_exit
rm -rf "$cfg"
echo "tui test views: ok"
