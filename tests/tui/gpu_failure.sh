#!/usr/bin/env bash
# gpu_failure.sh - the interface on the CUDA backend when the GPU fails mid-conversation, over the
# stand-in runtime (bench/standin/), which fails the first call of a kind, or every one, made after a
# file appears (KVCHAT_STANDIN_ARM):
#   - out of GPU memory in a question (every allocation failing while it runs, so that no fallback
#     that allocates again gets round it) is one line in the conversation, and the next question is
#     answered;
#   - a fault that ends the device's context is one line naming it and asking for a restart, every
#     later question gets the same line, and the interface stays up and quits normally;
#   - under --device auto, a GPU out of memory as the weights go up leaves the model to the CPU,
#     with a note saying why, and the questions are answered there;
# in the first two the conversation is saved with every answered turn (kvchat sessions export), and
# none leaves a memory error, leak or undefined behaviour where the build has the sanitizers.
# usage: tests/tui/gpu_failure.sh KVCHAT_CUDA STANDIN_DIR MODEL DOCUMENT
set -euo pipefail
name=gpu_failure
. "$(dirname "$0")/lib.sh"
bin=$(abs "$1") si=$(abs "$2") model=$(abs "$3") doc=$(abs "$4")
# run alone too: the sanitizers' known leaks of the libraries set aside as make test does
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$(abs "$(dirname "$0")/../lsan.supp")}
work=$(mktemp -d)
trap 'T kill-server 2>/dev/null || true; rm -rf "$work" "$cfg"' EXIT
# a question long enough to need more of the device than the one before it (its own pages)
long=$(for i in $(seq 1 300); do printf 'Tell me about item %d and its box. ' "$i"; done)

run_tui() {   # run_tui FAIL DB: the interface, KVCHAT_STANDIN_FAIL=FAIL counting from when $work/arm appears
    rm -f "$work/arm"
    T new-session -d -s "$s" -x 150 -y 45 -c "$work" "HOME=$work LD_LIBRARY_PATH=$si KVCHAT_STANDIN_FAIL=$1 \
KVCHAT_STANDIN_ARM=$work/arm $bin tui -t 1 --device cuda -m $model -d $doc -n 4 --db $2 2> $work/stderr"
    wait_for '\| ready \|'
    T send-keys -t "$s" 'What is it about?' Enter
    wait_for 'saved in session 1'
    wait_count '^-- [0-9]+ tokens' 1
    wait_for '\| ready \|'
}
quit_tui() {
    T send-keys -t "$s" F10
    wait_exit
    if grep -q 'AddressSanitizer\|LeakSanitizer\|runtime error:' "$work/stderr"; then
        echo "tui test $name: the interface's stderr:"
        grep -v '^  0x\|^Shadow byte legend\|^  [A-Z][a-zA-Z ]*: ' "$work/stderr" | head -n 40
        exit 1
    fi
}
wait_below() {   # wait_below A B: a line matching B below the last line matching A (regular expressions)
    for _ in $(seq 1 "$tries"); do
        cap | awk -v a="$1" -v b="$2" '$0 ~ a { seen = 1; found = 0; next } seen && $0 ~ b { found = 1 } END { exit !found }' &&
            return 0
        sleep 0.1
    done
    fail "timed out waiting for /$2/ below /$1/"
}
turns_saved() {   # turns_saved DB N: the session holds N answers and the questions before them
    LD_LIBRARY_PATH="$si" "$bin" sessions --db "$1" export 1 --format json > "$work/export.json" ||
        fail "kvchat sessions could not export the conversation"
    local n
    n=$(grep -o '"role": *"assistant"' "$work/export.json" | wc -l || true)
    [ "$n" -eq "$2" ] || fail "the saved conversation holds $n answers, not $2"
}

# out of GPU memory in the second question; the third is answered
run_tui malloc:1+ "$work/m.db"
touch "$work/arm"
T send-keys -t "$s" "$long" Enter
wait_for '^!! .*out of GPU memory'
rm -f "$work/arm"
wait_for '\| ready \|'
T send-keys -t "$s" 'And item 4?' Enter
wait_below '^you> And item 4\?' '^-- [0-9]+ tokens'
wait_for '\| ready \|'
quit_tui
turns_saved "$work/m.db" 2

# a fault in the second question: the device is gone for good, the interface is not
run_tui fault:1 "$work/f.db"
touch "$work/arm"
T send-keys -t "$s" 'And item 4?' Enter
wait_for '^!! .*the GPU cannot go on \(an illegal memory access was encountered'
wait_for '\| ready \|'
T send-keys -t "$s" 'And item 6?' Enter
wait_below '^you> And item 6\?' '^!! .*the GPU cannot go on'
wait_for '\| ready \|'
quit_tui
turns_saved "$work/f.db" 1

# --device auto, the GPU out of memory while the weights go up: the CPU runs it, and says why
T new-session -d -s "$s" -x 150 -y 45 -c "$work" "HOME=$work LD_LIBRARY_PATH=$si KVCHAT_STANDIN_FAIL=malloc:1 \
$bin tui -t 1 --device auto -m $model -d $doc -n 4 --no-db 2> $work/stderr"
wait_for '^-- note: the GPU was not used \(out of GPU memory: a [0-9]+ x [0-9]+ [A-Z0-9_]+ weight needs'
wait_for '│ device   CPU \(1 thread\)$'
wait_for '\| ready \|'
T send-keys -t "$s" 'What is it about?' Enter
wait_for '^-- [0-9]+ tokens, '
wait_for '\| ready \|'
absent '^!! ' "an error while running on the CPU after the GPU was given up"
quit_tui
echo "tui test gpu_failure: ok"
