#!/usr/bin/env bash
# fuzz_smoke.sh - make test's check that the libFuzzer harnesses (make fuzz) still build and run:
# each one over its seeds and a few thousand mutations, everything it writes in one temporary
# folder. A harness that no longer matches the code it fuzzes (a policy parameter renamed, say)
# fails here instead of at the next `make fuzz`. Not a fuzzing run: that is `make fuzz`.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export TMPDIR=$tmp
mkdir "$tmp/gguf" "$tmp/snap" "$tmp/csv"
run() {   # name, then the harness's arguments
    local name=$1
    shift
    if ! "$@" -artifact_prefix="$tmp/" > "$tmp/$name.log" 2>&1; then
        tail -n 40 "$tmp/$name.log" >&2
        echo "fuzz_smoke: $name failed (its log above)" >&2
        exit 1
    fi
    echo "fuzz_smoke: $name: $(grep -o 'Done [0-9]* runs' "$tmp/$name.log" | tail -n 1)"
}
run gguf build-fuzz/fuzz_gguf -runs=20000 -max_len=65536 "$tmp/gguf" fuzz/corpus/gguf
FUZZ_SNAPSHOT_SEED_DIR=$tmp/snap run snapshot build-fuzz/fuzz_snapshot -runs=300 -max_len=65536 "$tmp/snap"
run evalcsv build-fuzz/fuzz_evalcsv -runs=5000 -max_len=16384 "$tmp/csv" fuzz/corpus/evalcsv
