#!/usr/bin/env bash
# base.sh - a base model (the default model has no chat template): the welcome and the status bar
# say so, with the hint to pass an instruction-tuned GGUF for chat; an answer stops where the model
# begins its next "Question:" (the completion form's own next turn) instead of writing question
# and answer blocks up to the answer length; `ask` stops there too.
# usage: tests/tui/base.sh KVCHAT MODEL DOCUMENT (MODEL: a base model, e.g. the default model)
set -euo pipefail
name=base
. "$(dirname "$0")/lib.sh"
bin=$(abs "$1") model=$(abs "$2") doc=$(abs "$3")
n=160
T new-session -d -s "$s" -x 120 -y 50 "$bin tui -m $model -n $n --no-db"
wait_for 'This is a base model \(no chat template\)'
wait_for 'instruction-tuned GGUF'
wait_for '\(base model\)'
T send-keys -t "$s" "/open $doc" Enter
wait_for '^-- full: '
T send-keys -t "$s" 'What is this text about?' Enter
tries=$((tries * 6))   # the default model answers at a few tokens a second here
wait_for '^-- [0-9]+ tokens, '
got=$(cap | sed -n 's/^-- \([0-9]*\) tokens, .*/\1/p' | tail -1)
[ "$got" -lt "$n" ] || fail "the answer ran to the answer length ($got tokens)"
absent '^Question:' "the answer went on into the next question"
T send-keys -t "$s" F10
wait_exit
out=$("$bin" ask -m "$model" -d "$doc" -q 'What is this text about?' -n "$n" 2>/dev/null)
case $out in *Question:*) fail "ask went on into the next question: $out" ;; esac
[ -n "$out" ] || fail "ask gave an empty answer"
rm -rf "$cfg"
echo "tui test base: ok"
