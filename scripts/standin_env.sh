# shellcheck shell=bash
# standin_env.sh - what the checks over the stand-in CUDA runtime share (sourced by standin_check.sh
# and standin_faults.sh). With K (a CUDA build of kvchat), SI (the stand-in's folder) and who (the
# script's name) set, and the test files the script needs as arguments: each must exist (exit 2
# otherwise); K and SI made absolute; $work a temporary folder, removed at exit, and the runs'
# home (their settings, data, history and cache too); the stand-in first on LD_LIBRARY_PATH; the
# sanitizers' settings; none of the settings that would change a run.
TD=../shared/testdata
for f in "$K" "$SI"/libcudart.so.* "$@"; do
    if [ ! -e "$f" ]; then
        echo "$who: $f is missing" >&2
        exit 2
    fi
done
case $K in /*) ;; *) K=$PWD/$K ;; esac
case $SI in /*) ;; *) SI=$PWD/$SI ;; esac
work=$(mktemp -d)
# runs left in the background by an interrupted script are stopped before their folder goes
trap 'kill $(jobs -p) 2> /dev/null; wait; rm -rf "$work"' EXIT
# hermetic: no user settings, data, history or cache
export LD_LIBRARY_PATH="$SI${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" HOME="$work" XDG_DATA_HOME="$work" \
    XDG_CONFIG_HOME="$work/config" XDG_STATE_HOME="$work/state" XDG_CACHE_HOME="$work/cache"
export ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp
unset KVCHAT_CUDA_GRAPH KVCHAT_PROFILE KVCHAT_STANDIN_REPORT KVCHAT_STANDIN_SITES KVCHAT_STANDIN_FAIL \
    KVCHAT_STANDIN_ARM KVCHAT_STANDIN_MEMORY
