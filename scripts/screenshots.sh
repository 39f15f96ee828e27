#!/usr/bin/env bash
# screenshots.sh - render the main screens of `kvchat tui` to PNG for docs/ (run after `make`):
# drives the interface in tmux on the default model, captures the pane with its colours and
# attributes (`capture-pane -e -N`) and draws each capture with scripts/ansi2png.py (gnuplot,
# pngcairo). Needs tmux, gnuplot and python3. Usage: scripts/screenshots.sh [DOCUMENT]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
doc=${1:-$here/docs/store.md}
sock=kvchat-shots-$$
# the user's settings must not leak into the pictures: an empty config directory (the interface's
# defaults, colours on) and no ~/.tmux.conf. Colours need a colour terminal: xterm-256color outside,
# tmux-256color inside the pane. Not xterm-256color inside: with its bce/ech ncurses clears coloured
# blanks by erasing, and tmux leaves erased cells past a line's last character out of a capture
# (a popup or bar would lose its right edge); tmux-256color has neither, so they are written.
cfg=$(mktemp -d)
export XDG_CONFIG_HOME=$cfg XDG_STATE_HOME=$cfg TERM=xterm-256color
T() { tmux -L "$sock" -f /dev/null "$@"; }
cap() { T capture-pane -p -t s; }                            # plain text, for waiting
shot() { T capture-pane -e -p -N -t s | "$here/scripts/ansi2png.py" "$here/docs/$1" "$2" "$3"; }
wait_for() { for _ in $(seq 1 600); do cap | grep -Eq -- "$1" && return 0; sleep 0.2; done; echo "timeout: $1" >&2; cap >&2; exit 1; }
trap 'T kill-server 2>/dev/null || true; rm -rf "$cfg"' EXIT

db=$cfg/shots.db   # a fresh session database: the browser shows only what this script made
T set-option -g default-terminal tmux-256color \; \
    new-session -d -s s -x 130 -y 40 "$here/kvchat tui -d $doc -n 64 --policy chess:preset=aggressive --db $db"
wait_for '\| ready'
T send-keys -t s 'What does a snapshot hold?' Enter
wait_for 'you> What does a snapshot hold'
wait_for '^-- [0-9]+ tokens, '
sleep 0.5
shot tui-main.png 130 40
T send-keys -t s '/compare quest:budget=0.1,streaming:budget=0.1 Which table keeps the messages?' Enter
wait_for '== compare'
wait_for '\| ready'
sleep 0.5
shot tui-compare.png 130 40
T send-keys -t s F2
wait_for 'What the model sees'
sleep 0.5
shot tui-seen.png 130 40
T send-keys -t s F2
T send-keys -t s F4
wait_for 'Decode-time selection'
shot tui-policy.png 130 40
T send-keys -t s Escape
T send-keys -t s F3
wait_for 'Enter resume'
shot tui-sessions.png 130 40
T send-keys -t s Escape
T resize-window -t s -x 64 -y 30
sleep 1
shot tui-narrow.png 64 30
T resize-window -t s -x 130 -y 40
sleep 0.5
T send-keys -t s F1
wait_for 'kvchat keys and commands'
shot tui-help.png 130 40
T send-keys -t s x
T send-keys -t s '/quit' Enter
echo "wrote docs/tui-{main,compare,seen,policy,sessions,narrow,help}.png"
