#!/usr/bin/env bash
# check_ptxas.sh LIMITS REPORT... - the CUDA kernels' register and spill report (nvcc -Xptxas -v,
# saved by the build beside each object as OBJECT.ptxas) against recorded limits.
#
# Every kernel: no spill stores or loads (a spill is local memory traffic in the hottest loop).
# Each kernel LIMITS names (its name without template arguments, per architecture; or one instance,
# named with its arguments as c++filt shows them, which then holds that instance instead): at most
# that many registers and no stack frame. A kernel that needs more registers after a change fails here, so the
# occupancy it costs is a decision (raise the limit in the same commit, with the measurement that
# justifies it), not an accident. A kernel LIMITS names that no report has also fails: the table
# would be checking nothing. Exit 1 with one line per problem. (The reports are demangled in one
# c++filt pass: one c++filt per kernel could fail to start under a loaded build and name a kernel
# after the one before it.)
set -euo pipefail
limits=$1
shift
if [ $# -eq 0 ]; then echo "check_ptxas.sh: no ptxas reports given" >&2; exit 1; fi
for r in "$@"; do
    # an object compiled before the build kept its report: compile it again
    [ -f "$r" ] || { echo "check_ptxas.sh: $r is missing (remove ${r%.ptxas} and build again)" >&2; exit 1; }
done
awk -v limits="$limits" '
BEGIN {
    while ((getline line < limits) > 0) {
        sub(/#.*/, "", line)
        if (split(line, f, " ") != 3) continue
        max[f[1] " " f[2]] = f[3] + 0
        seen[f[1] " " f[2]] = 0
    }
    bad = 0
}
/Compiling entry function/ {
    split($0, q, "'\''")
    name = q[2]
    sub(/^void /, "", name)
    full = name
    sub(/\(.*/, "", full)
    sub(/[<(].*/, "", name)
    kernel = name " " q[4]
    shown = full " " q[4]
    next
}
/bytes stack frame/ && kernel != "" {
    stack[kernel] = $1 + 0
    if ($5 + 0 > 0 || $9 + 0 > 0) { printf "ptxas: %s spills (%s)\n", shown, $0; bad = 1 }
    next
}
/Used [0-9]+ registers/ && kernel != "" {
    for (i = 1; i <= NF; i++) if ($i == "Used") regs = $(i + 1) + 0
    if (shown in max) { stack[shown] = stack[kernel]; kernel = shown }   # the instance named itself
    if (kernel in max) {
        seen[kernel] = 1
        if (regs > max[kernel]) { printf "ptxas: %s uses %d registers, its recorded limit is %d\n", shown, regs, max[kernel]; bad = 1 }
        if (stack[kernel] > 0) { printf "ptxas: %s has a %d-byte stack frame\n", shown, stack[kernel]; bad = 1 }
    }
    kernel = ""
}
END {
    for (k in seen) if (!seen[k]) { printf "ptxas: %s is in %s but in no report\n", k, limits; bad = 1 }
    exit bad
}' <(cat "$@" | c++filt)
