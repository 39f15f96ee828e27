#!/usr/bin/env bash
# sessions.sh - conversations: a new document starts a visibly new one (a separator, its session
# id in the status bar); /policy with one half keeps the other and says so; the status bar shows a
# policy waiting for the next answer; the file picker (F6) goes to typed ~ and absolute paths,
# lists names that begin with the filter first, shows sizes as people read them and does nothing
# on Enter when nothing matches; while the interface has a session open, ask -c refuses it; the
# session browser (F3) counts truly, has column headings, shows the database's size against its
# limit, and takes y/n without Enter.
# usage: tests/tui/sessions.sh KVCHAT MODEL DOCUMENT
set -euo pipefail
name=sessions
. "$(dirname "$0")/lib.sh"
bin=$(abs "$1") model=$(abs "$2") doc=$(abs "$3")
work=$(mktemp -d)
home=$work/home
mkdir -p "$home/sub" "$work/elsewhere"
cp "$doc" "$home/notes.txt"
cp "$doc" "$home/anotes.txt"
cp "$doc" "$work/elsewhere/other.txt"
T new-session -d -s "$s" -x 120 -y 40 -c "$work" "HOME=$home $bin tui -t 1 -m $model -d $doc -n 4 --db $work/s.db"
wait_for '^-- full: '
T send-keys -t "$s" 'What is it about?' Enter
wait_for 'saved in session 1'
wait_for '\| ready \|'

# a decode-time policy waits for the next answer, and says so
T send-keys -t "$s" '/policy chess:preset=aggressive' Enter
wait_for '\| chess:preset=aggressive \(next answer\) \|'
T send-keys -t "$s" 'And then?' Enter
wait_count '^-- 4 tokens' 2
wait_for '\| chess:preset=aggressive \|'
# one half given: the other stays
T send-keys -t "$s" '/policy snapkv:budget=0.5' Enter
wait_for 'snapkv:budget=0\.5 replaces its half of chess:preset=aggressive; the other half'
wait_for '\| snapkv:budget=0\.5\+chess:preset=aggressive \|'

# a new document: a separator; under SnapKV it waits for the first question (read with it, as ask
# does), and its session is made then, with its number in the status bar
T send-keys -t "$s" "/open ~/notes.txt" Enter
wait_for '─ a new conversation: notes\.txt ─'
wait_for 'compresses with the question in view'
wait_for '\| ready \| notes\.txt \|'
T send-keys -t "$s" 'What is it about?' Enter
wait_for '\| ready \| #2 notes\.txt \|'

# the file picker: ~ and absolute paths typed, prefixes first, human sizes, Enter on nothing
T send-keys -t "$s" F6
wait_for "Open a document: $work"
T send-keys -t "$s" '~/'
wait_for "Open a document: $home"
T send-keys -t "$s" 'notes'
wait_for 'filter: notes_'
wait_for 'notes\.txt +3\.[0-9] KiB'
first=$(cap | grep -Eo '(a?notes)\.txt +3' | head -1)
[ "${first%% *}" = "notes.txt" ] || fail "the name that begins with the filter is not first: $first"
T send-keys -t "$s" 'zzz'
wait_for "nothing here matches 'noteszzz'"
T send-keys -t "$s" Enter
wait_for 'Open a document'
T send-keys -t "$s" BSpace BSpace BSpace BSpace BSpace BSpace BSpace BSpace "$work/elsewhere/"
wait_for "Open a document: $work/elsewhere"
wait_for 'other\.txt'
T send-keys -t "$s" Enter
wait_for '─ a new conversation: other\.txt ─'
wait_for '\| ready \| other\.txt \|'
T send-keys -t "$s" 'What is it about?' Enter
wait_for '\| ready \| #3 other\.txt \|'

# the open session is held: ask -c (the most recent session, #3) refuses it in one line, naming it
set +e
HOME=$home "$bin" ask -t 1 -m "$model" -c -q 'Fork it?' -n 4 --db "$work/s.db" >"$work/ask.out" 2>"$work/ask.err"
st=$?
set -e
[ "$st" = 1 ] || fail "ask -c on the session the interface holds exited $st: $(cat "$work/ask.err")"
[ "$(wc -l <"$work/ask.err")" = 1 ] || fail "ask -c said more than one line: $(cat "$work/ask.err")"
grep -q 'session 3 is open in another kvchat (pid [0-9]*)' "$work/ask.err" || fail "ask -c: $(cat "$work/ask.err")"

# the session browser: the count tells the truth, column headings, the database against its
# limit, and y/n act at once
T send-keys -t "$s" F3
wait_for 'Sessions: 3 sessions \| db [0-9.]+ [KM]iB of 1\.0 GiB limit, 0 pruned'
wait_for 'id +title +document +model +policy +msgs +stored +updated'
T send-keys -t "$s" 'zzzq'
wait_for "Sessions: 0 of 3 sessions match 'zzzq'"
T send-keys -t "$s" BSpace BSpace BSpace BSpace
wait_for 'search: _'
wait_for 'Sessions: 3 sessions \|'
absent 'match' "an emptied search still says what matched"
T send-keys -t "$s" Down DC
wait_for 'delete session [12] with its messages and snapshots\? y/n'
T send-keys -t "$s" n
wait_for 'not deleted'
T send-keys -t "$s" DC
wait_for 'delete session [12] with its messages and snapshots\? y/n'
T send-keys -t "$s" y
wait_for 'session [12] deleted'
wait_for 'Sessions: 2 sessions \|'
T send-keys -t "$s" Escape
wait_gone 'Enter resume' "Esc did not close the session browser"
T send-keys -t "$s" F10
wait_exit
# the interface let go of its session when it closed: ask -c continues it
HOME=$home "$bin" ask -t 1 -m "$model" -c -q 'And now?' -n 4 --db "$work/s.db" >"$work/ask.out" 2>"$work/ask.err" ||
    fail "ask -c after the interface closed: $(cat "$work/ask.err")"
rm -rf "$work" "$cfg"
echo "tui test sessions: ok"
