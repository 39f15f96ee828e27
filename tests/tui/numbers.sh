#!/usr/bin/env bash
# numbers.sh - figures that read right: the status bar says what the KV share is of and never goes
# over 100%; the page map says "N (P tokens each)"; the tokens a resume restores are the context
# the status bar counts; `ask` prints pages per step as X.X of Y.Y; after a cancelled prefill the
# status bar names the document that is loaded, not the cancelled one.
# usage: tests/tui/numbers.sh KVCHAT MODEL DOCUMENT
set -euo pipefail
name=numbers
. "$(dirname "$0")/lib.sh"
bin=$(abs "$1") model=$(abs "$2") doc=$(abs "$3")
work=$(mktemp -d)
db=$work/n.db
for _ in 1 2 3 4 5 6 7 8 9; do cat "$doc"; done > "$work/big.txt"
T new-session -d -s "$s" -x 140 -y 40 -c "$work" "$bin tui -t 1 -m $model -d $doc -n 4 --db $db"
wait_for '^-- full: '
wait_for '\| KV [0-9]+% of context \((sliding-window layers hold [0-9]+; )?[0-9.]+ MiB\) \|'
absent 'kept [0-9]+%' "a share without saying of what"
pct=$(status_bar | sed -n 's/.*| KV \([0-9]*\)% of context.*/\1/p')
[ "$pct" -le 100 ] || fail "a share over 100%: $pct"
wait_for 'Pages: [0-9]+ \(32 tokens each\)'
T send-keys -t "$s" 'What is it about?' Enter
wait_for 'saved in session 1'
wait_for '\| ready \|'

# after a cancelled prefill: the loaded document, as it was
T send-keys -t "$s" "/open $work/big.txt" Enter
wait_for '\| prefill [0-9]+/[0-9]+ tokens'
T send-keys -t "$s" C-c
wait_for 'prefill cancelled; back to p2\.txt as it was'
wait_for '\| ready \| #1 p2\.txt \|'
ctx=$(status_bar | sed -n 's/.*| ctx \([0-9]*\)\/.*/\1/p')
T send-keys -t "$s" F10
wait_exit

# restored tokens = the context the status bar counts
T new-session -d -s "$s" -x 140 -y 40 -c "$work" "$bin tui -t 1 -m $model -n 4 --db $db"
wait_for 'session 1: restored [0-9]+ tokens'
wait_for '\| ready \|'
restored=$(cap | sed -n 's/.*session 1: restored \([0-9]*\) tokens.*/\1/p' | head -1)
now=$(status_bar | sed -n 's/.*| ctx \([0-9]*\)\/.*/\1/p')
[ "$restored" = "$now" ] || fail "restored $restored tokens, the status bar counts $now"
[ "$restored" = "$ctx" ] || fail "restored $restored tokens, the context was $ctx before"
T send-keys -t "$s" F10
wait_exit

# ask: pages per step, both with one decimal, the first no more than the second
out=$("$bin" ask -t 1 -m "$model" -d "$doc" -q 'What is it about?' -n 8 --policy chess 2>&1 >/dev/null)
pages=$(echo "$out" | grep -o 'pages/step [0-9.]* of [0-9.]*') || fail "no pages/step in: $out"
echo "$pages" | grep -Eq '^pages/step [0-9]+\.[0-9] of [0-9]+\.[0-9]$' || fail "pages/step reads: $pages"
echo "$pages" | awk '{ exit !($2 <= $4) }' || fail "more pages per step than there are: $pages"
rm -rf "$work" "$cfg"
echo "tui test numbers: ok"
