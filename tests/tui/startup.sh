#!/usr/bin/env bash
# startup.sh - a budget saved in F5 is saved with the policy it applies to; a settings file whose
# budget cannot apply to its policy (a budget without a policy meets full) is said with its file
# and line in the conversation, and the interface starts anyway (with -d and with --session);
# /policy full while a budget is set switches and says the budget is dropped.
# usage: tests/tui/startup.sh KVCHAT MODEL DOCUMENT
set -euo pipefail
name=startup
. "$(dirname "$0")/lib.sh"
bin=$(abs "$1") model=$(abs "$2") doc=$(abs "$3")
work=$(mktemp -d)
conf=$cfg/kvchat/config
T new-session -d -s "$s" -x 120 -y 40 -c "$work" \
    "$bin tui -t 1 -m $model -d $doc -n 4 --db $work/s.db --policy snapkv --budget 0.5"
wait_for '\| ready \| p2\.txt \| snapkv:budget=0\.5 \|'
T send-keys -t "$s" 'What is it about?' Enter   # under SnapKV the session is made with the question
wait_for '\| ready \| #1 p2\.txt \| snapkv:budget=0\.5 \|'
T send-keys -t "$s" F5
wait_for 'budget +0\.5 '
T send-keys -t "$s" Down Down Down Down Down Down Down Enter
wait_for 'budget: 0\.5_'
T send-keys -t "$s" C-u '0.2' Enter
wait_for 'budget 0\.2: applying snapkv'
T send-keys -t "$s" s
wait_for "saved budget"
grep -q '^budget = 0\.2$' "$conf" || fail "budget = 0.2 was not written: $(cat "$conf")"
grep -q '^policy = snapkv$' "$conf" || fail "the policy was not saved with the budget: $(cat "$conf")"
T send-keys -t "$s" Escape
wait_for '\| ready \| #1 p2\.txt \| snapkv:budget=0\.2 \|'
# /policy full with a budget set: full keeps everything, the budget goes
T send-keys -t "$s" '/policy full' Enter
wait_text 'full keeps everything: the budget 0.2 is dropped'
wait_for '\| ready \| #1 p2\.txt \| full \|'
T send-keys -t "$s" F10
wait_exit

# a budget in the file whose policy is full (as an older kvchat saved it): said, and a start anyway
printf '# mine\nbudget = 0.2\n' > "$conf"
T new-session -d -s "$s" -x 200 -y 40 -c "$work" "$bin tui -t 1 -m $model --session 1 -n 4 --db $work/s.db"
wait_text "$conf:2: budget 0.2 does not apply to policy full (ignored)"
wait_for '\| ready \| #1 p2\.txt \|'
T send-keys -t "$s" F10
wait_exit
T new-session -d -s "$s" -x 200 -y 40 -c "$work" "$bin tui -t 1 -m $model -d $doc -n 4 --db $work/s.db"
wait_text "$conf:2: budget 0.2 does not apply to policy full (ignored)"
wait_for '\| ready \| #2 p2\.txt \| full \|'
T send-keys -t "$s" F10
wait_exit
# a policy the file names that does not exist: said, and the default used
printf 'policy = nosuch\n' > "$conf"
T new-session -d -s "$s" -x 200 -y 40 -c "$work" "$bin tui -t 1 -m $model -d $doc -n 4 --db $work/s.db"
wait_text "$conf:1: policy nosuch: "
wait_for '\| ready \| #2 p2\.txt \| full \|'   # the same document again before a question: #2 goes on
T send-keys -t "$s" F10
wait_exit
rm -rf "$work" "$cfg"
echo "tui test startup: ok"
