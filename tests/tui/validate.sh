#!/usr/bin/env bash
# validate.sh - one validation for every front end: policy specs and budgets the engine refuses
# (a budget of 0, one larger than the context, one below what the policy always keeps) are refused
# by /policy and by the settings view (F5) with the message `kvchat ask` gives, nothing changes;
# a typed setting is checked by the same option table as the command line; an empty or blank
# document is refused.
# usage: tests/tui/validate.sh KVCHAT MODEL DOCUMENT
set -euo pipefail
name=validate
. "$(dirname "$0")/lib.sh"
bin=$(abs "$1") model=$(abs "$2") doc=$(abs "$3")
work=$(mktemp -d)
: > "$work/empty.txt"
printf '  \n\n\t \n' > "$work/blank.txt"
T new-session -d -s "$s" -x 120 -y 40 -c "$work" "$bin tui -t 1 -m $model -d $doc -n 4 --no-db"
wait_for '\| ready \|'

# what ask says about a spec is what /policy says, and the policy stays as it was
for spec in quest:budget=0 snapkv:budget=999999; do
    msg=$("$bin" ask -t 1 -m "$model" -d "$doc" -q hi -n 1 --policy "$spec" 2>&1 >/dev/null) && fail "ask accepted --policy $spec"
    msg=${msg#kvchat: ask: }
    T send-keys -t "$s" "/policy $spec" Enter
    wait_text "!! ${msg:0:50}"   # (the length checked against: the conversation so far)
    cap | head -1 | grep -q '| full | ctx' || fail "the policy changed after a refused /policy $spec"
done
absent 'from the next answer on' "a refused policy was taken"

# the settings view: the budget is checked by the engine against this conversation
T send-keys -t "$s" '/policy take:budget=0.5' Enter
wait_for '\| ready \| p2\.txt \| take:budget=0\.5 \|'
T send-keys -t "$s" F5
wait_for 'budget +-'
T send-keys -t "$s" Down Down Down Down Down Down Down Enter
wait_for 'budget: _'
T send-keys -t "$s" '0.001' Enter
wait_for 'take: budget 1 tokens is below the 32 probe tokens'
cap | grep -Eq 'budget +-' || fail "the refused budget was kept in the settings"
# a typed setting: the command line's option table decides
T send-keys -t "$s" Up Up Up Up Up Up Up Enter
wait_for 'temperature: 0\.00_|temperature: 0_'
T send-keys -t "$s" BSpace BSpace BSpace BSpace '200' Enter
wait_for "temperature: '200' is not a number in \\[0, 100\\]"
T send-keys -t "$s" Escape
wait_gone 'Settings' "Esc did not close the settings"
cap | head -1 | grep -q '| take:budget=0.5 | ctx' || fail "the refused budget changed the policy"

# documents with nothing in them
T send-keys -t "$s" "/open $work/empty.txt" Enter
wait_for "^!! $work/empty\\.txt is empty: nothing to ask about"
T send-keys -t "$s" "/open $work/blank.txt" Enter
wait_for "^!! $work/blank\\.txt is empty \\(only white space\\)"
wait_for '\| ready \| p2\.txt \|'
msg=$("$bin" ask -t 1 -m "$model" -d "$work/blank.txt" -q hi 2>&1 >/dev/null) && fail "ask accepted a blank document"
msg=${msg:-}
echo "$msg" | grep -q "blank.txt is empty (only white space)" || fail "ask says otherwise: $msg"
T send-keys -t "$s" '/quit' Enter
wait_exit
rm -rf "$work" "$cfg"
echo "tui test validate: ok"
