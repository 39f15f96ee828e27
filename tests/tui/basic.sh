#!/usr/bin/env bash
# basic.sh - drive `kvchat tui` in a real terminal (tmux): open a document, ask, switch policy,
# resize narrow and wide, open the help, quit. Checks the screen's content at each step.
# usage: tests/tui/basic.sh KVCHAT MODEL DOCUMENT
set -euo pipefail
bin=$1 model=$2 doc=$3
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
trap 'T kill-server 2>/dev/null || true' EXIT

db=$(mktemp -d)/tui.db
cfg=$(mktemp -d)
export XDG_CONFIG_HOME=$cfg   # hermetic: no user settings (the config file is tested at the end)
T new-session -d -s "$s" -x 120 -y 36 "$bin tui -t 1 -m $model -d $doc -n 8 --page-size 8 --db $db"
wait_for 'p2\.txt \| full \| ctx [0-9]+/'
wait_for '\| ready'
cap | grep -q 'Memory' || fail "no side panel at 120 columns"
cap | grep -q 'Uncertainty' || fail "no uncertainty view"

T send-keys -t "$s" 'What is it about?' Enter
wait_for 'you> What is it about\?'
wait_for '-- 8 tokens, [0-9.]+ tok/s'
wait_for 'saved in session 1 \(snapshot'
wait_for '\| ready'

T send-keys -t "$s" '/compare chess:preset=aggressive,quest:budget=0.2 What is it about?' Enter
wait_for '== compare: the same question under each policy'
wait_for '\[full\] 8 tokens'
wait_for '(same answer|differs from)'
wait_for '\| ready'

T send-keys -t "$s" F2
wait_for 'What the model sees \(first global layer\)'
T send-keys -t "$s" F2
sleep 0.3
cap | grep -q 'What the model sees' && fail "F2 did not close the view"

T send-keys -t "$s" '/policy chess:preset=aggressive' Enter
wait_for 'policy chess:preset=aggressive \(a prefill policy'
wait_for '\| chess:preset=aggressive \|'
T send-keys -t "$s" 'And then?' Enter
wait_for 'you> And then\?'
wait_count '^-- 8 tokens, [0-9.]+ tok/s' 2

T send-keys -t "$s" '/edit 2 And after that?' Enter
wait_for 'question 2 edited: a new branch'
wait_for 'you> And after that\?'
wait_count '^-- 8 tokens, [0-9.]+ tok/s' 3
T send-keys -t "$s" '/edit 9 x' Enter
wait_for 'question 9 was not asked in this window'

T send-keys -t "$s" '/nonsense' Enter
wait_for 'unknown command /nonsense'

T resize-window -t "$s" -x 60 -y 30
sleep 0.5
cap | grep -q 'Memory' && fail "the side panel should collapse at 60 columns"
wait_for '^>'
T resize-window -t "$s" -x 200 -y 50
wait_for 'Memory'

T send-keys -t "$s" F1
wait_for 'kvchat keys and commands'
T send-keys -t "$s" x
sleep 0.3
cap | grep -q 'kvchat keys and commands' && fail "help did not close"

T send-keys -t "$s" '/quit' Enter
quit=0
for _ in $(seq 1 100); do T has-session -t "$s" 2>/dev/null || { quit=1; break; }; sleep 0.1; done
[ $quit = 1 ] || fail "kvchat did not quit"
# the conversation was saved as it went: both turns, with their snapshots
out=$("$bin" sessions --db "$db" show 1)
echo "$out" | grep -q '6 messages' || { echo "tui test: the session was not saved:"; echo "$out"; exit 1; }
echo "$out" | grep -q 'user (another branch)' || { echo "tui test: the edited question is not a branch:"; echo "$out"; exit 1; }
echo "$out" | grep -q 'And then?' || { echo "tui test: the second question is missing:"; echo "$out"; exit 1; }
# and `kvchat ask --resume` continues it from the interface's snapshot
res=$("$bin" ask -t 1 -m "$model" --resume 1 -q 'More?' -n 4 --db "$db" 2>&1 >/dev/null) ||
    { echo "tui test: ask --resume failed: $res"; exit 1; }
echo "$res" | grep -q 'session 1: restored' || { echo "tui test: not resumed from the snapshot: $res"; exit 1; }
# opened again with neither a document nor a session, it continues the most recent one
T new-session -d -s "$s" -x 120 -y 36 "$bin tui -t 1 -m $model -n 8 --db $db"
wait_for 'session 1 resumed: [0-9]+ tokens restored from a'
wait_for 'you> More\?'
wait_for '\| p2\.txt \|'
T send-keys -t "$s" 'Last one?' Enter
wait_for 'saved in session 1 \(snapshot'
T send-keys -t "$s" '/regen' Enter
wait_for 'another answer to the same question \(a new branch\)'
wait_count 'saved in session 1 \(snapshot' 2
T send-keys -t "$s" '/sessions' Enter
wait_for 'session 1: p2\.txt \| p2\.txt \|.*\| 11 messages'
T send-keys -t "$s" '/quit' Enter
sleep 0.5
"$bin" sessions --db "$db" show 1 | grep -q '11 messages' || fail "the resumed turn and the regeneration were not saved"
"$bin" sessions --db "$db" show 1 | grep -q 'assistant (another branch)' || fail "the regenerated answer is not a branch"
# settings from the config file (the command line would override them); a bad one is one line
mkdir -p "$cfg/kvchat"
printf '# test settings\npolicy = chess:preset=aggressive\ncolor = off\n' > "$cfg/kvchat/config"
T new-session -d -s "$s" -x 120 -y 36 "$bin tui -t 1 -m $model -d $doc -n 4 --no-db"
wait_for '\| chess:preset=aggressive \| ctx'
T send-keys -t "$s" '/quit' Enter
printf 'colour = on\n' > "$cfg/kvchat/config"
err=$("$bin" tui 2>&1 </dev/null) && fail "a bad config was accepted"
echo "$err" | grep -q "config:1: unknown setting 'colour'" || fail "bad config message: $err"
rm -rf "$(dirname "$db")" "$cfg"
echo "tui test: ok"
