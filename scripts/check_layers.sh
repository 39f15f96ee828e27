#!/usr/bin/env bash
# check_layers.sh - fail on an #include that goes up a layer (docs/ARCHITECTURE.md, "Layers").
#
# Every project include names its layer ("engine/kvcache.h"). From the bottom up:
#   common/   block formats and half-precision conversion: includes only common/
#   kernels/  the backend op table and its implementations: common/, kernels/
#   engine/   model, forward pass, cache, policies, session: common/, engine/, and kernels/ only
#             through kernels/backend.h
#   store/    sqlite persistence, implements the engine's persistence interface: common/, engine/, store/
#   ui/       the terminal interface: common/, engine/, store/, ui/, kernels/backend.h
#   app/      the binary and its commands: anything above
# tests/, fuzz/ and bench/ may include anything. Prints each offending line; exit 1 if any.
set -euo pipefail
cd "$(dirname "$0")/.."

allowed() { # layer of the including file, included path
    local from=$1 inc=$2
    case "$from" in
        common) [[ $inc == common/* ]] ;;
        kernels) [[ $inc == common/* || $inc == kernels/* ]] ;;
        engine) [[ $inc == common/* || $inc == engine/* || $inc == kernels/backend.h ]] ;;
        store) [[ $inc == common/* || $inc == engine/* || $inc == store/* ]] ;;
        ui) [[ $inc == common/* || $inc == engine/* || $inc == store/* || $inc == ui/* ||
               $inc == kernels/backend.h ]] ;;
        app) [[ $inc != tests/* && $inc != fuzz/* ]] ;;
        *) return 0 ;;
    esac
}

bad=0
while IFS= read -r f; do
    layer=${f%%/*}
    while IFS=: read -r line inc; do
        if [[ $inc != */* ]]; then
            echo "$f:$line: #include \"$inc\" does not name its layer (write e.g. \"engine/$inc\")"
            bad=1
        elif ! allowed "$layer" "$inc"; then
            echo "$f:$line: #include \"$inc\" goes up from $layer/ (docs/ARCHITECTURE.md, Layers)"
            bad=1
        fi
    done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
             sed -E 's/^([0-9]+):[^"]*"([^"]*)".*/\1:\2/' || true)
done < <(git ls-files 'common/*' 'kernels/*' 'engine/*' 'store/*' 'ui/*' 'app/*' |
         grep -E '\.(c|h|cu|cuh|cpp)$')
[[ $bad -eq 0 ]] && echo "layers: every include names its layer and none goes up"
exit $bad
