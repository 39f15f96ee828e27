#!/usr/bin/env bash
# cli.sh - the command line as `llm` users expect it: `ask` shows the prefill's progress on stderr
# when that is a terminal (here a tmux pane) and clears it; `-d -` reads the document from stdin;
# `--policy help` needs nothing else; a --ctx above the model's training warns; `sessions list` on
# a missing database creates none; `sessions show` names each answer's policy; `ask -c` continues
# the most recent session.
# usage: tests/tui/cli.sh KVCHAT MODEL DOCUMENT
set -euo pipefail
# A kvchat command piped into grep -q would die of SIGPIPE once grep has its match (pipefail):
# the checks below read its whole output.
name=cli
. "$(dirname "$0")/lib.sh"
bin=$(abs "$1") model=$(abs "$2") doc=$(abs "$3")
work=$(mktemp -d)
for _ in 1 2 3 4 5 6 7 8 9; do cat "$doc"; done > "$work/big.txt"

# progress on a terminal, gone when the answer starts
T new-session -d -s "$s" -x 150 -y 20 -c "$work" \
    "$bin ask -t 1 -m $model -d $work/big.txt -q 'What is it about?' -n 4 2>&1; echo ask-done; sleep 60"
wait_for '^prefill [0-9]+/[0-9]+ tokens \([0-9]+%\), [0-9]+ tok/s, [0-9]+ s left'
wait_for '^ask-done'
absent '^prefill [0-9]+/' "the progress line stayed"
T kill-session -t "$s"
# ... and nothing of it when stderr is not a terminal
err=$("$bin" ask -t 1 -m "$model" -d "$doc" -q hi -n 2 2>&1 >/dev/null)
echo "$err" | grep -Eq 'prefill [0-9]+/[0-9]+ tokens' && fail "progress written to a file: $err"

# the document from stdin
out=$("$bin" ask -t 1 -m "$model" -d - -q 'What is it about?' -n 4 --temp 0 < "$doc" 2>/dev/null) || fail "ask -d - failed"
ref=$("$bin" ask -t 1 -m "$model" -d "$doc" -q 'What is it about?' -n 4 --temp 0 2>/dev/null)
[ "$out" = "$ref" ] || fail "-d - answered '$out', the file '$ref'"

# --policy help alone
"$bin" ask --policy help | grep '^KV-cache policies' >/dev/null || fail "ask --policy help did not list the policies"

# a context above the model's training: a warning, and it still answers
err=$("$bin" ask -t 1 -m "$model" -d "$doc" -q hi -n 2 --ctx 20000 2>&1 >/dev/null) || fail "--ctx 20000 failed: $err"
echo "$err" | grep -q 'warning: --ctx 20000 is above the 8192 tokens' || fail "no warning for --ctx 20000: $err"

# sessions: a missing database stays missing; show names each answer's policy; -c continues
out=$("$bin" sessions --db "$work/none.db" list) || fail "sessions list on a missing database failed"
[ ! -e "$work/none.db" ] || fail "sessions list created $work/none.db"
echo "$out" | grep -q 'no sessions yet' || fail "sessions list said: $out"
"$bin" ask -t 1 -m "$model" -d "$doc" -q 'First?' -n 2 --db "$work/s.db" --session talk --policy quest:budget=0.5 \
    > /dev/null 2>&1 || fail "ask --session failed"
"$bin" ask -t 1 -m "$model" -c -q 'Second?' -n 2 --db "$work/s.db" > /dev/null 2>"$work/err" ||
    fail "ask -c failed: $(cat "$work/err")"
grep -q 'session 1: restored' "$work/err" || fail "ask -c did not continue session 1: $(cat "$work/err")"
show=$("$bin" sessions --db "$work/s.db" show talk)
echo "$show" | grep -q 'Second?' || fail "the continued turn is not in the session"
[ "$(echo "$show" | grep -c 'policy quest:budget=0.5\] assistant')" = 2 ] || fail "show does not name each answer's policy: $show"
rm -rf "$work" "$cfg"
echo "tui test cli: ok"
