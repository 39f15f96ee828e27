# lib.sh - what the terminal tests share (sourced): a private tmux server, the screen as text, and
# waiting on what it shows (never a fixed sleep). A test sets name= before sourcing; paths given to
# it are made absolute, since the interface runs in a directory of its own.
# KVCHAT_TUI_WAIT: seconds a wait gives up after (20; shorter to check quickly that a test fails).
abs() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
sock=kvchat-tui-${name:-test}-$$
s=t
T() { tmux -L "$sock" "$@"; }
cap() { T capture-pane -p -t "$s"; }
fail() { echo "tui test $name: $*"; echo "----- screen -----"; cap || true; T kill-server 2>/dev/null || true; exit 1; }
tries=$((${KVCHAT_TUI_WAIT:-20} * 10))
wait_for() {   # a regular expression that must appear on the screen
    for _ in $(seq 1 "$tries"); do cap | grep -Eq -- "$1" && return 0; sleep 0.1; done
    fail "timed out waiting for /$1/"
}
wait_text() {   # a fixed text that must appear on the screen
    for _ in $(seq 1 "$tries"); do cap | grep -Fq -- "$1" && return 0; sleep 0.1; done
    fail "timed out waiting for the text '$1'"
}
wait_count() {   # at least $2 lines matching $1
    for _ in $(seq 1 "$tries"); do [ "$(cap | grep -Ec -- "$1")" -ge "$2" ] && return 0; sleep 0.1; done
    fail "timed out waiting for $2 lines matching /$1/"
}
wait_gone() {   # a regular expression that must leave the screen ($2: what went wrong)
    for _ in $(seq 1 "$tries"); do cap | grep -Eq -- "$1" || return 0; sleep 0.1; done
    fail "$2"
}
wait_exit() {   # the interface must quit
    for _ in $(seq 1 "$tries"); do T has-session -t "$s" 2>/dev/null || return 0; sleep 0.1; done
    fail "kvchat did not quit"
}
absent() {   # a regular expression that must not be on the screen now ($2: what went wrong)
    cap | grep -Eq -- "$1" && fail "$2"
    return 0
}
status_bar() { cap | head -1; }
trap 'T kill-server 2>/dev/null || true' EXIT
# hermetic: no user settings, data or history
cfg=$(mktemp -d)
export XDG_CONFIG_HOME=$cfg
export XDG_STATE_HOME=$cfg/state   # the input history
