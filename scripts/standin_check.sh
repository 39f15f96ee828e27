#!/usr/bin/env bash
# standin_check.sh KVCHAT STANDIN_DIR - the CUDA backend's host code run without a GPU.
#
# KVCHAT is a CUDA build of kvchat (make test gives one built with ASan and UBSan), STANDIN_DIR the
# stand-in CUDA runtime and cuBLAS (bench/standin/), put first on LD_LIBRARY_PATH: every call into
# the runtime is answered at once and no kernel runs, so what the device computes is meaningless
# (zeros), but every line of host code a GPU run goes through runs: the backend's bookkeeping, page
# tables, upload batches, policies' device paths, graphs, batches, snapshots placed on the device.
# On the tiny models (../shared/testdata/tiny), each of these must succeed, and under the
# sanitizers any memory error, leak or undefined behaviour fails it:
#   - gpu_bench (from beside KVCHAT: tests/gpu_bench), whole and --profile;
#   - the device as the backend probes it (kvchat info);
#   - every policy, prefill and decode, two depths, pages of 16 tokens, each decode-time policy
#     swapped in after the one before in one forward context (a swap from SentKV to Quest once
#     counted Quest's steps through SentKV's freed choice: found here);
#   - decode steps recorded as graphs (KVCHAT_CUDA_GRAPH=on), batches of forks (--seqs),
#     /compare's batch (--compare), the snapshot bench (a restore placed on the device);
#   - a session saved and resumed under other policies, a chat of several turns;
# and the census the stand-in keeps of the calls it answered (KVCHAT_STANDIN_REPORT) shows a decode
# step recorded as graphs launching the same kernels, as many times, as a step launched directly,
# and none directly, and copying up to the device only its token's embedding row (its layers'
# upload batches and its positions in their launches' parameters; a copy a layer with
# KVCHAT_CUDA_INLINE=off). Prints a line per failure and a summary; exit 1 if anything failed.
set -u
if [ $# -ne 2 ]; then
    echo "usage: scripts/standin_check.sh KVCHAT STANDIN_DIR" >&2
    exit 2
fi
K=$1
SI=$2
who=standin_check
. "$(dirname "$0")/standin_env.sh" ../shared/testdata/tiny/tiny-llama-q4_k_m.gguf

fails=0
runs=0
# run WHAT COMMAND...: the command must exit 0; its output is kept in $work/out
run() {
    local what=$1
    shift
    runs=$((runs + 1))
    timeout 300 "$@" > "$work/out" 2>&1
    local rc=$?
    [ "$rc" -eq 0 ] && return 0
    echo "standin_check: FAILED: $what (exit $rc): $*"
    grep -v '^  0x\|^Shadow byte legend\|^  [A-Z][a-zA-Z ]*: ' "$work/out" | tail -n 30   # ASan's shadow map left out
    fails=$((fails + 1))
    return 1
}
fail() {
    echo "standin_check: FAILED: $*"
    fails=$((fails + 1))
}

tiny="$TD/tiny/tiny-llama-q4_k_m.gguf $TD/tiny/tiny-gemma3-q4_k_m.gguf $TD/tiny/tiny-llama-f16.gguf $TD/tiny/tiny-gemma3-f16.gguf"
llama=$TD/tiny/tiny-llama-q4_k_m.gguf
gemma=$TD/tiny/tiny-gemma3-q4_k_m.gguf
every="full,streaming,quest,chess:budget=0.5,sentkv,take,laser,chelsea,snapkv,h2o"
decode_time="full,streaming,quest,sentkv,chess:budget=0.5"

# the kernel micro-benchmark beside KVCHAT (its rows' names, its flow; no figure means anything
# here): what gpu-check.sh runs on a GPU must not stop on the host's side (a config name with a
# comma once stopped it there, its attention rows unmeasured)
gb="$(dirname "$K")/tests/gpu_bench"
if [ -x "$gb" ]; then
    run "gpu_bench" "$gb" --csv "$work/kernels.csv"
    run "gpu_bench --profile" "$gb" --profile
else
    fail "$gb is missing (make cuda-asan-build builds it)"
fi

if run "info" "$K" info -m "$llama" --device cuda && ! grep -q 'stand-in' "$work/out"; then
    fail "kvchat info does not name the stand-in device"
    cat "$work/out"
fi

for m in $tiny; do
    run "every policy on $(basename "$m")" "$K" bench -m "$m" --device cuda --ctx 300,700 --gen 12 \
        --policy "$every" --budget 0.3 --page-size 16 --no-csv
    run "graphs on $(basename "$m")" env KVCHAT_CUDA_GRAPH=on "$K" bench -m "$m" --device cuda --ctx 300 \
        --gen 12 --policy "$decode_time,h2o" --budget 0.3 --no-csv
done
# the older paths the settings keep, to compare: Quest's choice in three launches, summaries and
# evicted pages sent up from the host, a product's reads in flight set for every type, and decode
# attention's rows a round (8, joined calls' too under /compare)
run "the paths kept to compare" env KVCHAT_CUDA_BOUNDS=split KVCHAT_CUDA_PAGE_ROWS=0 KVCHAT_CUDA_MMV_INFLIGHT=4 \
    KVCHAT_CUDA_ATTN_ROWS=8 "$K" bench -m "$llama" --device cuda --ctx 300 --gen 12 --policy quest,sentkv,h2o \
    --budget 0.3 --page-size 16 --no-csv
run "joined attention with 8 rows a round" env KVCHAT_CUDA_ATTN_ROWS=8 "$K" bench -m "$llama" --device cuda \
    --ctx 300 --gen 6 --compare --policy full,quest --budget 0.3 --no-csv
for bad in KVCHAT_CUDA_BOUNDS=both KVCHAT_CUDA_MMV_INFLIGHT=3 KVCHAT_CUDA_ATTN_ROWS=3; do
    if env "$bad" "$K" bench -m "$llama" --device cuda --ctx 64 --gen 2 --no-csv > "$work/out" 2>&1 ||
        ! grep -q "${bad%%=*} must be" "$work/out"; then
        fail "a bad ${bad%%=*} was not refused with its message"
    fi
done
run "a batch of forks" "$K" bench -m "$gemma" --device cuda --ctx 300 --gen 6 --seqs 3 --policy "$decode_time" \
    --budget 0.3 --no-csv
run "a batch of forks under graphs" env KVCHAT_CUDA_GRAPH=on "$K" bench -m "$llama" --device cuda --ctx 300 \
    --gen 6 --seqs 4 --policy "$decode_time" --budget 0.3 --no-csv
run "/compare's batch" "$K" bench -m "$llama" --device cuda --ctx 400 --gen 6 --compare \
    --policy full,quest,sentkv,streaming --budget 0.3 --no-csv
run "the snapshot bench" "$K" bench -m "$gemma" --device cuda --ctx 700 --gen 4 --snapshot --no-csv

# a session saved, then resumed under other policies (its snapshot restored and placed on the device)
doc=$work/doc.txt
for i in $(seq 1 120); do echo "Line $i of the document says that item $i is kept in box $((i * 7 % 13))."; done > "$doc"
run "a session saved" "$K" ask -m "$llama" --device cuda -d "$doc" -q "Which box holds item 5?" -n 8 \
    --session standin --policy chess:budget=0.5
for p in quest sentkv take+chess h2o; do
    run "the session resumed under $p" "$K" ask -m "$llama" --device cuda -c -q "And item 9?" -n 8 \
        --policy "$p" --budget 0.3
done
# a conversation of several turns
printf '%s\n' "Which box holds item 3?" "And item 4?" "And item 6?" "/quit" > "$work/chat.txt"
run "a chat of three turns" "$K" chat -m "$gemma" --device cuda -n 6 < "$work/chat.txt"

# The census: a decode step's share is the difference of two runs that differ only in the steps.
census() {   # census NAME GEN [ENV...]: the report of a 300-token prefill and GEN steps under full
    local name=$1 gen=$2
    shift 2
    run "census $name" env "$@" KVCHAT_STANDIN_REPORT="$work/$name.txt" "$K" bench -m "$llama" --device cuda \
        --ctx 300 --gen "$gen" --no-csv
}
census d8 8 KVCHAT_CUDA_GRAPH=off
census d24 24 KVCHAT_CUDA_GRAPH=off
census g8 8 KVCHAT_CUDA_GRAPH=on
census g24 24 KVCHAT_CUDA_GRAPH=on
per_step() {   # per_step KIND A B: "KERNEL COUNT" a step, of the lines of kind KIND in B less those in A
    awk -v steps=16 -f bench/standin/census_step.awk "$work/$2.txt" "$work/$3.txt" |
        awk -v kind="$1" '$1 == kind { print $2, $3 }' | sort
}
if [ -s "$work/d24.txt" ] && [ -s "$work/g24.txt" ]; then
    per_step launch d8 d24 > "$work/direct_off"
    per_step recorded g8 g24 > "$work/recorded_on"
    per_step launch g8 g24 > "$work/direct_on"
    if [ ! -s "$work/direct_off" ]; then
        fail "the census counted no kernel launched in a decode step"
    elif ! cmp -s "$work/direct_off" "$work/recorded_on"; then
        fail "a decode step recorded as graphs launches other kernels than one launched directly (kernel, launches a step: direct, then recorded)"
        diff "$work/direct_off" "$work/recorded_on" | head -n 20
    fi
    if [ -s "$work/direct_on" ]; then
        fail "a decode step recorded as graphs still launches kernels directly:"
        head -n 20 "$work/direct_on"
    fi
    # a layer's upload batch rides in its scatter launch, the step's token and positions in theirs:
    # a decode step copies up only its token's embedding row, which this model (its output weight
    # apart from its embedding) has the host gather (KVCHAT_CUDA_INLINE=off: a copy a layer and more)
    for c in d g; do
        up=$(per_step call ${c}8 ${c}24 | awk '$1 == "copy_up" { print $2 }')
        if awk -v u="${up:-0}" 'BEGIN { exit !(u > 1) }'; then
            fail "a decode step (graphs $([ $c = g ] && echo on || echo off)) copies ${up} times up to the device, more than its embedding row"
        fi
    done
    census i8 8 KVCHAT_CUDA_GRAPH=off KVCHAT_CUDA_INLINE=off
    census i24 24 KVCHAT_CUDA_GRAPH=off KVCHAT_CUDA_INLINE=off
    up_off=$(per_step call i8 i24 | awk '$1 == "copy_up" { print $2 }')
    layers=$("$K" info -m "$llama" 2>/dev/null | awk '$1 == "layers" { print $2; exit }')
    if ! awk -v u="${up_off:-0}" -v l="${layers:-0}" 'BEGIN { exit !(l > 0 && u >= l) }'; then
        fail "with KVCHAT_CUDA_INLINE=off a decode step copies ${up_off:-no} times up, not one a layer or more (${layers:-?} layers)"
    fi
else
    fail "the stand-in wrote no census (KVCHAT_STANDIN_REPORT)"
fi

echo "standin_check: $runs runs of $(basename "$K") over the stand-in CUDA runtime, $fails failed"
[ "$fails" -eq 0 ]
