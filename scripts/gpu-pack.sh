#!/usr/bin/env bash
# gpu-pack.sh DIR - what scripts/gpu-check.sh needs on a GPU machine that has the CUDA toolkit but
# none of kvchat's other libraries, gathered into DIR inside the repository (so that it travels with
# the working tree; DIR is added to .git/info/exclude): the CUDA build's kvchat, gpu_tests and
# gpu_bench without their debug sections, the shared libraries they load that such a machine lacks
# (everything outside the C and C++ runtimes and CUDA's own), the tiny test models that fit, the
# Llama vocabulary, the default model's vocabulary (gen-model --vocab-only, 6.2 MiB: the model
# itself is too large to travel), gpu-check.sh and gpu-figures.sh. The binaries, the libraries and
# the vocabulary travel as DIR/payload.tar.gz (gzip, which every image has: 26 MiB become 10, room
# for both tiny q4_k_m models), which gpu-check.sh unpacks into its temporary folder. Run `make
# cuda-build` first. Refuses a DIR that exists and is not an earlier pack; fails when the pack would
# pass LIMIT_MIB (default 56: a call carries at most 64 MiB with the repository's own files).
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: scripts/gpu-pack.sh DIR" >&2
    exit 2
fi
root=$(git rev-parse --show-toplevel)
cd "$root"
dir=${1%/}
case $dir in
/* | *..*) echo "gpu-pack.sh: DIR must be a relative path inside the repository: $dir" >&2; exit 2 ;;
esac
limit_mib=${LIMIT_MIB:-56}
td=${KVCHAT_TESTDATA:-../shared/testdata}
for f in build-cuda/kvchat build-cuda/tests/gpu_tests build-cuda/tests/gpu_bench; do
    [ -x "$f" ] || { echo "gpu-pack.sh: $f is missing: run make cuda-build first" >&2; exit 1; }
done
if [ -e "$dir" ] || [ -L "$dir" ]; then
    if [ -L "$dir" ] || [ ! -f "$dir/COMMIT" ]; then
        echo "gpu-pack.sh: $dir exists and is not an earlier pack; choose another name" >&2
        exit 1
    fi
    rm -rf "$dir"
fi
stage="$dir/payload"
mkdir -p "$stage/lib" "$dir/testdata/tiny/ref" "$dir/testdata/vocab" "$dir/testdata/prompts"
exclude="$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
grep -qxF "/$dir/" "$exclude" 2>/dev/null || echo "/$dir/" >>"$exclude"

for f in build-cuda/kvchat build-cuda/tests/gpu_tests build-cuda/tests/gpu_bench; do
    strip --strip-debug -o "$stage/$(basename "$f")" "$f"
done
cp scripts/gpu-check.sh scripts/gpu-figures.sh "$dir/"
# the libraries a bare CUDA machine lacks: not the C and C++ runtimes, not CUDA's own
ldd build-cuda/kvchat build-cuda/tests/gpu_tests build-cuda/tests/gpu_bench | awk '/=> \// { print $3 }' | sort -u |
    while read -r lib; do
        case $(basename "$lib") in
        libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux* | libgcc_s.so* | libstdc++.so* | \
            libcuda.so* | libcudart.so* | libcublas.so* | libcublasLt.so*) ;;
        *) cp -L "$lib" "$stage/lib/" ;;
        esac
    done
cp "$td"/prompts/* "$dir/testdata/prompts/"
cp "$td"/vocab/llama-spm.gguf "$dir/testdata/vocab/"
build-cuda/kvchat gen-model --vocab-only -o "$stage/gemma-vocab.gguf" >/dev/null ||
    echo "gpu-pack.sh: no default model here: the pack has no gemma-vocab.gguf (gpu-check skips that step)" >&2
tar -C "$stage" -czf "$dir/payload.tar.gz" .
rm -rf "$stage"
# the commit the binaries were built from (they write it beside their figures), not the checkout's now
v=$(timeout 10 build-cuda/kvchat --version </dev/null 2>/dev/null | head -1)
case "$v" in
    "kvchat "?*) echo "${v#kvchat }" ;;
    *) git describe --always --dirty ;;   # a binary from before --version
esac >"$dir/COMMIT"
# tiny models in order of use until the budget: the GPU tests skip the absent ones
size_mib() { du -sm "$1" | cut -f1; }
for m in tiny-gemma3-q4_k_m tiny-llama-q4_k_m tiny-llama-f16 tiny-gemma3-f16; do
    [ -f "$td/tiny/$m.gguf" ] || continue
    want=$(($(size_mib "$dir") + $(size_mib "$td/tiny/$m.gguf") + 1))
    [ "$want" -le "$limit_mib" ] || continue
    cp "$td/tiny/$m.gguf" "$dir/testdata/tiny/"
    cp "$td"/tiny/ref/"$m"* "$dir/testdata/tiny/ref/" 2>/dev/null || true
done
total=$(size_mib "$dir")
models=()
for m in "$dir"/testdata/tiny/*.gguf; do [ -f "$m" ] && models+=("$(basename "$m")"); done
echo "gpu-pack.sh: $dir: $total MiB (${#models[@]} tiny models: ${models[*]})"
if [ "$total" -gt "$limit_mib" ]; then
    echo "gpu-pack.sh: $dir is $total MiB, over the $limit_mib MiB limit" >&2
    exit 1
fi
echo "run there: bash $dir/gpu-check.sh \$OUT"
