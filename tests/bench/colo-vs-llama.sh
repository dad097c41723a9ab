#!/bin/bash
# colo-vs-llama.sh BUILD [GGUF] - issue 34: one 2-core host, three
# workloads, llama.cpp (tests/tools/node/llama_server.mjs: llama-server's
# scheme, -t 2, 4 parallel sequences, prompt cache on) beside pdserve's
# layouts on the same model and token ids:
#   1p1d       1P:1D, one engine thread each (each daemon its own core)
#   1p1d-lend  1P:1D, two threads each, prefill at nice PNICE (default 10):
#              the kernel lends the decode's idle core to prompts
#   1p1d-arb   as 1p1d-lend, and the decode's tpot-target TARGET with the
#              host's core arbiter: the decode parks a thread while the
#              prefill wants cores and its step time keeps the target
#   1p1d-pwide 1P:1D, prefill two threads at nice PNICE, decode one: the
#              decode keeps its core, the prefill also takes the decode's gaps
#   mixed      one decode, 2 threads, every prompt computed locally in the
#              running batch, tpot-target TARGET (default 40ms)
# Workloads (pd-bench, the same seed for every server):
#   chat-mt    the issue's: multi-turn 8 conversations x 4 turns, 4 in
#              flight, 64 new words a turn, 32-token answers, 256-token system prompt
#   long       2k-token prompts (330 words), 64-token answers, 2 in flight, 8 requests
#   short      short chat: 16-word prompts, 64-token answers, 4 in flight, 32 requests
# SERVERS / WORKLOADS pick subsets (LONG_REQUESTS: long's count, default 8); each pair runs ROUNDS (default 1) times,
# the best request throughput kept. Default model: pd-mkmodel --preset
# bench-0.5b --ffn 3584 --layers 6 --vocab-type byte --type q4_K_M (byte
# vocabulary: llama_server.mjs feeds llama.cpp pdserve's token ids).
# Never run by a test. Result: docs/BENCHMARKS.md "Co-located daemons vs llama-server".
set -euo pipefail
BUILD=$(realpath "${1:?usage: colo-vs-llama.sh BUILD [GGUF]}")
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PDCTL=$BUILD/tools/pdctl/pdctl
BENCH=$BUILD/tools/bench/pd-bench
DIR=$(mktemp -d /tmp/pd-colo.XXXXXX)
MODEL=${2:-$DIR/bench6-byte-q4_K_M.gguf}
ROUNDS=${ROUNDS:-1}
TARGET=${TARGET:-40ms}
PNICE=${PNICE:-10}
SERVERS=${SERVERS:-"llama 1p1d 1p1d-lend 1p1d-arb mixed"}
WORKLOADS=${WORKLOADS:-"chat-mt long short"}
LLPID=
cleanup() {
    [ -n "$LLPID" ] && kill "$LLPID" 2>/dev/null || true
    for c in $SERVERS; do "$PDCTL" down --run-dir "$DIR/$c" >/dev/null 2>&1 || true; done
    [ -n "${KEEP:-}" ] || rm -rf "$DIR"
}
trap cleanup EXIT
[ -f "$MODEL" ] || "$BUILD/engine/gguf/pd-mkmodel" --preset bench-0.5b --ffn 3584 --layers 6 \
    --vocab-type byte --type q4_K_M -o "$MODEL" >/dev/null
port=8390
deploy() { # name prefill pthreads pnice dthreads extra-decode-keys...
    local name=$1 np=$2 pth=$3 pnice=$4 dth=$5; shift 5
    {
        printf '[deployment]\nname = colo-%s\nmodel = %s\nprefill = %s\ndecode = 1\n' \
            "$name" "$MODEL" "$np"
        printf 'run-dir = %s/%s\ndisagg-mode = %s\n' "$DIR" "$name" \
            "$([ "$np" = 0 ] && echo never || echo always)"
        printf '[router]\nhttp = 127.0.0.1:%s\ncontrol = 127.0.0.1:%s\n' $port $((port + 1))
        printf '[prefill]\nthreads = %s\nnice = %s\ncpu-share = 1000\nkv-blocks = 2048\n' "$pth" "$pnice"
        printf 'cpu-arbiter = %s/cpu.arb\n' "$DIR"
        printf '[decode]\nthreads = %s\ncpu-share = 1000\nkv-blocks = 4096\nmax-batch = 32\n' "$dth"
        for kv in "$@"; do echo "$kv"; done
    } > "$DIR/$name.ini"
    port=$((port + 10))
}
deploy 1p1d 1 1 0 1
deploy 1p1d-lend 1 2 "$PNICE" 2
deploy 1p1d-arb 1 2 "$PNICE" 2 "tpot-target = $TARGET" "cpu-arbiter = $DIR/cpu.arb"
deploy 1p1d-pwide 1 2 "$PNICE" 1
deploy mixed 0 1 0 2 "tpot-target = $TARGET"
workload() {
    case $1 in
    chat-mt) echo "--workload multi-turn --conversations 8 --turns 4 --concurrency 4 --input-len 64
                   --output-len 32 --system-len 256 --endpoint chat" ;;
    long) echo "--input-len 330 --output-len 64 --concurrency 2 --num-requests ${LONG_REQUESTS:-8}" ;;
    short) echo "--input-len 16 --output-len 64 --concurrency 4 --num-requests 32 --endpoint chat" ;;
    esac
}
start() { # start SERVER: sets url
    if [ "$1" = llama ]; then
        node "$SRC/tests/tools/node/llama_server.mjs" "$MODEL" --threads 2 --parallel 4 \
            --ctx 8192 > "$DIR/llama.url" 2> "$DIR/llama.log" &
        LLPID=$!
        for _ in $(seq 600); do [ -s "$DIR/llama.url" ] && break; sleep 0.1; done
        url=$(head -1 "$DIR/llama.url")
    else
        "$PDCTL" up "$DIR/$1.ini" >/dev/null
        url=$(cat "$DIR/$1/url")
    fi
}
stop() {
    if [ "$1" = llama ]; then kill "$LLPID"; wait "$LLPID" 2>/dev/null || true; LLPID=
    else "$PDCTL" down --run-dir "$DIR/$1" >/dev/null; fi
}
for r in $(seq "$ROUNDS"); do
    for s in $SERVERS; do
        start "$s"
        for w in $WORKLOADS; do
            # shellcheck disable=SC2046
            "$BENCH" --url "$url" $(workload "$w") --ignore-eos --seed 1 --warmup 1 \
                --no-per-request --quiet --out "$DIR/$s.$w.$r.json" >/dev/null
        done
        stop "$s"
    done
done
python3 - "$DIR" "$ROUNDS" "$WORKLOADS" $SERVERS <<'PY'
import json, sys
d, rounds, wls, srv = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]
for w in wls:
    print(f"\n{w}\n\n| server | req/s | vs llama | mean TTFT | mean TPOT | p99 TPOT | failed |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    best = {}
    for s in srv:
        runs = [json.load(open(f"{d}/{s}.{w}.{r}.json"))["results"] for r in range(1, rounds + 1)]
        best[s] = max(runs, key=lambda x: x["request_throughput"])
    base = best.get("llama")
    for s in srv:
        x = best[s]
        ratio = f"{x['request_throughput'] / base['request_throughput']:.2f}x" if base else "-"
        print(f"| {s} | {x['request_throughput']:.3f} | {ratio} | {x['mean_ttft_ms']/1000:.2f} s | "
              f"{x['mean_tpot_ms']:.1f} ms | {x['p99_tpot_ms']:.1f} ms | {x['failed']} |")
PY
