#!/usr/bin/env bash
# reuse.sh - the interface answers as `ask` does and never reads a text twice: a refused /open
# draws no "new conversation"; under a prefill policy (SnapKV) the document waits for the first
# question and is compressed with it in view, so the first answer is ask's; a document opened and
# left is restored from its snapshot when kvchat starts again, and the same text under another
# name is restored too; after /compare the conversation goes on (that nothing is read again, also
# after a Ctrl-C in a column: tests/test_sess_reuse.c).
# usage: tests/tui/reuse.sh KVCHAT MODEL MEMO
set -euo pipefail
name=reuse
. "$(dirname "$0")/lib.sh"
bin=$(abs "$1") model=$(abs "$2") memo=$(abs "$3")
work=$(mktemp -d)
db=$work/kvchat.db
cp "$memo" "$work/memo.txt"
cp "$memo" "$work/same-text.txt"
q='Who supplies the coloured glass rods?'
tries=$((tries * 6))   # the default model answers at a few tokens a second here
opts="-t 1 -m $model --db $db --temp 0 -n 24"

# 1. SnapKV at 25%: a refused open draws nothing; the document waits for the question
T new-session -d -s "$s" -x 160 -y 50 -c "$work" "$bin tui $opts --policy snapkv --budget 0.25"
wait_for '\| ready \|'
T send-keys -t "$s" "/open $work/missing.txt" Enter
wait_for 'No such file'
absent 'a new conversation: missing' "a refused open drew a new conversation"
T send-keys -t "$s" "/open $work/memo.txt" Enter
wait_for 'compresses with the question in view'
absent 'no question yet' "the document was compressed before the question"
T send-keys -t "$s" "$q" Enter
wait_for '^-- [0-9]+ tokens, '
absent 'no question yet' "the document was compressed before the question"
T send-keys -t "$s" F10
wait_exit
tui=$("$bin" sessions --db "$db" export 1 --format md | awk '/^## /{r=$0; next} r ~ /Answer/ && NF {print; exit}')
want=$("$bin" ask $opts --no-db --policy snapkv --budget 0.25 -d "$work/memo.txt" -q "$q" 2>/dev/null | sed 's/^ //')
[ -n "$want" ] || fail "ask gave no answer"
[ "$(echo "$tui" | sed 's/^ //')" = "$want" ] || fail "the interface answered '$tui', ask '$want'"

# 2. full: open and quit; kvchat starts again on that session without reading the document
T new-session -d -s "$s" -x 160 -y 50 -c "$work" "$bin tui $opts -d $work/memo.txt"
wait_for 'prefilling under full'
wait_for '\| ready \| (#[0-9]+ )?memo\.txt'
T send-keys -t "$s" F10
wait_exit
T new-session -d -s "$s" -x 160 -y 50 -c "$work" "$bin tui $opts"
wait_for "the document's snapshot restored"
absent 'prefilling' "the document was read again on a restart"
wait_for '\| ready \| (#[0-9]+ )?memo\.txt'
# the same text under another name: restored too
T send-keys -t "$s" "/open $work/same-text.txt" Enter
wait_for 'read before: restored from its snapshot under full'
wait_for '\| ready \| (#[0-9]+ )?same-text\.txt'
T send-keys -t "$s" "$q" Enter
wait_count '^-- [0-9]+ tokens, ' 1
# 3. a comparison leaves the conversation where it was (Ctrl-C in one: tests/test_sess_reuse.c)
T send-keys -t "$s" "/compare quest,chess How many people does the site employ?" Enter
wait_for 'quest'
wait_for '^-- .*[0-9]+ tokens.*chess|chess.*[0-9]+ tokens'
T send-keys -t "$s" "How many people does the site employ?" Enter
wait_count '^-- [0-9]+ tokens, ' 2
T send-keys -t "$s" F10
wait_exit
rm -rf "$work" "$cfg"
echo "tui test reuse: ok"
