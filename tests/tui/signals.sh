#!/usr/bin/env bash
# signals.sh - closing the terminal or SIGTERM mid-answer loses nothing (issue 27): tmux kill-session
# (the interface gets SIGHUP) and then SIGTERM, each while an answer streams, stop the answer, save the
# question and the partial answer (marked interrupted), restore the terminal and exit with 128 + the
# signal (a terminal that hung up without a SIGHUP reaching kvchat counts as one); the interface
# started again shows every turn.
# usage: tests/tui/signals.sh KVCHAT MODEL DOCUMENT
set -euo pipefail
name=signals
. "$(dirname "$0")/lib.sh"
bin=$(abs "$1") model=$(abs "$2") doc=$(abs "$3")
work=$(mktemp -d)
db=$work/s.db
# the interface under a shell that outlives the signal (a trap is not inherited as "ignored"), writes
# kvchat's status and then waits for a line (a closed terminal ends the wait), so the screen after
# kvchat left can be read
runner() {
    printf '%s\n' "trap 'echo shell got it' HUP TERM" \
        "'$bin' tui -t 1 -m '$model' -n 100000 --db '$db' $1" \
        "echo \$? > '$work/status'; echo 'kvchat exited'; read -r _ || true" > "$work/run.sh"
    echo "bash $work/run.sh"
}
wait_file() {   # a file that must appear (kvchat's status)
    for _ in $(seq 1 "$tries"); do [ -s "$1" ] && return 0; sleep 0.1; done
    fail "timed out waiting for $1"
}
kvchat_pid() { pgrep -f -- " tui -t 1 .* --db $db" | head -1; }

# 1. SIGHUP: tmux kill-session closes the terminal mid-answer; kvchat is the pane's process, as
# when it is started from a terminal's shell, which passes the hang-up on
T new-session -d -s "$s" -x 120 -y 40 -c "$work" "'$bin' tui -t 1 -m '$model' -n 100000 --db '$db' -d '$doc'"
wait_for '\| ready \|'
T send-keys -t "$s" 'What happened at the mill?' Enter
wait_for '\| answering: [1-9][0-9]* tokens'
pid=$(kvchat_pid)
[ -n "$pid" ] || fail "no kvchat process under the pane"
T kill-session -t "$s"
for _ in $(seq 1 "$tries"); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "kvchat still runs after its terminal closed"
show=$("$bin" sessions --db "$db" show 1)
grep -q '^What happened at the mill?$' <<<"$show" || fail "SIGHUP: the question is not saved: $show"
grep -q '^\[2, reply to 1, policy [^]]*\] assistant (interrupted):$' <<<"$show" ||
    fail "SIGHUP: no partial answer marked interrupted: $show"

# 1b. the terminal closed under a shell that catches the hang-up and lives on (kvchat gets no
# SIGHUP): kvchat sees the dead terminal, leaves as on SIGHUP (status 129), and saves the turn
T new-session -d -s "$s" -x 120 -y 40 -c "$work" "$(runner "--session 1")"
wait_for '^you> What happened at the mill\?'
wait_for '\| ready \|'
T send-keys -t "$s" 'Where is it?' Enter
wait_for '\| answering: [1-9][0-9]* tokens'
T kill-session -t "$s"
wait_file "$work/status"
[ "$(cat "$work/status")" = 129 ] || fail "status after the hang-up: $(cat "$work/status") (expected 129)"
show=$("$bin" sessions --db "$db" show 1)
grep -q '^Where is it?$' <<<"$show" || fail "hang-up: the question is not saved: $show"
grep -q '^\[4, reply to 3, policy [^]]*\] assistant (interrupted):$' <<<"$show" ||
    fail "hang-up: no partial answer marked interrupted: $show"
rm -f "$work/status"

# 2. SIGTERM mid-answer in the same conversation, continued
T new-session -d -s "$s" -x 120 -y 40 -c "$work" "$(runner "--session 1")"
wait_for '^you> What happened at the mill\?'
wait_for '\| ready \|'
T send-keys -t "$s" 'Who owned it?' Enter
wait_for '\| answering: [1-9][0-9]* tokens'
pid=$(kvchat_pid)
[ -n "$pid" ] || fail "no kvchat process under the pane"
kill -TERM "$pid"
wait_file "$work/status"
[ "$(cat "$work/status")" = 143 ] || fail "status after SIGTERM: $(cat "$work/status") (expected 143)"
# the terminal is restored: the shell's line on the normal screen, not the interface's alternate one
wait_text 'kvchat exited'
[ "$(T display -p -t "$s" '#{alternate_on}')" = 0 ] || fail "the terminal was left in the interface's screen"
absent '\| answering' "the interface's screen was left behind"
show=$("$bin" sessions --db "$db" show 1)
grep -q '^Who owned it?$' <<<"$show" || fail "SIGTERM: the question is not saved: $show"
grep -q '^\[6, reply to 5, policy [^]]*\] assistant (interrupted):$' <<<"$show" ||
    fail "SIGTERM: no partial answer marked interrupted: $show"
T kill-session -t "$s"
rm -f "$work/status"

# 3. every turn is there when the interface continues the session
T new-session -d -s "$s" -x 120 -y 40 -c "$work" "$(runner "--session 1")"
wait_for '^you> What happened at the mill\?'
wait_for '^you> Where is it\?'
wait_for '^you> Who owned it\?'
wait_for '\| ready \|'
T send-keys -t "$s" C-q
wait_file "$work/status"
[ "$(cat "$work/status")" = 0 ] || fail "status after Ctrl-Q: $(cat "$work/status")"
T kill-server 2>/dev/null || true
rm -rf "$work" "$cfg"
echo "tui test signals: ok"
