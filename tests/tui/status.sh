#!/usr/bin/env bash
# status.sh - live status: the status bar and the side panel name what runs the model (the CPU and
# its threads here); while an answer streams the status bar shows this answer's tokens, tok/s and
# time; /compare shows its policies' progress (decoded together: their tokens in all), and runs the
# current policy once when it is also listed.
# usage: tests/tui/status.sh KVCHAT MODEL DOCUMENT
set -euo pipefail
name=status
. "$(dirname "$0")/lib.sh"
bin=$(abs "$1") model=$(abs "$2") doc=$(abs "$3")
T new-session -d -s "$s" -x 160 -y 40 "$bin tui -t 1 -m $model -d $doc -n 600 --no-db"
wait_for '\| ready \|'
wait_for '^-- full: '
# the speed beside what gives it (this CPU build, one thread); the side panel says it too
wait_for '\| [0-9.]+ tok/s on CPU \(1 thread\) \| tiny-g'
wait_for '│ device   CPU \(1 thread\)$'
T send-keys -t "$s" 'What is it about?' Enter
wait_for '\| answering: [0-9]+ tokens, [0-9.]+ tok/s, [0-9.]+ s \(Ctrl-C stops\) \|'
absent '\| prefill ' "the status bar kept the prefill's line while answering"
wait_for '^-- 600 tokens, '
wait_for '\| ready \|'
T send-keys -t "$s" '/compare chess:preset=aggressive,full,quest:budget=0.2 What is it about?' Enter
wait_for '\| compare: 3 policies together, [1-9][0-9]* tokens, [0-9.]+ s \(Ctrl-C stops\)'
wait_for '\| ready \|'
T send-keys -t "$s" '/find /compare chess' Enter   # (the columns are long: back to their headings)
wait_for '== compare: the same question under each policy'
n=$(cap | grep -o '\[full\] 600 tokens' | wc -l)
[ "$n" = 1 ] || fail "the current policy ran $n times"
cap | grep -q '\[chess:preset=aggressive\] 600 tokens' || fail "no chess column"
cap | grep -q '\[quest:budget=0.2\] 600 tokens' || fail "no quest column"
T send-keys -t "$s" Enter   # leaves the search, where it is
wait_gone '^find \(' "Enter did not leave the search"
T send-keys -t "$s" '/compare full What?' Enter
wait_for '^!! nothing to compare: full is the current policy'
T send-keys -t "$s" F10
wait_exit
rm -rf "$cfg"
echo "tui test status: ok"
