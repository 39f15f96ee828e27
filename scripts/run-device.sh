#!/usr/bin/env bash
# run-device.sh [NVCC] - which build `make run` runs: prints "cuda" when the CUDA compiler (NVCC,
# default nvcc, as the Makefile names it) is installed and an NVIDIA GPU the CUDA build has code for
# is present, "cpu" otherwise. A line on standard error says what was found when there is a GPU: the
# build chosen, or what keeps it from the other.
# The GPU is what `nvidia-smi -L` lists (given 10 s: a wedged driver must not hang make run);
# without nvidia-smi, what the driver lists in /proc/driver/nvidia/gpus. A GPU older than compute
# capability 8.0 (the build's lowest -gencode, sm_80) is left to the CPU where nvidia-smi can say;
# so is every GPU when CUDA_VISIBLE_DEVICES hides them ("" or -1). The CUDA build's kvchat checks
# again at start that its device works (--device auto runs on the CPU and says why), so a GPU this
# script misjudges costs a build, never a failure.
set -uo pipefail
nvcc=${1:-nvcc}

gpu="" cc=""
if command -v nvidia-smi >/dev/null 2>&1; then
    # "GPU 0: NVIDIA H200 (UUID: GPU-...)": the name of the first
    gpu=$(timeout 10 nvidia-smi -L 2>/dev/null | sed -nE 's/^GPU [0-9]+: (.*) \(UUID.*/\1/p; s/^GPU [0-9]+: ([^(]*)$/\1/p' |
          head -1)
    # "9.0" (drivers before 510 cannot say: then nothing is assumed)
    [ -n "$gpu" ] && cc=$(timeout 10 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 |
                          grep -E '^[0-9]+\.[0-9]+$')
elif [ -d /proc/driver/nvidia/gpus ]; then
    for info in /proc/driver/nvidia/gpus/*/information; do
        [ -r "$info" ] || continue
        gpu=$(sed -nE 's/^Model:[[:space:]]+(.*)/\1/p' "$info" | head -1)
        [ -n "$gpu" ] || gpu="an NVIDIA GPU"
        break
    done
fi
# the driver's text goes to a terminal: printable ASCII only
gpu=$(printf '%s' "$gpu" | LC_ALL=C tr -c '[:print:]' '?')

if [ -z "$gpu" ]; then
    echo cpu
elif [ "${CUDA_VISIBLE_DEVICES+set}" = set ] && { [ -z "$CUDA_VISIBLE_DEVICES" ] || [ "${CUDA_VISIBLE_DEVICES#-1}" != "$CUDA_VISIBLE_DEVICES" ]; }; then
    echo "make run: CUDA_VISIBLE_DEVICES='$CUDA_VISIBLE_DEVICES' hides $gpu: the CPU build" >&2
    echo cpu
elif [ -n "$cc" ] && [ "${cc%%.*}" -lt 8 ]; then
    echo "make run: $gpu has compute capability $cc, older than the CUDA build's 8.0: the CPU build" >&2
    echo cpu
elif ! command -v "$nvcc" >/dev/null 2>&1; then
    echo "make run: $gpu is present but $nvcc is not installed: the CPU build (the CUDA toolkit gives the GPU build)" >&2
    echo cpu
else
    echo "make run: $gpu and $nvcc found: the CUDA build, build-cuda/kvchat (make run CUDA=0: the CPU build)" >&2
    echo cuda
fi
