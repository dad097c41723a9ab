#!/bin/bash
# perftest-compare.sh - kvxfer-bench next to `ucx_perftest -t ucp_get` with
# the same UCX_TLS (taken from the environment) and the same total size,
# alternating the two K times, and print medians and
#   ratio = kvxfer / ucx_perftest
#
#   perftest-compare.sh [--mode=bw|lat] [--size=BYTES] [--block-bytes=B]
#                       [--iters=N] [--runs=K] [--bench=PATH] [-- extra bench args]
#
# bw  (default): size 64 MiB pulled as scattered blocks of block-bytes
#                (2 MiB: Llama-3-8B, 16 tokens); compares MiB/s (higher is
#                better; target ratio >= 0.9).
# lat:           one block of 64 KiB per pull; compares p50 latency in us
#                (lower is better; target ratio <= 1.5).
set -u
mode=bw
size=$((64 << 20))
block=$((2 << 20))
iters=""
runs=3
bench=""
extra=()
here=$(cd "$(dirname "$0")" && pwd)
for a in "$@"; do
    case "$a" in
    --mode=*) mode=${a#*=} ;;
    --size=*) size=${a#*=} ;;
    --block-bytes=*) block=${a#*=} ;;
    --iters=*) iters=${a#*=} ;;
    --runs=*) runs=${a#*=} ;;
    --bench=*) bench=${a#*=} ;;
    --) shift; extra=("$@"); break ;;
    *) ;;
    esac
    shift
done
if [ -z "$bench" ]; then
    for c in "$here/../../build-kvxfer/kvxfer/kvxfer-bench" "$here/../../build/kvxfer/kvxfer-bench"; do
        [ -x "$c" ] && bench=$c && break
    done
fi
[ -x "$bench" ] || { echo "kvxfer-bench not found (--bench=PATH)" >&2; exit 2; }
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not installed" >&2; exit 2; }

if [ "$mode" = lat ]; then
    size=$((64 << 10))
    block=$size
    iters=${iters:-5000}
    bargs=(--block-bytes=$block --blocks-per-pull=1 --arena-blocks=64 --iters=$iters --warmup=200)
else
    iters=${iters:-30}
    nb=$((size / block))
    # same 64 MiB working set as ucx_perftest, in a new random order per pull
    bargs=(--block-bytes=$block --blocks-per-pull=$nb --arena-blocks=$nb --iters=$iters --warmup=3)
fi

# ucx_perftest server on a free port; readiness by polling the listen socket.
perftest_once() {
    local port srv out
    for _ in 1 2 3 4 5; do
        port=$((20000 + RANDOM % 20000))
        ss -ltn "sport = :$port" | grep -q LISTEN && continue
        ucx_perftest -p "$port" >/dev/null 2>&1 &
        srv=$!
        for _ in $(seq 1 500); do
            ss -ltn "sport = :$port" | grep -q LISTEN && break
            kill -0 "$srv" 2>/dev/null || break
            sleep 0.01
        done
        if ss -ltn "sport = :$port" | grep -q LISTEN; then
            out=$(timeout 120 ucx_perftest 127.0.0.1 -p "$port" -t ucp_get -s "$size" \
                  -n "$iters" 2>/dev/null | awk '/^Final:/ {print $3, $7}')
            wait "$srv" 2>/dev/null
            echo "$out"
            return 0
        fi
        kill "$srv" 2>/dev/null
        wait "$srv" 2>/dev/null
    done
    return 1
}

median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

kv=()
pt=()
echo "UCX_TLS=${UCX_TLS:-(default)} mode=$mode size=$size block=$block iters=$iters runs=$runs"
for r in $(seq 1 "$runs"); do
    res=$("$bench" "${bargs[@]}" "${extra[@]}" | grep '^RESULT')
    [ -n "$res" ] || { echo "kvxfer-bench failed" >&2; exit 1; }
    p=$(perftest_once) || { echo "ucx_perftest failed" >&2; exit 1; }
    if [ "$mode" = lat ]; then
        k=$(echo "$res" | sed 's/.* p50_us=\([0-9.]*\).*/\1/')
        q=${p%% *}
        unit=us
    else
        k=$(echo "$res" | sed 's/.* mibps=\([0-9.]*\).*/\1/')
        q=${p##* }
        unit=MiB/s
    fi
    echo "  run $r: kvxfer $k $unit   ucx_perftest $q $unit"
    kv+=("$k")
    pt+=("$q")
done
km=$(printf '%s\n' "${kv[@]}" | median)
pm=$(printf '%s\n' "${pt[@]}" | median)
echo "median: kvxfer $km $unit   ucx_perftest $pm $unit"
echo "ratio = kvxfer / ucx_perftest = $(awk -v a="$km" -v b="$pm" 'BEGIN {printf "%.3f", a / b}')"
