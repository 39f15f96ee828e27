#!/usr/bin/env bash
# basic.sh - drive `kvchat tui` in a real terminal (tmux): open a document, ask, compare, switch
# the decode and the prefill policy (a re-prefill, then a snapshot restored), edit a question into
# a branch, change a setting live and save it, browse, search, rename, export and delete sessions,
# open a document with the file picker, resize narrow and wide, the help, remapped keys, quit,
# resume (and edit a question asked before the window opened). Checks the screen at each step.
# usage: tests/tui/basic.sh KVCHAT MODEL DOCUMENT
set -euo pipefail
abs() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
bin=$(abs "$1") model=$(abs "$2") doc=$(abs "$3")   # the interface runs in its own directory
sock=kvchat-tui-test-$$
s=t
T() { tmux -L "$sock" "$@"; }
cap() { T capture-pane -p -t "$s"; }
fail() { echo "tui test: $*"; echo "----- screen -----"; cap || true; T kill-server 2>/dev/null || true; exit 1; }
wait_for() {   # a regular expression that must appear on the screen within 20 s
    for _ in $(seq 1 200); do cap | grep -Eq -- "$1" && return 0; sleep 0.1; done
    fail "timed out waiting for /$1/"
}
wait_count() {   # at least $2 lines matching $1 within 20 s
    for _ in $(seq 1 200); do [ "$(cap | grep -Ec -- "$1")" -ge "$2" ] && return 0; sleep 0.1; done
    fail "timed out waiting for $2 lines matching /$1/"
}
wait_gone() {   # a regular expression that must leave the screen within 20 s ($2: what went wrong)
    for _ in $(seq 1 200); do cap | grep -Eq -- "$1" || return 0; sleep 0.1; done
    fail "$2"
}
wait_exit() {   # the interface must quit within 20 s
    for _ in $(seq 1 200); do T has-session -t "$s" 2>/dev/null || return 0; sleep 0.1; done
    fail "kvchat did not quit"
}
trap 'T kill-server 2>/dev/null || true' EXIT
# answer lengths: the tiny models' random text runs to -n; a real base model's answer may end early,
# where it begins its next "Question:"
tok() { case $model in */tiny/*) echo "$1" ;; *) echo '[0-9]+' ;; esac; }

work=$(mktemp -d)   # the interface's working directory: exports land here
db=$work/tui.db
cfg=$(mktemp -d)
export XDG_CONFIG_HOME=$cfg   # hermetic: no user settings (the config file is tested at the end)
export XDG_STATE_HOME=$cfg/state   # nor the user's input history
cp "$doc" "$work/notes.txt"
T new-session -d -s "$s" -x 120 -y 70 -c "$work" "$bin tui -t 1 -m $model -d $doc -n 8 --page-size 8 --db $db"
wait_for 'p2\.txt \| full \| ctx [0-9]+/'
wait_for '\| ready'
cap | grep -q 'Memory' || fail "no side panel at 120 columns"
cap | grep -q 'Uncertainty' || fail "no uncertainty view"

T send-keys -t "$s" 'What is it about?' Enter
wait_for 'you> What is it about\?'
wait_for "-- $(tok 8) tokens, [0-9.]+ tok/s"
wait_for 'saved in session 1( \(snapshot| *(│|$))'
wait_for '\| ready'

T send-keys -t "$s" '/compare chess:preset=aggressive,quest:budget=0.2 What is it about?' Enter
wait_for '== compare: the same question under each policy'
wait_for "\\[full\\] $(tok 8) tokens"
wait_for '(same answer|differs from)'
wait_for '\| ready'

T send-keys -t "$s" F2
wait_for 'What the model sees \(first global layer\)'
T send-keys -t "$s" F2
wait_gone 'What the model sees' "F2 did not close the view"

# the policy picker: the last row is a prefill policy, so the cache is prefilled again under it
T send-keys -t "$s" F4
wait_for 'Decode-time selection: every token stays in memory'
wait_for '\* full '
T send-keys -t "$s" End Enter
wait_for 'no snapshot of this conversation under [a-z0-9]+; prefilling'
wait_for 'its snapshot is saved: switching back to'
wait_for '\| ready'
# back to the full cache: its snapshot of this point is restored, not prefilled
T send-keys -t "$s" '/policy full' Enter
wait_for "policy full: this conversation's snapshot under full restored \\([0-9]+ tokens, "
wait_for '\| full \|'
# a decode-time policy alone keeps the prefill half (none here)
T send-keys -t "$s" '/policy chess:preset=aggressive' Enter
wait_for '\| chess:preset=aggressive \(next answer\) \|'
T send-keys -t "$s" '/policy quest:budget=0.2' Enter
wait_for 'policy quest:budget=0.2: from the next answer on'
T send-keys -t "$s" '/policy chess:preset=aggressive' Enter
wait_for 'policy chess:preset=aggressive: from the next answer on'
T send-keys -t "$s" 'And then?' Enter
wait_for 'you> And then\?'
wait_count "^-- $(tok 8) tokens, [0-9.]+ tok/s, context [0-9]+/[0-9]+" 2

T send-keys -t "$s" '/edit 2 And after that?' Enter
wait_for 'question 2 edited: a new branch'
wait_for 'you> And after that\?'
wait_count "^-- $(tok 8) tokens, [0-9.]+ tok/s" 3
T send-keys -t "$s" '/edit 9 x' Enter
wait_for 'there is no question 9 \(this conversation has 2\)'

# settings, live: a longer answer from the next question on, saved to the settings file
T send-keys -t "$s" F5
wait_for 'n_predict +8 '
T send-keys -t "$s" Down Down Down Down Down Down Right
wait_for 'n_predict +40 '
T send-keys -t "$s" s
wait_for "saved n_predict to $cfg/kvchat/config"
grep -q '^n_predict = 40$' "$cfg/kvchat/config" || fail "the settings file lacks n_predict = 40"
T send-keys -t "$s" Escape
T send-keys -t "$s" 'Longer?' Enter
wait_count '^-- [0-9]+ tokens, [0-9.]+ tok/s' 4
wait_for "^-- $(tok 40) tokens, "
rm "$cfg/kvchat/config"

# the file picker opens a second document (a second session)
T send-keys -t "$s" F6
wait_for "Open a document: $work"
T send-keys -t "$s" notes
wait_for 'filter: notes_'
T send-keys -t "$s" Enter
wait_for "$work/notes.txt: [0-9]+ tokens of"
wait_for '\| #2 notes\.txt \|'
wait_for '\| ready'
T send-keys -t "$s" 'Is this the copy?' Enter
wait_for 'saved in session 2( \(snapshot| *(│|$))'

# the session browser: both sessions, search, rename, export, delete (not the open one)
T send-keys -t "$s" F3
wait_for '│ +1  p2\.txt +p2\.txt'
wait_for '│ +2  notes\.txt'
T send-keys -t "$s" 'copy'
wait_for 'Sessions: 1 of 2 sessions match'
T send-keys -t "$s" BSpace BSpace BSpace BSpace
wait_for 'search: _'
T send-keys -t "$s" Down
T send-keys -t "$s" C-r
wait_for 'new title: p2\.txt_'
T send-keys -t "$s" BSpace BSpace BSpace BSpace BSpace BSpace 'First talk' Enter
wait_for 'session 1 renamed'
wait_for '1  First talk'
# a link where the export goes is replaced, never followed (its target keeps its content)
echo "not to be overwritten" > "$work/victim.txt"
ln -s "$work/victim.txt" "$work/kvchat-session-1.md"
T send-keys -t "$s" C-e
wait_for "session 1 exported to $work/kvchat-session-1\\.md"
grep -qx 'not to be overwritten' "$work/victim.txt" || fail "the export wrote through a link"
[ -L "$work/kvchat-session-1.md" ] && fail "the export left the link in place"
grep -q '^# First talk' "$work/kvchat-session-1.md" || fail "the export has no title"
grep -q '^## Question' "$work/kvchat-session-1.md" || fail "the export has no question"
# (a rename reorders the list by date: each session is picked by a search that finds only it)
T send-keys -t "$s" 'copy'
wait_for 'Sessions: 1 of 2 sessions match'
T send-keys -t "$s" DC
wait_for 'session 2 is the open conversation'
T send-keys -t "$s" BSpace BSpace BSpace BSpace 'First'
wait_for 'search: First_'
wait_for 'Sessions: 1 of 2 sessions match'
T send-keys -t "$s" DC
wait_for 'delete session 1 with its messages and snapshots\? y/n'
T send-keys -t "$s" n
wait_for 'not deleted'
T send-keys -t "$s" Escape
wait_gone 'Enter resume' "Esc did not close the session browser"
# resume the first session from the browser
T send-keys -t "$s" F3
wait_for '1  First talk'
T send-keys -t "$s" 'First'
wait_for 'Sessions: 1 of 2 sessions match'
T send-keys -t "$s" Enter
wait_for 'session 1: restored [0-9]+ tokens \(full\) from a'
wait_for '\| ready'

T send-keys -t "$s" '/nonsense' Enter
wait_for 'unknown command /nonsense'

T resize-window -t "$s" -x 60 -y 30
wait_gone 'Memory' "the side panel should collapse at 60 columns"
wait_for '^>'
T resize-window -t "$s" -x 200 -y 50
wait_for 'Memory'

T send-keys -t "$s" F1
wait_for 'kvchat keys and commands'
T send-keys -t "$s" x
wait_gone 'kvchat keys and commands' "help did not close"

T send-keys -t "$s" F10
wait_exit
# the conversation was saved as it went: both turns, with their snapshots
out=$("$bin" sessions --db "$db" show 1)
echo "$out" | grep -q '8 messages' || { echo "tui test: the session was not saved:"; echo "$out"; exit 1; }
echo "$out" | grep -q 'user (another branch)' || { echo "tui test: the edited question is not a branch:"; echo "$out"; exit 1; }
echo "$out" | grep -q 'And then?' || { echo "tui test: the second question is missing:"; echo "$out"; exit 1; }
echo "$out" | grep -q 'First talk' || { echo "tui test: the rename was not saved:"; echo "$out"; exit 1; }
# and `kvchat ask --resume` continues it from the interface's snapshot
res=$("$bin" ask -t 1 -m "$model" --resume 1 -q 'More?' -n 4 --db "$db" 2>&1 >/dev/null) ||
    { echo "tui test: ask --resume failed: $res"; exit 1; }
echo "$res" | grep -q 'session 1: restored' || { echo "tui test: not resumed from the snapshot: $res"; exit 1; }
# opened again with neither a document nor a session, it continues the most recent one
T new-session -d -s "$s" -x 120 -y 36 -c "$work" "$bin tui -t 1 -m $model -n 8 --db $db --session 1"
wait_for 'session 1: restored [0-9]+ tokens \(full\) from a'
wait_for 'you> More\?'
wait_for '\| #1 First talk: p2\.txt \|'
# a question asked before this window: rebuilt from the saved conversation
T send-keys -t "$s" '/edit 1 What is it really about?' Enter
wait_for 'question 1 edited: a new branch'
wait_for 'the document and the 0 turns before it'
wait_for 'saved in session 1( \(snapshot| *(│|$))'
wait_for '\| ready'
T send-keys -t "$s" '/resume 1' Enter
wait_for 'you> What is it really about\?'
wait_for '\| ready'
T send-keys -t "$s" 'Last one?' Enter
wait_count 'saved in session 1( \(snapshot| *(│|$))' 2
wait_for '\| ready'
T send-keys -t "$s" '/regen' Enter
wait_for 'another answer to the same question \(a new branch\)'
wait_count 'saved in session 1( \(snapshot| *(│|$))' 3
T send-keys -t "$s" '/sessions' Enter
wait_for '1  First talk +p2\.txt .* 15 +[0-9.]+ MiB'
T send-keys -t "$s" Escape
T send-keys -t "$s" '/quit' Enter
wait_exit
"$bin" sessions --db "$db" show 1 | grep '15 messages' >/dev/null || fail "the resumed turn and the regeneration were not saved"
"$bin" sessions --db "$db" show 1 | grep 'assistant (another branch)' >/dev/null || fail "the regenerated answer is not a branch"
# backtracking events after the answer, a line each, never inside its sentences (thresholds of 0:
# every page is uncertain; chess rebuilds its selection and regenerates the page)
T new-session -d -s "$s" -x 120 -y 40 "$bin tui -t 1 -m $model -d $doc -n 16 --page-size 8 --no-db --policy chess --thresholds 0,0"
wait_for '\| ready \| p2\.txt'
T send-keys -t "$s" 'What is it about?' Enter
wait_for "^-- $(tok 16) tokens, "
wait_for '^~~ event: answer page 0 \(tokens 0-7'
wait_for 'regenerated \(same text\)|regenerated with different text'
cap | grep -q '\[event' && fail "an event was drawn inside the answer"
[ "$(cap | grep -n '^~~ event: answer page 0' | cut -d: -f1)" -gt "$(cap | grep -n '^you> What is it about' | tail -1 | cut -d: -f1)" ] ||
    fail "the event is not after the answer"
T send-keys -t "$s" '/quit' Enter
wait_exit
# settings from the config file (the command line would override them); a bad one is one line
mkdir -p "$cfg/kvchat"
printf '# test settings\npolicy = chess:preset=aggressive\ncolor = off\nkey.sessions = F9\nkey.help = ^G\ncolor.bar = white on blue\ncolor.user = 208\n' > "$cfg/kvchat/config"
T new-session -d -s "$s" -x 120 -y 36 "$bin tui -t 1 -m $model -d $doc -n 4 --no-db"
wait_for '\| chess:preset=aggressive \| ctx'
T send-keys -t "$s" F9
wait_for 'no session database: nothing is saved'
T send-keys -t "$s" Escape
T send-keys -t "$s" C-g
wait_for 'F9 +saved sessions'
T send-keys -t "$s" x
T send-keys -t "$s" '/quit' Enter
wait_exit
printf 'key.sessions = F4\n' > "$cfg/kvchat/config"
err=$("$bin" tui 2>&1 </dev/null) && fail "a key bound twice was accepted"
echo "$err" | grep -q "F4 is bound to both sessions and policy" || fail "bad keymap message: $err"
printf 'color.bar = purple on cyan\n' > "$cfg/kvchat/config"
err=$("$bin" tui 2>&1 </dev/null) && fail "an unknown colour was accepted"
echo "$err" | grep -q "config:1: color.bar: expected a colour" || fail "bad colour message: $err"
printf 'colour = on\n' > "$cfg/kvchat/config"
err=$("$bin" tui 2>&1 </dev/null) && fail "a bad config was accepted"
echo "$err" | grep -q "config:1: unknown setting 'colour'" || fail "bad config message: $err"
rm -f "$cfg/kvchat/config"
# a --db that is not a database is refused at start, not silently left unsaved
printf 'this is not a database, just text\n' > "$work/not.db"
T new-session -d -s "$s" -x 120 -y 20 "$bin tui -t 1 -m $model --db $work/not.db; echo kvchat exited \$?; sleep 30"
wait_for 'not a database'
wait_for 'kvchat exited 1'
T kill-session -t "$s"
rm -rf "$work" "$cfg"
echo "tui test: ok"
