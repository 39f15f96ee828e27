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
export XDG_CONFIG_HOME=$cfg TERM=xterm-256color
T() { tmux -L "$sock" -f /dev/null "$@"; }
cap() { T capture-pane -p -t s; }                            # plain text, for waiting
shot() { T capture-pane -e -p -N -t s | "$here/scripts/ansi2png.py" "$here/docs/$1" "$2" "$3"; }
wait_for() { for _ in $(seq 1 600); do cap | grep -Eq -- "$1" && return 0; sleep 0.2; done; echo "timeout: $1" >&2; cap >&2; exit 1; }
trap 'T kill-server 2>/dev/null || true; rm -rf "$cfg"' EXIT

T set-option -g default-terminal tmux-256color \; \
    new-session -d -s s -x 120 -y 34 "$here/kvchat tui -d $doc -n 64 --policy chess:preset=aggressive"
wait_for '\| ready'
T send-keys -t s 'What does a snapshot hold?' Enter
wait_for 'you> What does a snapshot hold'
wait_for '^-- [0-9]+ tokens, '
sleep 0.5
shot tui-main.png 120 34
T resize-window -t s -x 64 -y 30
sleep 1
shot tui-narrow.png 64 30
T resize-window -t s -x 120 -y 34
sleep 0.5
T send-keys -t s F1
wait_for 'kvchat keys and commands'
shot tui-help.png 120 34
T send-keys -t s x
T send-keys -t s '/quit' Enter
echo "wrote docs/tui-main.png docs/tui-narrow.png docs/tui-help.png"
