#!/usr/bin/env bash
# gpu-figures.sh - the figures of a GPU check as rows of one CSV (step,what,config,value,unit), and
# kvchat beside the peer. scripts/gpu-check.sh calls it (it sits beside it in the pack); plain
# bash and POSIX awk (a bare CUDA machine has mawk, not gawk).
#
#   gpu-figures.sh header                       the CSV's header line
#   gpu-figures.sh row STEP WHAT CONFIG VALUE UNIT
#                                               one row, every text field quoted
#   gpu-figures.sh kernels CSV                  gpu_bench's rows (what,type,n_out,n_in,tokens,config,
#                                               ms,GBps,of_copy) as ms, GB/s and "of copy" rows
#   gpu-figures.sh bench STEP CONFIG CSV        kvchat bench's speed rows (...,model,depth,
#                                               prefill_tok_s,decode_tok_s,n_gen) as tok/s rows named
#                                               "MODEL prefill DEPTH" and "MODEL decode at DEPTH"
#   gpu-figures.sh compare FIGURES              appends the peer's figures and kvchat/peer for every
#                                               kvchat figure the peer also measured to FIGURES, and
#                                               prints the comparison as a markdown table
set -uo pipefail

# The peer: llama.cpp d32676d, CUDA, flash attention, on a lent H100 80GB HBM3 on 2026-11-24
# (../shared/docs/gpu-peer.md, which does not travel with the pack). Only figures kvchat bench
# measures the same way are listed (the peer's decode at depth 0 has no kvchat twin).
PEER_SOURCE="llama.cpp d32676d CUDA fa (another H100 80GB HBM3; 2026-11-24)"
PEER_TABLE='gemma3-270m-q4_k_m prefill 512|56087
gemma3-270m-q4_k_m prefill 2048|58765
gemma3-270m-q4_k_m prefill 8192|50464
gemma3-270m-q4_k_m decode at 2048|866
gemma3-270m-q4_k_m decode at 8192|879
mistral-7b-f16 prefill 512|15448
mistral-7b-f16 prefill 2048|20896
mistral-7b-f16 prefill 8192|18636
mistral-7b-f16 decode at 512|171.7
mistral-7b-f16 decode at 2048|166.8
mistral-7b-f16 decode at 8192|159.5
mistral-7b-f16 decode at 32768|126.3
mistral-7b-q4_k_m prefill 512|9506
mistral-7b-q4_k_m prefill 8192|9360
mistral-7b-q4_k_m decode at 8192|228'

usage() {
    echo "usage: gpu-figures.sh header | row STEP WHAT CONFIG VALUE UNIT | kernels CSV | bench STEP CONFIG CSV | compare FIGURES" >&2
    exit 2
}

quote() {
    local s=${1//\"/\"\"}
    printf '"%s"' "$s"
}

# numbers bare, anything else (a step's result, the GPU's name) quoted
row() {
    local v=$4
    [[ $v =~ ^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]] || v=$(quote "$v")
    printf '%s,%s,%s,%s,%s\n' "$(quote "$1")" "$(quote "$2")" "$(quote "$3")" "$v" "$(quote "$5")"
}

readable() {
    if [ ! -f "$1" ] || [ ! -r "$1" ]; then
        echo "gpu-figures.sh: cannot read $1" >&2
        exit 1
    fi
}

[ $# -ge 1 ] || usage
case $1 in
header)
    [ $# -eq 1 ] || usage
    echo "step,what,config,value,unit"
    ;;
row)
    [ $# -eq 6 ] || usage
    row "$2" "$3" "$4" "$5" "$6"
    ;;
kernels)
    [ $# -eq 2 ] || usage
    readable "$2"
    # no field of gpu_bench's rows holds a comma
    awk -F, 'NR > 1 && NF == 9 {
        what = $1
        if ($1 == "product") what = $1 " " $2 " " $3 "x" $4 " " $5 " tokens"
        else if ($1 ~ /^attention/) what = $1 " ctx " $5
        printf "\"gpu_bench\",\"%s\",\"%s\",%s,\"ms\"\n", what, $6, $7
        printf "\"gpu_bench\",\"%s\",\"%s\",%s,\"GB/s\"\n", what, $6, $8
        printf "\"gpu_bench\",\"%s\",\"%s\",%s,\"of copy\"\n", what, $6, $9
    }' "$2"
    ;;
bench)
    [ $# -eq 4 ] || usage
    readable "$4"
    # the machine field is quoted and may hold commas: the last five fields are the figures'
    awk -F, -v step="$2" -v config="$3" 'NR > 1 && NF >= 9 {
        model = $(NF - 4)
        sub(/\.gguf$/, "", model)
        printf "\"%s\",\"%s prefill %s\",\"%s\",%s,\"tok/s\"\n", step, model, $(NF - 3), config, $(NF - 2)
        printf "\"%s\",\"%s decode at %s\",\"%s\",%s,\"tok/s\"\n", step, model, $(NF - 3), config, $(NF - 1)
    }' "$4"
    ;;
compare)
    [ $# -eq 2 ] || usage
    readable "$2"
    peer_rows=$(while IFS='|' read -r what v; do row peer "$what" "$PEER_SOURCE" "$v" tok/s; done <<<"$PEER_TABLE")
    # kvchat's tok/s rows (not the peer's, not earlier ratios) against the peer's figure of the same name
    ratio_rows=$(awk -F'"' -v table="$PEER_TABLE" 'BEGIN {
            n = split(table, lines, "\n")
            for (i = 1; i <= n; i++) { split(lines[i], kv, "|"); peer[kv[1]] = kv[2] }
        }
        $2 != "peer" && $2 != "kvchat / peer" && $8 == "tok/s" && ($4 in peer) {
            v = $7
            gsub(/,/, "", v)
            printf "\"kvchat / peer\",\"%s\",\"%s\",%.3f,\"x peer\"\n", $4, $6, v / peer[$4]
        }' "$2")
    printf '%s\n' "$peer_rows" >>"$2"
    [ -n "$ratio_rows" ] && printf '%s\n' "$ratio_rows" >>"$2"
    echo "| figure | kvchat config | kvchat tok/s | peer tok/s | kvchat / peer |"
    echo "| --- | --- | ---: | ---: | ---: |"
    while IFS='|' read -r what v; do
        # every kvchat configuration that measured this figure, or one row saying none did
        found=$(awk -F'"' -v what="$what" -v peer="$v" '$2 != "peer" && $2 != "kvchat / peer" && $8 == "tok/s" && $4 == what {
                val = $7
                gsub(/,/, "", val)
                printf "| %s | %s | %s | %s | %.3f |\n", what, $6, val, peer, val / peer
            }' "$2")
        if [ -n "$found" ]; then
            printf '%s\n' "$found"
        else
            echo "| $what | - | - | $v | - |"
        fi
    done <<<"$PEER_TABLE"
    echo
    echo "Peer: $PEER_SOURCE, not this machine."
    ;;
*)
    usage
    ;;
esac
