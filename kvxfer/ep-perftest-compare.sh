#!/bin/bash
# ep-perftest-compare.sh - pd-ep-bench (2 ranks) next to ucx_perftest for the
# same bytes: per batch, the layer's dispatch and combine bytes one rank
# puts to the other (pd-ep-bench's dispatch_bytes_out / combine_bytes_out)
# each timed with `ucx_perftest -t ucp_put_lat` (one-way latency, half a
# ping-pong), summed: the floor of a layer's two exchanges on this
# transport. Runs both 3 times, alternating, and keeps each one's best p50
# (a shared machine: docs/BENCHMARKS.md says so next to the figures).
#
#   ep-perftest-compare.sh shm|tcp [--bench=PATH] [--batches=1,8,64] [--runs=3]
set -u
tls=${1:-shm}
shift
bench=$(cd "$(dirname "$0")" && pwd)/../build/kvxfer/pd-ep-bench
batches=1,8,64
runs=3
for a in "$@"; do
    case "$a" in
    --bench=*) bench=${a#*=} ;;
    --batches=*) batches=${a#*=} ;;
    --runs=*) runs=${a#*=} ;;
    esac
done
[ -x "$bench" ] || { echo "pd-ep-bench not found (--bench=PATH)" >&2; exit 2; }
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not installed" >&2; exit 2; }
case "$tls" in
shm) ptls=posix,sysv,cma,self ;;
tcp) ptls=tcp ;;
*) echo "shm or tcp" >&2; exit 2 ;;
esac

perftest_lat() { # bytes -> one-way us (typical)
    local port srv out
    for _ in 1 2 3 4 5; do
        port=$((20000 + RANDOM % 20000))
        ss -ltn "sport = :$port" | grep -q LISTEN && continue
        UCX_TLS=$ptls UCX_NET_DEVICES=lo ucx_perftest -p "$port" </dev/null >/dev/null 2>&1 &
        srv=$!
        for _ in $(seq 1 500); do
            ss -ltn "sport = :$port" | grep -q LISTEN && break
            kill -0 "$srv" 2>/dev/null || break
            sleep 0.01
        done
        if kill -0 "$srv" 2>/dev/null; then
            out=$(UCX_TLS=$ptls UCX_NET_DEVICES=lo timeout 120 ucx_perftest 127.0.0.1 -p "$port" </dev/null \
                  -t ucp_put_lat -s "$1" -n 1000 -w 100 2>/dev/null | awk '/^Final:/ {print $4}')
            wait "$srv" 2>/dev/null
            echo "$out"
            return 0
        fi
        kill "$srv" 2>/dev/null
    done
    return 1
}
min() { sort -g | head -1; }

declare -A best_ep best_pt
for r in $(seq 1 "$runs"); do
    while read -r line; do
        b=$(echo "$line" | sed 's/.* batch=\([0-9]*\) .*/\1/')
        d=$(echo "$line" | sed 's/.* dispatch_bytes_out=\([0-9]*\) .*/\1/')
        c=$(echo "$line" | sed 's/.* combine_bytes_out=\([0-9]*\) .*/\1/')
        l=$(echo "$line" | sed 's/.* layer_us_p50=\([0-9.]*\) .*/\1/')
        pd=$(perftest_lat "$d") && pc=$(perftest_lat "$c") || { echo "ucx_perftest failed" >&2; exit 1; }
        p=$(echo "$pd + $pc" | bc -l)
        echo "run $r batch $b: dispatch $d B + combine $c B: pd-ep-bench $l us, ucx_perftest put_lat $pd + $pc = $p us"
        best_ep[$b]=$(printf '%s\n' "$l" ${best_ep[$b]:-} | min)
        best_pt[$b]=$(printf '%s\n' "$p" ${best_pt[$b]:-} | min)
    done < <("$bench" --tls "$tls" --ranks 2 --batches "$batches" 2>/dev/null | grep "^tls=")
done
for b in $(echo "$batches" | tr , ' '); do
    printf 'best %s batch %s: pd-ep-bench %s us/layer, ucx_perftest %.1f us, ratio %.2f\n' \
        "$tls" "$b" "${best_ep[$b]}" "${best_pt[$b]}" "$(echo "${best_ep[$b]} / ${best_pt[$b]}" | bc -l)"
done
