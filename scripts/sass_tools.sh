#!/usr/bin/env bash
# sass_tools.sh - prints a folder holding cuobjdump and nvdisasm (CUDA's disassembler, which
# check_sass_loads.sh reads the GPU's code with): CUDA_HOME's bin when it has both, else CUDA's own
# wheels from the package index (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm: 5.5 MB), installed
# once into the project's private Python environment (the one scripts/fetch_model.sh makes), never
# the system's. Exit 1 with a line saying why when neither can be had.
set -euo pipefail
cuda=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")}
if [[ -x "$cuda/bin/cuobjdump" && -x "$cuda/bin/nvdisasm" ]]; then
  echo "$cuda/bin"
  exit 0
fi
cache=${KVCHAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvchat}
venv="$cache/pyenv"
version=13.5.37
# where the wheels put their programs: the environment's site-packages, nvidia/cu13/bin
find_bin() {
  local d
  for d in "$venv"/lib/python3*/site-packages/nvidia/cu13/bin; do
    [[ -x "$d/cuobjdump" && -x "$d/nvdisasm" ]] && { echo "$d"; return 0; }
  done
  return 1
}
if find_bin; then exit 0; fi
if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv" >&2 || { echo "sass_tools: cannot make a Python environment in $venv" >&2; exit 1; }
fi
if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  "$venv/bin/python" -m ensurepip >&2 ||
    { echo "sass_tools: $venv has no pip and ensurepip cannot add it (Debian: python3-venv)" >&2; exit 1; }
fi
echo "kvchat: installing CUDA's disassembler (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm $version) into $venv" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --timeout 30 --retries 2 \
  "nvidia-cuda-cuobjdump==$version" "nvidia-cuda-nvdisasm==$version" >&2 ||
  { echo "sass_tools: cannot install CUDA's disassembler from the package index (offline? KVCHAT_SASS_CHECK=0 skips the check that needs it)" >&2; exit 1; }
find_bin || { echo "sass_tools: the disassembler's wheels hold no cuobjdump and nvdisasm" >&2; exit 1; }
