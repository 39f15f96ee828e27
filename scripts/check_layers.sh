#!/usr/bin/env bash
# check_layers.sh - fail on an #include that goes up a layer (docs/ARCHITECTURE.md, "Layers"), on a
# session file that reaches a concept above its own, and on the calls a grep can see that break the
# layering: a front end reaching inside the session, a backend's or a policy's name compared outside
# its own module, or on a file read without the checked open.
#
# Every project include names its layer ("engine/kvcache.h"). From the bottom up:
#   common/   block formats and half-precision conversion: includes only common/
#   kernels/  the backend op table and its implementations: common/, kernels/
#   engine/   model, forward pass, cache, policies, session: common/, engine/, and kernels/ only
#             through kernels/backend.h
#   store/    sqlite persistence, implements the engine's persistence interface: common/, engine/, store/
#   ui/       the terminal interface: common/, engine/, store/, ui/, kernels/backend.h
#   app/      the binary and its commands: anything above, and of kernels/ only backend.h
# tests/, fuzz/ and bench/ may include anything. Prints each offending line; exit 1 if any.
#
# The session's files (engine/sess_priv.h) depend one way: sess_store.c, then sess_reuse.c, then sess_doc.c, then
# sess_turns.c, then sess_resume.c, sess_compare.c and session.c; each includes only the private
# headers of the files before it, and nothing outside them includes those headers.
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
        app) [[ $inc != tests/* && $inc != fuzz/* && ( $inc != kernels/* || $inc == kernels/backend.h ) ]] ;;
        *) return 0 ;;
    esac
}

# The session's private headers in the order its files depend on them.
SESS_ORDER=(engine/sess_priv.h engine/sess_store.h engine/sess_reuse.h engine/sess_doc.h engine/sess_turns.h)
sess_rank() { # rank of a private header or of a session file (5: the files on top), -1 for others
    local x=$1
    [[ $x == *.c ]] && x=${x%.c}.h
    for i in "${!SESS_ORDER[@]}"; do [[ ${SESS_ORDER[$i]} == "$x" ]] && { echo "$i"; return; }; done
    case "$1" in engine/sess_resume.c | engine/sess_compare.c | engine/session.c) echo 5 ;; *) echo -1 ;; esac
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
        else
            hr=$(sess_rank "$inc")
            if [[ $hr -ge 0 ]]; then
                fr=$(sess_rank "$f")
                if [[ $fr -lt 0 ]]; then
                    echo "$f:$line: #include \"$inc\": the session's private headers are for its own files"
                    bad=1
                elif [[ $hr -gt $fr || ( $hr -eq $fr && $f == *.h ) ]]; then
                    echo "$f:$line: #include \"$inc\" reaches a session concept above this file's (engine/sess_priv.h)"
                    bad=1
                fi
            fi
        fi
    done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
             sed -E 's/^([0-9]+):[^"]*"([^"]*)".*/\1:\2/' || true)
done < <(git ls-files 'common/*' 'kernels/*' 'engine/*' 'store/*' 'ui/*' 'app/*' |
         grep -E '\.(c|h|cu|cuh|cpp)$')

# Calls: a front end never takes a mutable part of the session; a backend's name ("cpu", "cuda") is
# compared only in kernels/, a policy's only in engine/policy/ (the modules ask them instead:
# run_on_device, pol_spec_decode_keeps_cache, POL_FULL, pol_presets).
backends=$(git grep -hoE '^[[:space:]]*\.name = "[a-z0-9]+"' -- 'kernels/*.c' 'kernels/*.cu' | sed -E 's/.*"(.*)"/\1/' | sort -u)
policies=$(git grep -hoE '^[[:space:]]*\.name = "[a-z0-9]+"' -- 'engine/policy/*.c' | sed -E 's/.*"(.*)"/\1/' | sort -u)
names_re() { echo "$*" | tr ' \n' '||' | sed -E 's/\|+$//; s/\|+/|/g'; }
compared() { # files to look in (git pathspecs), the names
    local names=$1
    shift
    git grep -nE "(strn?cmp|strn?casecmp|strstr)\([^;]*\"($names)([\":+]|\",)" -- "$@" || true
}
while IFS= read -r hit; do
    [[ -z $hit ]] && continue
    echo "$hit: compares a backend's name outside kernels/ (ask the backend or the run instead)"
    bad=1
done < <(compared "$(names_re $backends)" 'common/*.[ch]' 'engine/*.[ch]' 'engine/policy/*.[ch]' 'store/*.[ch]' \
         'ui/*.[ch]' 'app/*.[ch]' 'app/**/*.[ch]')
while IFS= read -r hit; do
    [[ -z $hit ]] && continue
    echo "$hit: compares a policy's name outside engine/policy/ (ask the policy layer instead)"
    bad=1
done < <(compared "$(names_re $policies)" 'common/*.[ch]' 'engine/*.[ch]' 'store/*.[ch]' 'ui/*.[ch]' 'app/*.[ch]' \
         'app/**/*.[ch]' 'kernels/*.[ch]')
while IFS= read -r hit; do
    [[ -z $hit ]] && continue
    echo "$hit: reaches inside the session (a sess_*_mut accessor)"
    bad=1
done < <(git grep -nE '\bsess_[a-z_]*_mut\b' -- 'engine/*.[ch]' 'store/*.[ch]' 'ui/*.[ch]' 'app/*.[ch]' 'app/**/*.[ch]' || true)
# Every file kvchat reads is opened through common/files.c (files_open_read: a regular file, a size
# limit, a FIFO never waited on): no fopen for reading and no open(O_RDONLY) anywhere else.
while IFS= read -r hit; do
    [[ -z $hit ]] && continue
    echo "$hit: reads a file without the checked open (common/files.h files_open_read)"
    bad=1
done < <(git grep -nE 'fopen\([^;]*"r|open\([^;]*O_RDONLY' -- 'common/*.[ch]' 'engine/*.[ch]' 'engine/*.cpp' \
         'engine/policy/*.[ch]' 'store/*.[ch]' 'ui/*.[ch]' 'app/*.[ch]' 'app/**/*.[ch]' 'kernels/*.[ch]' \
         'kernels/cpu/*.[ch]' ':!common/files.c' || true)

[[ $bad -eq 0 ]] && echo "layers: every include names its layer and none goes up; no call reaches past a module"
exit $bad
