#!/usr/bin/env bash
# check_sass_loads.sh PRODUCTS ATTENTION - the decode products' and decode attention's reads in
# flight, checked in the code the GPU runs.
#
# A lane of decode_dot_kernel keeps INFLIGHT items of each of its ROWS rows in flight only if the
# loads of all of them are issued before the first instruction that reads what one of them loaded:
# a warp issues in order, so that instruction waits for its item's bytes and holds back every load
# after it (docs/gpu.md, stage 1's third part: two items in flight had been one). Whether that holds
# is decided by ptxas's schedule, not by the source, so this reads the sm_90 code of PRODUCTS
# (build-cuda/kernels/cuda/vec_dot.o) with cuobjdump and, for every instance with two items or more
# in flight, counts the weight's loads (LDG without .CONSTANT: the activations are read through the
# constant path) issued before the first use of a register one of them wrote. The last item's loads
# must at least have begun: (items - 1) x loads an item + 1. Q4_K's wide path with 4 in flight is
# left out (ptxas unpacks its first item's header early; not a default).
#
# Likewise a slot of the grouped attention kernels (ATTENTION: build-cuda/kernels/cuda/attn_rows.o,
# attn_group_kernel<ROWS> and attn_group_lists_kernel<ROWS>) fetches ROWS key and value rows a round
# (kernels/attn_group.h ag_slot_run): every run of 16-byte loads must issue all 2 x ROWS before the
# first use of one (docs/gpu.md, stage 3's third part: ag_hold_for_every_fetch makes the first use
# depend on every load; before it, ptxas issued one row's loads, used them, then the rest's in some
# instances).
#
# Exit 1 with a line per instance that fails, or when a kernel the defaults run is missing (the
# check would check less than it says).
#
# cuobjdump and nvdisasm: CUDA_HOME's when it has them, else CUDA's own wheels from the package
# index installed into the project's private Python environment (scripts/sass_tools.sh).
#
# KVCHAT_SASS_CHECK=0 skips it, saying so (a machine that can have neither).
set -euo pipefail
obj=$1
attn_obj=$2
if [[ "${KVCHAT_SASS_CHECK:-1}" == 0 ]]; then
  echo "check_sass_loads: SKIPPED (KVCHAT_SASS_CHECK=0): the decode products' and attention's reads in flight were not checked"
  exit 0
fi
tools=$(bash "$(dirname "$0")/sass_tools.sh")
sass=$(mktemp)
attn_sass=$(mktemp)
trap 'rm -f "$sass" "$attn_sass"' EXIT
PATH="$tools:$PATH" cuobjdump -sass -arch sm_90 "$obj" >"$sass"
PATH="$tools:$PATH" cuobjdump -sass -arch sm_90 "$attn_obj" >"$attn_sass"
# insn: the instruction on this line (its address, a predicate and the trailing encoding
# dropped): op, its registers reg[1..n] in order (a pair, Rn.64, names n and n + 1), dest (the first
# operand a register the instruction writes: not a predicate, a uniform register or a store
# address) and predicated (a predicated write may leave its register as it was). Both checks below.
insn_awk='
function insn(    line, args, s, r) {
    line = $0
    sub(/^[ \t]*\/\*[0-9a-f]+\*\/[ \t]*/, "", line)
    sub(/[ \t]*;.*$/, "", line)
    sub(/^@!?U?P[0-9T]+[ \t]+/, "", line)
    op = line; sub(/[ \t].*$/, "", op)
    args = line; sub(/^[^ \t]+[ \t]*/, "", args)
    n = 0
    s = args
    dest = args ~ /^R[0-9]+/
    while (match(s, /(^|[^A-Za-z0-9_])R[0-9]+(\.64)?/)) {
        r = substr(s, RSTART, RLENGTH); sub(/^[^R]*R/, "", r)
        reg[++n] = r + 0
        if (r ~ /\.64$/) reg[++n] = r + 1
        s = substr(s, RSTART + RLENGTH)
    }
    predicated = $0 ~ /\*\/[ \t]*@/
}
'
awk "$insn_awk"'
# loads an item: the type (ggml id), then narrow / wide
function per_item(t, wide) {
    if (t == 2) return 5          # Q4_0: 4 halves of codes, the scale
    if (t == 6) return 7          # Q5_0: 4 halves, 2 of high bits, the scale
    if (t == 8) return 9          # Q8_0: 8 halves, the scale
    if (t == 12) return wide ? 2 : 5   # Q4_K: codes and header / 8 bytes and 4 header words
    if (t == 13) return wide ? 3 : 6   # Q5_K: with the high bits
    if (t == 14) return 11        # Q6_K: 4 + 4 halves, the scale, 2 sub-block scales
    if (t == 1 || t == 30) return 1    # F16, BF16: 16 bytes
    return -1
}
function finish() {
    if (name == "") return
    n_inst++
    if (items < 2 || skip) { name = ""; return }
    need = (items - 1) * per + 1
    if (before < need) {
        printf "check_sass_loads: %s: %d of the weight loads before the first use, at least %d wanted (%d items of %d loads)\n", label, before, need, items, per
        bad++
    } else checked++
    name = ""
}
/Function : _Z17decode_dot_kernelI/ {
    finish()
    name = $3
    if (!match(name, /ILj[0-9]+ELi[0-9]+ELi[0-9]+ELi[0-9]+ELi[0-9]+E/)) { name = ""; next }
    spec = substr(name, RSTART + 3, RLENGTH - 4)
    gsub(/ELi/, " ", spec)
    split(spec, v, " ")
    t = v[1] + 0; inflight = v[2] + 0; rows = v[3] + 0; wide = v[4] + 0; one = v[5] + 0
    wide = wide && (t == 12 || t == 13)
    per = per_item(t, wide)
    items = inflight * rows
    skip = wide && t == 12 && inflight == 4
    if (one && inflight == 4 && !wide) four[t] = 1
    label = sprintf("decode_dot_kernel<type %d, %d in flight, %d rows, %s, %s>", t, inflight, rows, wide ? "wide" : "narrow", one ? "a token" : "up to 8 tokens")
    if (per < 0) { printf "check_sass_loads: %s: unknown type\n", label; bad++; name = ""; next }
    before = 0; used = 0
    delete loaded
    next
}
/Function : / { finish(); next }
name != "" && !used && /\/\*[0-9a-f]+\*\// {
    insn()
    if (op ~ /^LDG/) {
        # sources: the address registers after the destination
        for (k = 2; k <= n; k++) if (reg[k] in loaded) { used = 1; next }
        if (op ~ /CONSTANT/) next
        w = op ~ /\.128/ ? 4 : op ~ /\.64/ ? 2 : 1
        for (k = 0; k < w; k++) loaded[reg[1] + k] = 1
        before++
        next
    }
    first = dest && op !~ /^(ST|BRA|RED|ATOM|EXIT|BAR|BSYNC|BSSY|CALL|RET)/ ? 2 : 1
    for (k = first; k <= n; k++) if (reg[k] in loaded) { used = 1; next }
    # written over unread (a predicated write may leave it as it was)
    if (first == 2 && !predicated && (reg[1] in loaded)) delete loaded[reg[1]]
    next
}
END {
    finish()
    if (n_inst == 0) { print "check_sass_loads: no decode_dot_kernel in the sm_90 code"; exit 1 }
    split("2 6 8 12 13 14 1 30", want, " ")
    for (k in want)
        if (!(want[k] in four)) { printf "check_sass_loads: no token kernel of type %d with 4 in flight\n", want[k]; bad++ }
    if (bad) exit 1
    printf "check_sass_loads: %d decode kernel instances with every item in flight (of %d)\n", checked, n_inst
}
' "$sass"
awk "$insn_awk"'
# an instance of a grouped attention kernel and its rows a round
function finish() {
    if (name == "") return
    n_inst++
    if (counting) end_run()
    if (runs == 0) { printf "check_sass_loads: %s: no key or value loads\n", label; bad++ }
    else if (worst < 2 * rows) {
        printf "check_sass_loads: %s: %d of the key and value loads before the first use, %d wanted (%d rows)\n", label, worst, 2 * rows, rows
        bad++
    } else checked++
    name = ""
}
function end_run() {
    runs++
    if (before < worst) worst = before
    counting = 0
}
/Function : _Z[0-9]+attn_group(_lists)?_kernelILi[0-9]+EE/ {
    finish()
    name = $3
    match(name, /ILi[0-9]+EE/)
    rows = substr(name, RSTART + 3, RLENGTH - 5) + 0
    lists = name ~ /lists/
    label = sprintf("%s<%d>", lists ? "attn_group_lists_kernel" : "attn_group_kernel", rows)
    have[label] = 1
    counting = 0; runs = 0; worst = 1e9
    delete loaded
    next
}
/Function : / { finish(); next }
name != "" && /\/\*[0-9a-f]+\*\// {
    insn()
    if (op ~ /^LDG?\.E\.128/) {   # a key or value row: a run begins at the first
        for (k = 2; k <= n; k++) if (counting && (reg[k] in loaded)) end_run()
        if (!counting) { counting = 1; before = 0; delete loaded }
        for (k = 0; k < 4; k++) loaded[reg[1] + k] = 1
        before++
        next
    }
    if (!counting) next
    first = dest && op !~ /^(ST|BRA|RED|ATOM|EXIT|BAR|BSYNC|BSSY|CALL|RET)/ ? 2 : 1
    for (k = first; k <= n; k++) if (reg[k] in loaded) { end_run(); next }
    if (first == 2 && !predicated && (reg[1] in loaded)) delete loaded[reg[1]]
    next
}
END {
    finish()
    split("attn_group_kernel<2> attn_group_kernel<4> attn_group_kernel<8> " \
          "attn_group_lists_kernel<2> attn_group_lists_kernel<4> attn_group_lists_kernel<8>", want, " ")
    for (k in want) if (!(want[k] in have)) { printf "check_sass_loads: no %s in the sm_90 code\n", want[k]; bad++ }
    if (bad) exit 1
    printf "check_sass_loads: %d grouped attention kernels with every row of a round in flight (of %d)\n", checked, n_inst
}
' "$attn_sass"
