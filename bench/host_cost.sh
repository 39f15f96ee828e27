#!/usr/bin/env bash
# host_cost.sh KVCHAT STANDIN_DIR MODEL [DEPTH ...] - a decode step's host work on the CUDA backend,
# timed and counted without a GPU (make bench-host-cost).
#
# KVCHAT is a CUDA build of kvchat, STANDIN_DIR the stand-in CUDA runtime and cuBLAS
# (bench/standin/), which answer every call at once and run no kernel. For each depth (default 2048
# 8192), with decode steps launched directly and recorded as graphs (KVCHAT_CUDA_GRAPH=on):
#   host us     a decode step's time with no device to wait for: the engine's and the backend's
#               own host work, without the real runtime's cost per call (a few microseconds a
#               launch or copy on a GPU machine) or any device time; a step's share of a run of
#               1,056 steps less one of 32 (the first steps' one-off costs, which double the
#               average of a short run, left out);
#   calls       what a decode step asks of the runtime, from the stand-in's census
#               (KVCHAT_STANDIN_REPORT) of the same two runs, the longer less the shorter: kernels launched
#               directly and recorded into graphs, copies (and of them, those host to device: up), memsets, waits (stream and event
#               synchronizations), graph launches and recordings;
# then the kernels a step launches (graphs off, at the first depth), and the op profiler's table
# (KVCHAT_PROFILE=1) of the host time in each op at the first depth. Nothing is written but stdout.
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: bench/host_cost.sh KVCHAT STANDIN_DIR MODEL [DEPTH ...]" >&2
    exit 2
fi
K=$1
SI=$2
M=$3
shift 3
depths=${*:-2048 8192}
case $SI in /*) ;; *) SI=$PWD/$SI ;; esac
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export LD_LIBRARY_PATH="$SI${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset KVCHAT_STANDIN_REPORT KVCHAT_PROFILE

short=32 long=1056
steps=$((long - short))
# bench NAME DEPTH GEN GRAPH: kvchat bench's decode tok/s; then the run again with the census
# (counting slows the calls a little, so the times come from the run without it) in $work/NAME.txt
bench() {
    KVCHAT_CUDA_GRAPH=$4 "$K" bench -m "$M" --device cuda --ctx "$2" --gen "$3" --no-csv > "$work/$1.out" 2>&1 ||
        { cat "$work/$1.out" >&2; exit 1; }
    KVCHAT_CUDA_GRAPH=$4 KVCHAT_STANDIN_REPORT="$work/$1.txt" "$K" bench -m "$M" --device cuda --ctx "$2" \
        --gen "$3" --no-csv > /dev/null 2>&1 || { echo "host_cost: the census run failed" >&2; exit 1; }
    awk -v d="$2" '$1 == d && $3 + 0 > 0 { print $3 }' "$work/$1.out"
}
# per_step A B: every census line's count a step ("KIND NAME COUNT"), B less A
per_step() {
    awk -v steps=$steps -f "$here/standin/census_step.awk" "$work/$1.txt" "$work/$2.txt"
}
# sum KIND [NAME ...] < per_step: the count a step of those lines
sum() {
    awk -v kind="$1" -v names=" ${*:2} " '$1 == kind && (names == "  " || index(names, " " $2 " ")) { s += $3 }
        END { printf "%g", s + 0 }'
}

rev=$("$K" --version 2>/dev/null | head -n 1)
echo "kvchat's host work a decode step on the CUDA backend, over the stand-in runtime (no GPU, no kernel run)"
echo "model $(basename "$M"); $rev; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) threads"
echo
printf '%6s %7s %9s %9s %9s %7s %4s %8s %6s %7s %9s\n' depth graphs "host us" launched recorded copies up memsets waits "graph" recordings
for d in $depths; do
    for g in off on; do
        ts=$(bench "s$d$g" "$d" $short $g)
        tl=$(bench "l$d$g" "$d" $long $g)
        per_step "s$d$g" "l$d$g" > "$work/p$d$g"
        us=$(awk -v ts="$ts" -v tl="$tl" -v s=$short -v l=$long 'BEGIN { print 1e6 * (l / tl - s / ts) / (l - s) }')
        printf '%6s %7s %9.1f %9s %9s %7s %4s %8s %6s %7s %9s\n' "$d" "$g" "$us" \
            "$(sum launch < "$work/p$d$g")" "$(sum recorded < "$work/p$d$g")" \
            "$(sum call cudaMemcpyAsync cudaMemcpy2DAsync < "$work/p$d$g")" "$(sum call copy_up < "$work/p$d$g")" \
            "$(sum call cudaMemsetAsync < "$work/p$d$g")" \
            "$(sum call cudaStreamSynchronize cudaEventSynchronize < "$work/p$d$g")" \
            "$(sum call cudaGraphLaunch < "$work/p$d$g")" "$(sum call cudaStreamBeginCapture < "$work/p$d$g")"
    done
done
first=${depths%% *}
echo
echo "kernels a decode step launches at $first (graphs off), launches a step:"
awk '$1 == "launch" { print $3, $2 }' "$work/p${first}off" | sort -k1,1nr -k2 |
    { if command -v c++filt > /dev/null; then c++filt; else cat; fi; } | sed 's/(.*//; s/^/  /'
echo
echo "the op profile at $first over $long steps (KVCHAT_PROFILE=1; host time in each op):"
KVCHAT_PROFILE=1 "$K" bench -m "$M" --device cuda --ctx "$first" --gen $long --no-csv 2>&1 |
    sed -n '/^kvchat profile/,/^between ops/p'
