#!/usr/bin/env bash
# standin_faults.sh KVCHAT STANDIN_DIR [--every] - the CUDA backend's failures, each where it can happen.
#
# KVCHAT is a CUDA build of kvchat (make test gives one built with ASan and UBSan), STANDIN_DIR the
# stand-in CUDA runtime and cuBLAS (bench/standin/), which can fail a chosen call as a real runtime
# would (KVCHAT_STANDIN_FAIL=KIND:N: a device allocation, a page-locked allocation or pinning, a
# kernel launch, cuBLAS's included, or a fault that ends the context) and say from which places in
# the program each kind of call came (KVCHAT_STANDIN_SITES). For each scenario below a clean run
# lists the places; then one run a place fails its first call there and one its last (--every:
# every call of every kind, a long run), and each run must end as a user of a real GPU would want:
#   - no crash, hang, memory error, leak or undefined behaviour (the sanitizers), exit 0 or 1;
#   - a failed command says so in one line, "kvchat: ...", naming the cause: out of GPU memory, out
#     of page-locked memory, the launch's or the fault's error; never a fault reported as memory;
#   - --device auto: a GPU that fails before the run is ready leaves the run to the CPU with a
#     one-line note, and the answer is the CPU's own, word for word;
#   - a chat goes on: after a failure that does not end the context the next turns are answered;
#   - a saved session stays whole: after a failed follow-up, the next one resumes it;
#   - the interface (tests/tui/gpu_failure.sh) reports out of GPU memory and a fault in the
#     conversation, answers after the one, stays up after the other, and saves the answered turns.
# Prints a line per failure and a summary; exit 1 if anything failed.
set -u
if [ $# -lt 2 ] || [ $# -gt 3 ] || { [ $# -eq 3 ] && [ "$3" != --every ]; }; then
    echo "usage: scripts/standin_faults.sh KVCHAT STANDIN_DIR [--every]" >&2
    exit 2
fi
K=$1
SI=$2
every=${3:-}
who=standin_faults
. "$(dirname "$0")/standin_env.sh" ../shared/testdata/tiny/tiny-llama-q4_k_m.gguf \
    ../shared/testdata/tiny/tiny-gemma3-q4_k_m.gguf ../shared/testdata/prompts/p2.txt
jobs_at_once=$(nproc 2>/dev/null || echo 2)
[ "$jobs_at_once" -gt 4 ] && jobs_at_once=4

llama=$TD/tiny/tiny-llama-q4_k_m.gguf
gemma=$TD/tiny/tiny-gemma3-q4_k_m.gguf
doc=$work/doc.txt
for i in $(seq 1 120); do echo "Line $i of the document says that item $i is kept in box $((i * 7 % 13))."; done > "$doc"
short=$work/short.txt   # where a run may fall back to the CPU (under the sanitizers: 5 s for $doc)
head -n 12 "$doc" > "$short"
printf '%s\n' "Which box holds item 3?" "And item 4?" "And item 6?" "/quit" > "$work/chat.txt"

fails=0
runs=0
skipped=0
fail() {
    echo "standin_faults: FAILED: $*"
    fails=$((fails + 1))
}

# The scenarios: each a command run in its own home (sessions, the store) with its own check.
scenario_cmd() {   # scenario_cmd NAME: the command in CMD
    case $1 in
    ask) CMD=("$K" ask -m "$llama" --device cuda -d "$doc" -q "Which box holds item 5?" -n 8 --policy quest
              --budget 0.3 --page-size 16) ;;
    auto) CMD=("$K" ask -m "$gemma" --device auto -d "$short" -q "Which box holds item 5?" -n 8) ;;
    policies) CMD=("$K" bench -m "$llama" --device cuda --ctx 300 --gen 6 --page-size 16 --budget 0.3 --no-csv
                   --policy "streaming,sentkv,chess:budget=0.5,take,laser,chelsea,h2o") ;;
    graphs) CMD=(env KVCHAT_CUDA_GRAPH=on "$K" bench -m "$gemma" --device cuda --ctx 300 --gen 8 --no-csv
                 --policy full,quest --budget 0.3) ;;
    batch) CMD=("$K" bench -m "$llama" --device cuda --ctx 300 --gen 6 --compare --policy full,quest,chess:budget=0.5
                --budget 0.3 --no-csv) ;;
    seqs) CMD=("$K" bench -m "$gemma" --device cuda --ctx 300 --gen 6 --seqs 3 --policy full,sentkv --budget 0.3
               --page-size 16 --no-csv) ;;
    chat) CMD=("$K" chat -m "$gemma" --device cuda -n 6) ;;
    resume) CMD=("$K" ask -m "$llama" --device cuda -c -q "And item 9?" -n 8 --policy sentkv --budget 0.3) ;;
    esac
}
scenarios=${STANDIN_FAULTS_ONLY:-ask auto policies graphs batch seqs chat resume}   # STANDIN_FAULTS_ONLY: some of them

# A home for a run: empty, or (resume) holding a session saved by a clean run.
new_home() {   # new_home DIR
    rm -rf "$1"
    if [ -d "$work/saved" ]; then cp -r "$work/saved" "$1"; else mkdir -p "$1"; fi
}
run_in() {   # run_in DIR SCENARIO [ENV...]: the scenario's command in DIR's home, its output there
    local dir=$1 name=$2
    shift 2
    scenario_cmd "$name"
    local input=/dev/null
    [ "$name" = chat ] && input=$work/chat.txt
    HOME="$dir" XDG_DATA_HOME="$dir" timeout 120 env "$@" "${CMD[@]}" < "$input" > "$dir/out" 2> "$dir/err"
    echo $? > "$dir/rc"
}

# The line a failure of KIND must give, as an extended regular expression.
cause_of() {
    case $1 in
    malloc) echo 'out of GPU memory' ;;
    host-alloc | host-register) echo 'out of page-locked (host )?memory' ;;
    launch) echo 'too many resources requested for launch|cuBLAS' ;;
    fault) echo 'an illegal memory access was encountered' ;;
    esac
}

# judge DIR SCENARIO KIND N: the checks above, for a run that failed call N of KIND
judge() {
    local dir=$1 name=$2 kind=$3 n=$4 rc what="$2 with $3:$4"
    rc=$(cat "$dir/rc")
    local errs
    errs=$(grep -c '^kvchat: ' "$dir/err")
    if grep -q 'AddressSanitizer\|LeakSanitizer\|runtime error:' "$dir/err"; then
        fail "$what: a memory error or undefined behaviour"
        grep -v '^  0x\|^Shadow byte legend\|^  [A-Z][a-zA-Z ]*: ' "$dir/err" | head -n 30
        return
    fi
    if [ "$rc" -eq 124 ]; then fail "$what: no end within 120 s"; return; fi
    if [ "$rc" -gt 1 ]; then
        fail "$what: exit $rc"
        tail -n 20 "$dir/err"
        return
    fi
    if ! grep -qx "failed $kind $n" "$dir/report"; then
        # never reached: over the stand-in what the device computes is whatever its buffers held,
        # so a policy that decides from it (Chelsea's merges) may take another path than the clean
        # run's; counted, and too many fail the check
        echo "standin_faults: skipped: $what (the call was not made)"
        return
    fi
    # a failed launch is never absorbed: the run fails or says so (an allocation's may be: a
    # policy's scratch short lets the CPU answer; a fault answers every later call, so only one at
    # the last waits, as the program closes after its answer, goes unsaid)
    if [ "$kind" = launch ] && [ "$rc" -eq 0 ] && [ "$errs" -eq 0 ]; then
        fail "$what: exit 0 and no message, as if the call had not failed"
        return
    fi
    if [ "$rc" -eq 1 ] && [ "$errs" -ne 1 ] && [ "$name" != chat ]; then
        fail "$what: exit 1 with $errs messages on stderr"
        head -n 3 "$dir/err"
        return
    fi
    local cause
    cause=$(cause_of "$kind")
    # besides kvchat's messages, only the kinds of line the clean run writes there too (ask's metrics
    # and selection lines, a restored session's)
    if grep -v '^kvchat: ' "$dir/err" | awk '{ print $1 }' | sort -u | comm -23 - "$clean/err_kinds" | grep -q .; then
        fail "$what: lines on stderr that are neither kvchat's one-line messages nor the clean run's:"
        grep -v '^kvchat: ' "$dir/err" | head -n 5
        return
    fi
    if grep '^kvchat: ' "$dir/err" | grep -vEq "$cause"; then
        fail "$what: a message that does not name the cause ($cause):"
        head -n 3 "$dir/err"
        return
    fi
    case $name in
    chat)
        # a failure that leaves the context whole fails at most the turn it happened in (a turn
        # fails only with a message, so the others were answered); one before the first turn (at
        # load) ends the chat with exit 1 and one message
        if [ "$kind" != fault ] && [ "$errs" -gt 1 ]; then
            fail "$what: the turns after the failure failed too:"
            head -n 3 "$dir/err"
        elif [ "$rc" -eq 1 ] && [ "$errs" -ne 1 ]; then
            fail "$what: exit 1 with $errs messages on stderr"
        fi
        ;;
    auto)
        if grep -q 'note: the GPU was not used' "$dir/err"; then
            if [ "$rc" -ne 0 ]; then
                fail "$what: the CPU did not run after the GPU was given up (exit $rc)"
            elif ! diff -q <(grep -v '^policy ' "$dir/out") "$work/cpu_answer" > /dev/null; then
                fail "$what: the CPU's answer after the GPU was given up is not the CPU's own:"
                diff <(grep -v '^policy ' "$dir/out") "$work/cpu_answer" | head -n 6
            fi
        elif [ "$rc" -eq 0 ] && [ "$errs" -ne 0 ]; then
            fail "$what: exit 0 with a message but no note of the CPU:"
            head -n 3 "$dir/err"
        fi
        if [ "$errs" -gt 1 ]; then
            fail "$what: $errs messages on stderr"
            head -n 3 "$dir/err"
        fi
        ;;
    *)
        if [ "$rc" -eq 0 ] && [ "$errs" -ne 0 ]; then
            fail "$what: exit 0 with a message:"
            head -n 3 "$dir/err"
        fi
        if [ "$name" = resume ]; then   # the session is still there to go on with
            HOME="$dir" XDG_DATA_HOME="$dir" timeout 120 "$K" ask -m "$llama" --device cuda -c -q "And item 7?" -n 4 \
                > "$dir/out2" 2>&1 || {
                fail "$what: the session could not be resumed after the failure:"
                head -n 3 "$dir/out2"
            }
        fi
        ;;
    esac
}

# one DIR SCENARIO KIND N: a run failing call N of KIND, judged (the verdict in DIR/verdict)
one() {
    local dir=$1
    new_home "$dir"
    run_in "$dir" "$2" KVCHAT_STANDIN_FAIL="$3:$4" KVCHAT_STANDIN_REPORT="$dir/report"
    (
        fails=0
        judge "$@"
        exit $((fails > 0))
    ) > "$dir/verdict" 2>&1
}

# The CPU's own answer, for --device auto's fallbacks.
mkdir -p "$work/cpu"
if ! HOME="$work/cpu" XDG_DATA_HOME="$work/cpu" timeout 120 "$K" ask -m "$gemma" --device cpu -d "$short" \
    -q "Which box holds item 5?" -n 8 > "$work/cpu/out" 2> "$work/cpu/err"; then
    fail "the CPU's own answer (for --device auto's fallbacks) could not be had:"
    head -n 3 "$work/cpu/err"
fi
grep -v '^policy ' "$work/cpu/out" > "$work/cpu_answer"

total_sites=0
for name in $scenarios; do
    rm -rf "$work/saved"
    if [ "$name" = resume ]; then   # a session saved under another policy, restored by every run
        mkdir -p "$work/saved"
        HOME="$work/saved" XDG_DATA_HOME="$work/saved" timeout 120 "$K" ask -m "$llama" --device cuda -d "$doc" \
            -q "Which box holds item 5?" -n 8 --session faults --policy quest --budget 0.3 --page-size 16 \
            > "$work/saved.out" 2>&1 || { fail "resume: the session could not be saved"; cat "$work/saved.out"; continue; }
    fi
    clean=$work/clean-$name
    new_home "$clean"
    run_in "$clean" "$name" KVCHAT_STANDIN_SITES="$clean/sites" KVCHAT_STANDIN_REPORT="$clean/report"
    if [ "$(cat "$clean/rc")" -ne 0 ] || [ ! -s "$clean/sites" ] || grep -q '^kvchat: ' "$clean/err"; then
        fail "$name: the run without a failure did not succeed (exit $(cat "$clean/rc"))"
        head -n 20 "$clean/err"
        continue
    fi
    awk '{ print $1 }' "$clean/err" | sort -u > "$clean/err_kinds"
    # the calls to fail: each place's first and last, or every call
    if [ -n "$every" ]; then
        awk '$1 == "count" { for (i = 1; i <= $3; i++) print $2, i }' "$clean/report"
    else
        awk '$1 == "site" { print $2, $4; if ($5 != $4) print $2, $5 }' "$clean/sites"
    fi | sort -u > "$work/calls"
    total_sites=$((total_sites + $(grep -c '^site' "$clean/sites")))
    i=0
    while read -r kind n; do
        i=$((i + 1))
        while [ "$(jobs -rp | wc -l)" -ge "$jobs_at_once" ]; do wait -n; done
        one "$work/$name-$i" "$name" "$kind" "$n" < /dev/null &
        runs=$((runs + 1))
    done < "$work/calls"
    wait
    for v in "$work/$name"-*/verdict; do
        [ -e "$v" ] || continue
        if [ -s "$v" ]; then
            grep -v '^standin_faults: skipped' "$v"
            fails=$((fails + $(grep -c '^standin_faults: FAILED' "$v")))
            skipped=$((skipped + $(grep -c '^standin_faults: skipped' "$v")))
        fi
        rm -rf "$(dirname "$v")"
    done
done

# A failure the stand-in cannot give is refused at load, not ignored.
runs=$((runs + 1))
if KVCHAT_STANDIN_FAIL=free:3 timeout 120 "$K" info --device cuda > "$work/out" 2>&1 || ! grep -q 'KVCHAT_STANDIN_FAIL=free:3 is not' "$work/out"; then
    fail "a failure the stand-in does not know was not refused"
    head -n 3 "$work/out"
fi

# Too little GPU memory: the weights refused naming what did not fit, or the CPU used instead.
mkdir -p "$work/small"
runs=$((runs + 2))
HOME="$work/small" XDG_DATA_HOME="$work/small" KVCHAT_STANDIN_MEMORY=1 timeout 120 "$K" ask -m "$llama" --device cuda \
    -d "$doc" -q "Hello?" -n 2 > "$work/small/out" 2>&1
rc=$?
if [ "$rc" -ne 1 ] || [ "$(grep -c . "$work/small/out")" -ne 1 ] || ! grep -q '^kvchat: out of GPU memory: a .* weight needs' "$work/small/out"; then
    fail "a GPU too small for the weights: not one line naming the weight (exit $rc)"
    head -n 5 "$work/small/out"
fi
HOME="$work/small" XDG_DATA_HOME="$work/small" KVCHAT_STANDIN_MEMORY=1 timeout 120 "$K" ask -m "$llama" --device auto \
    -d "$doc" -q "Hello?" -n 2 > "$work/small/out" 2> "$work/small/err"
rc=$?
if [ "$rc" -ne 0 ] || ! grep -q 'note: the GPU was not used (out of GPU memory' "$work/small/err"; then
    fail "a GPU too small for the weights under --device auto: not run on the CPU with a note (exit $rc)"
    head -n 5 "$work/small/err"
fi

# The interface in a real terminal (tmux): out of GPU memory and a fault in the middle of a
# conversation (tests/tui/gpu_failure.sh).
runs=$((runs + 1))
if ! bash tests/tui/gpu_failure.sh "$K" "$SI" "$gemma" "$TD/prompts/p2.txt"; then
    fail "the interface when the GPU fails (tests/tui/gpu_failure.sh, its output above)"
fi

if [ $((skipped * 20)) -gt "$runs" ]; then
    fail "$skipped of $runs runs did not make the call they were to fail (more than 1 in 20): the sweep tests little"
fi
echo "standin_faults: $runs runs of $(basename "$K") over the stand-in CUDA runtime (failures at the first and last call of $total_sites places; $skipped never made that call), $fails failed"
[ "$fails" -eq 0 ]
