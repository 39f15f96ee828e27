#!/usr/bin/env bash
# screenshots.sh - render the main screens of `kvchat tui` to PNG for docs/ (run after `make`):
# drives the interface in tmux on the default model, captures the pane text, draws it with gnuplot
# (monospace, the status bar shaded). Usage: scripts/screenshots.sh [DOCUMENT]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
doc=${1:-$here/docs/store.md}
sock=kvchat-shots-$$
T() { tmux -L "$sock" "$@"; }
cap() { T capture-pane -p -t s; }
wait_for() { for _ in $(seq 1 600); do cap | grep -Eq -- "$1" && return 0; sleep 0.2; done; echo "timeout: $1" >&2; cap >&2; exit 1; }
trap 'T kill-server 2>/dev/null || true' EXIT

render() {   # render.sh OUT.png COLS ROWS < screen text
    local out=$1 cols=$2 rows=$3 w h
    w=$((cols * 9 + 20)); h=$((rows * 18 + 20))
    {
        echo "set terminal pngcairo size $w,$h font 'DejaVu Sans Mono,11' noenhanced background '#1e1e1e'"
        echo "set output '$out'"
        echo "unset border; unset tics; unset key; set margins 0,0,0,0"
        echo "set xrange [0:$w]; set yrange [0:$h]"
        echo "set object 1 rect from 0,$((h - 10 - 18)) to $w,$((h - 8)) fc rgb '#2aa198' fs solid noborder behind"
        local y=$((h - 22)) n=0
        while IFS= read -r line; do
            line=${line//\'/\'\'}
            local color='#d0d0d0'
            [ $n -eq 0 ] && color='#000000'
            [[ $line == "you> "* ]] && color='#56b6c2'
            [[ $line == "-- "* ]] && color='#98c379'
            [[ $line == "~~ "* ]] && color='#c678dd'
            echo "set label $((n + 1)) '$line' at 10,$y left tc rgb '$color'"
            y=$((y - 18)); n=$((n + 1))
        done
        echo "plot -1 notitle"
    } | gnuplot
}

T new-session -d -s s -x 120 -y 34 "$here/kvchat tui -d $doc -n 64 --policy chess:preset=aggressive"
wait_for '\| ready'
T send-keys -t s 'What does a snapshot hold?' Enter
wait_for 'you> What does a snapshot hold'
wait_for '^-- [0-9]+ tokens, '
cap | render "$here/docs/tui-main.png" 120 34
T resize-window -t s -x 64 -y 30
sleep 1
cap | render "$here/docs/tui-narrow.png" 64 30
T resize-window -t s -x 120 -y 34
sleep 0.5
T send-keys -t s F1
wait_for 'kvchat keys and commands'
cap | render "$here/docs/tui-help.png" 120 34
T send-keys -t s x
T send-keys -t s '/quit' Enter
echo "wrote docs/tui-main.png docs/tui-narrow.png docs/tui-help.png"
