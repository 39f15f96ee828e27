#!/usr/bin/env bash
# run-device.sh [NVCC] - which build `make run` runs: prints "cuda" when the CUDA compiler (NVCC,
# default nvcc, as the Makefile names it) is installed and an NVIDIA GPU is present, "cpu"
# otherwise. A line on standard error says what was found when there is a GPU: the build chosen, or
# what is missing for the other. The GPU is what `nvidia-smi -L` lists (given 10 s: a wedged driver
# must not hang make run); without nvidia-smi, what the driver lists in /proc/driver/nvidia/gpus.
# The CUDA build's kvchat still checks at start that the device works (--device auto falls back to
# the CPU, saying why), so a driver that lists a GPU it cannot run costs a build, never a failure.
set -uo pipefail
nvcc=${1:-nvcc}

gpu=""
if command -v nvidia-smi >/dev/null 2>&1; then
    # "GPU 0: NVIDIA H200 (UUID: GPU-...)": the name of the first
    gpu=$(timeout 10 nvidia-smi -L 2>/dev/null | sed -nE 's/^GPU [0-9]+: (.*) \(UUID.*/\1/p; s/^GPU [0-9]+: ([^(]*)$/\1/p' |
          head -1)
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
elif ! command -v "$nvcc" >/dev/null 2>&1; then
    echo "make run: $gpu is present but $nvcc is not installed: the CPU build (the CUDA toolkit gives the GPU build)" >&2
    echo cpu
else
    echo "make run: $gpu and $nvcc found: the CUDA build, build-cuda/kvchat (make run CUDA=0: the CPU build)" >&2
    echo cuda
fi
