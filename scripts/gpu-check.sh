#!/usr/bin/env bash
# gpu-check.sh OUTDIR - the CUDA backend checked and measured on a GPU machine in one command, from
# a pack of binaries built elsewhere (scripts/gpu-pack.sh; this script sits in the pack). First what
# can fail, then what is measured:
#   1. the machine (nvidia-smi) and whether kvchat starts;
#   2. gpu_tests (every GPU test against the CPU backend; the pack's tiny models);
#   3. compute-sanitizer memcheck over the attention, element-wise and decode-product tests;
#   4. gpu_bench: products per weight type at 7B shapes, attention at 512 / 8K / 32K, against a
#      device-to-device copy;
#   5. kvchat bench on a model of the default model's shape (gen-model, the default model's
#      vocabulary from the pack): the GPU, the GPU with every product through cuBLAS
#      (KVCHAT_CUDA_MMV=0), and the CPU on every core, one after the other;
#   6. kvchat bench on Mistral-7B-shaped f16 and Q4_K_M models written there.
# Every step runs under its own timeout, cut to what is left of the whole budget (GPU_CHECK_BUDGET
# seconds, default 480), and its result is written as it comes: OUTDIR/summary.md (markdown),
# OUTDIR/results.csv (kvchat bench's rows), OUTDIR/kernels.csv (gpu_bench's rows), OUTDIR/log.txt
# (every step's whole output). A step that fails or runs out of time is recorded and the next one
# runs. Exit status: 0 when every step passed, 1 otherwise.
set -uo pipefail
if [ $# -ne 1 ]; then
    echo "usage: gpu-check.sh OUTDIR" >&2
    exit 2
fi
out=$1
pack=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out" || exit 2
export LD_LIBRARY_PATH="$pack/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KVCHAT_TESTDATA="$pack/testdata"
KVCHAT_COMMIT=$(cut -c1-40 "$pack/COMMIT" 2>/dev/null || echo unknown)
export KVCHAT_COMMIT   # kvchat bench's rows name the pack's commit, not the copy's git state
kv="$pack/kvchat"
summary="$out/summary.md"
log="$out/log.txt"
budget=${GPU_CHECK_BUDGET:-480}
start=$(date +%s)
tmp=$(mktemp -d /tmp/gpu-check.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
threads=$(nproc)
failures=0

say() { printf '%s\n' "$*" >>"$summary"; }
left() { echo $((budget - ($(date +%s) - start))); }

# step NAME TIMEOUT CMD...: run CMD with its output in log.txt and in $tmp/last; records the result
step() {
    local name=$1 limit=$2
    shift 2
    local rem
    rem=$(left)
    [ "$limit" -gt "$rem" ] && limit=$rem
    if [ "$limit" -lt 5 ]; then
        say "- **$name**: skipped (the check's ${budget} s were spent)"
        failures=$((failures + 1))
        return 1
    fi
    local t0 rc
    t0=$(date +%s)
    printf '\n===== %s (timeout %s s) =====\n$ %s\n' "$name" "$limit" "$*" >>"$log"
    timeout --kill-after=5 "$limit" "$@" >"$tmp/last" 2>&1
    rc=$?
    cat "$tmp/last" >>"$log"
    local took=$(($(date +%s) - t0))
    if [ $rc -eq 0 ]; then
        say "- **$name**: passed in ${took} s"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        say "- **$name**: TIMED OUT after ${took} s (limit ${limit} s)"
        failures=$((failures + 1))
    else
        say "- **$name**: FAILED (exit $rc) in ${took} s; last lines:"
        say '```'
        tail -n 15 "$tmp/last" >>"$summary"
        say '```'
        failures=$((failures + 1))
    fi
    return $rc
}

# the table kvchat bench printed (its "depth" header and the rows after it)
bench_table() {
    awk '/depth +prefill tok\/s/ { on = 1 } on && NF { print "    " $0 } /^peak RSS/ { on = 0 }' "$tmp/last" >>"$summary"
}

: >"$log"
{
    echo "# GPU check, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "Pack: $(cat "$pack/COMMIT" 2>/dev/null || echo 'commit unknown'); $(nproc) cores; budget ${budget} s."
    echo
} >"$summary"

# 1. the machine
say "## Machine"
if nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$tmp/smi" 2>&1; then
    say "- GPU: $(cat "$tmp/smi")"
else
    say "- nvidia-smi failed: $(head -c 300 "$tmp/smi")"
fi
say ""
say "## Checks"
tiny=("$pack"/testdata/tiny/*.gguf)
step "kvchat starts" 20 "$kv" info -m "${tiny[0]}"

# 2. the GPU tests
# (a tiny model the pack lacks is skipped with a warning, listed below; criterion would make any
# warning a non-zero exit)
step "gpu_tests" 240 "$pack/gpu_tests" -j1 --ignore-warnings
grep -E 'Synthesis|\[FAIL\]|skipped' "$tmp/last" | head -n 20 | sed 's/^/    /' >>"$summary"

# 3. memcheck
if command -v compute-sanitizer >/dev/null 2>&1; then
    step "compute-sanitizer memcheck (attention, element-wise, decode products)" 120 \
        compute-sanitizer --tool memcheck --error-exitcode 3 "$pack/gpu_tests" -j1 --ignore-warnings \
        --filter 'cuda/@(paged_attention*|attention_with*|element_wise*|norm_weights*|the_decode_kernel*|device_page_copies*)'
    grep -E 'ERROR SUMMARY|Synthesis' "$tmp/last" | sed 's/^/    /' >>"$summary"
else
    say "- compute-sanitizer: not installed here"
fi

# 4. the kernel micro-benchmark
say ""
say "## Kernels (gpu_bench)"
say ""
step "gpu_bench" 180 "$pack/gpu_bench" --csv "$out/kernels.csv" && grep '^|\|^device' "$tmp/last" >>"$summary"

# 5. the default model's shape
say ""
say "## kvchat bench, the default model's shape (Gemma 3 270M, Q4_K_M, random weights)"
say ""
gm="$tmp/gemma3-270m-q4_k_m.gguf"
if [ -f "$pack/gemma-vocab.gguf" ] &&
    step "gen-model gemma3-270m q4_k_m" 60 "$kv" gen-model --shape gemma3-270m --type q4_k_m --vocab "$pack/gemma-vocab.gguf" \
        -o "$gm" -t "$threads"; then
    for run in cuda cuda-cublas cpu; do
        case $run in
        cuda) env=() dev=(--device cuda) ;;
        cuda-cublas) env=(KVCHAT_CUDA_MMV=0) dev=(--device cuda) ;;
        cpu) env=() dev=(--device cpu -t "$threads") ;;
        esac
        if step "bench $run" 120 env "${env[@]}" "$kv" bench -m "$gm" "${dev[@]}" --ctx 512,2048,8192 --gen 32 \
            --csv "$out/results.csv"; then
            say "  $run:"
            bench_table
        fi
    done
    rm -f "$gm"
else
    say "- no gemma-vocab.gguf in the pack: skipped"
fi

# 6. Mistral 7B's shape, f16 and Q4_K_M
for type in q4_k_m f16; do
    say ""
    say "## kvchat bench, Mistral-7B shape, $type (random weights)"
    say ""
    m="$tmp/mistral-7b-$type.gguf"
    need=$([ $type = f16 ] && echo 16 || echo 6)
    free_gb=$(df -BG --output=avail /tmp | tail -1 | tr -dc 0-9)
    if [ "${free_gb:-0}" -lt "$need" ]; then
        say "- only ${free_gb} GB free in /tmp, $need needed: skipped"
        continue
    fi
    if step "gen-model mistral-7b $type" 150 "$kv" gen-model --shape mistral-7b --type $type \
        --vocab "$pack/testdata/vocab/llama-spm.gguf" -o "$m" -t "$threads"; then
        step "bench mistral-7b $type" 150 "$kv" bench -m "$m" --device cuda --ctx 512,2048 --gen 16 \
            --csv "$out/results.csv" && bench_table
    fi
    rm -f "$m"
done

say ""
say "## Peer (llama.cpp CUDA, flash attention; measured on another H100 80GB HBM3 on 2026-11-24, commit d32676d)"
say ""
say "| model | figure | llama.cpp tok/s |"
say "| --- | --- | --- |"
say "| default Gemma 3 270M Q4_K_M | prefill 512 / 2048 / 8192 | 56087 / 58765 / 50464 |"
say "| default | decode at depth 0 / 2048 / 8192 | 957 / 866 / 879 |"
say "| Mistral-7B-shaped f16 | prefill 512 / 2048 / 8192 | 15448 / 20896 / 18636 |"
say "| same | decode at depth 512 / 2048 / 8192 / 32768 | 171.7 / 166.8 / 159.5 / 126.3 |"
say "| same, Q4_K_M | prefill 512 / 8192 | 9506 / 9360 |"
say "| same, Q4_K_M | decode at depth 0 / 8192 | 267 / 228 |"
say ""
say "Done in $(($(date +%s) - start)) s; $failures step(s) failed, timed out or skipped."
[ $failures -eq 0 ]
