#!/bin/bash
# perftest-compare.sh - kvxfer-bench next to `ucx_perftest -t ucp_get` with
# the same UCX_TLS (taken from the environment) and the same total size,
# alternating the two K times, and print medians and
#   ratio = kvxfer / ucx_perftest
#
#   perftest-compare.sh [--mode=bw|lat] [--size=BYTES] [--block-bytes=B]
#                       [--iters=N] [--runs=K] [--lat-arena=N] [--bench=PATH]
#                       [-- extra bench args]
#
# Fairness: both tools get the same iteration count and the same warm-up
# (iters/10, at least 3: `ucx_perftest -w`, `kvxfer-bench --warmup`), the
# same UCX_TLS, the same UCX tuning kvx applies to itself
# (kvx_ucx_env_defaults: UCX_TCP_TX_SEG_SIZE=64K unless the environment sets
# it or UCX_TCP_RX_SEG_SIZE) and the same total size.
#
# bw  (default): size 64 MiB pulled as scattered blocks of block-bytes
#                (2 MiB: Llama-3-8B, 16 tokens); compares MiB/s (higher is
#                better; target ratio >= 0.9).
# lat:           one block of 64 KiB per pull; compares p50 latency in us
#                (lower is better; target ratio <= 1.5). ucx_perftest gets the
#                same 64 KiB buffer every time (cache-hot); --lat-arena=1
#                (default) does the same, --lat-arena=64 pulls a random one of
#                64 blocks into a random one of 64 (4 MiB each side: L2-cold).
set -u
# kvx's UCX tuning (kvxfer/kvx.c kvx_ucx_env_defaults), for perftest too
[ -n "${UCX_TCP_RX_SEG_SIZE:-}" ] || export UCX_TCP_TX_SEG_SIZE=${UCX_TCP_TX_SEG_SIZE:-64K}
mode=bw
size=$((64 << 20))
block=$((2 << 20))
iters=""
runs=3
lat_arena=1
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
    --lat-arena=*) lat_arena=${a#*=} ;;
    --bench=*) bench=${a#*=} ;;
    --) shift; extra=("$@"); break ;;
    *) ;;
    esac
    shift
done
if [ -z "$bench" ]; then
    # the project's build dir (make build); --bench=PATH for another one
    for c in "$here/../../build/kvxfer/kvxfer-bench"; do
        [ -x "$c" ] && bench=$c && break
    done
fi
[ -x "$bench" ] || { echo "kvxfer-bench not found (--bench=PATH)" >&2; exit 2; }
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not installed" >&2; exit 2; }

if [ "$mode" = lat ]; then
    size=$((64 << 10))
    block=$size
    iters=${iters:-5000}
    warm=$((iters / 10 > 3 ? iters / 10 : 3))
    bargs=(--block-bytes=$block --blocks-per-pull=1 --arena-blocks=$lat_arena --iters=$iters --warmup=$warm)
else
    iters=${iters:-100}
    warm=$((iters / 10 > 3 ? iters / 10 : 3))
    nb=$((size / block))
    # same 64 MiB working set as ucx_perftest, in a new random order per pull
    bargs=(--block-bytes=$block --blocks-per-pull=$nb --arena-blocks=$nb --iters=$iters --warmup=$warm)
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
                  -n "$iters" -w "$warm" 2>/dev/null | awk '/^Final:/ {print $3, $7}')
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
echo "UCX_TLS=${UCX_TLS:-(default)} mode=$mode size=$size block=$block iters=$iters warmup=$warm runs=$runs bench=${bargs[*]} ${extra[*]}"
for r in $(seq 1 "$runs"); do
    # the bench has its own stall guard (--stall-s); timeout is the last line
    res=$(timeout 600 "$bench" "${bargs[@]}" "${extra[@]}" | grep '^RESULT')
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
