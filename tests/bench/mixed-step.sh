#!/bin/bash
# mixed-step.sh BUILD [GGUF] - issue 34: PD-mixed (one decode, 2 engine
# threads, every prompt computed locally) with the local prompt chunks run
# apart from the batch (fused-step = false: the old step), riding in the
# batch's passes (fused-step = true), and sized by tpot-target; 1P:1D
# with one thread each, with two each and the prefill at nice 19 (the
# kernel lends the decode's idle core; the decode's steps preempt), and two
# each at equal niceness. CONFIGS picks a subset. The issue's multi-turn workload
# (pd-bench, same seed for all); configurations alternate over ROUNDS
# (default 2), the best request throughput of each is kept.
# Default model: pd-mkmodel --preset bench-0.5b --ffn 3584 --vocab-type spm
# --type q4_K_M. Never run by a test. Result: docs/BENCHMARKS.md
# "Decode-local prompts in the running batch".
set -euo pipefail
BUILD=$(realpath "${1:?usage: mixed-step.sh BUILD [GGUF]}")
PDCTL=$BUILD/tools/pdctl/pdctl
BENCH=$BUILD/tools/bench/pd-bench
DIR=$(mktemp -d /tmp/pd-mixed-step.XXXXXX)
MODEL=${2:-$DIR/bench-q4_K_M.gguf}
ROUNDS=${ROUNDS:-2}
TARGET=${TARGET:-60ms}
CONFIGS=${CONFIGS:-"mixed-apart mixed-fused mixed-tpot 1p1d 1p1d-lend 1p1d-2x2"}
cleanup() {
    for c in $CONFIGS; do "$PDCTL" down --run-dir "$DIR/$c" >/dev/null 2>&1 || true; done
    rm -rf "$DIR"
}
trap cleanup EXIT
[ -f "$MODEL" ] || "$BUILD/engine/gguf/pd-mkmodel" --preset bench-0.5b --ffn 3584 --vocab-type spm \
    --type q4_K_M -o "$MODEL" >/dev/null
port=8290
deploy() { # name prefill decode dthreads pthreads pnice extra-decode-keys...
    local name=$1 np=$2 nd=$3 dth=$4 pth=$5 pnice=$6; shift 6
    {
        printf '[deployment]\nname = ms-%s\nmodel = %s\nprefill = %s\ndecode = %s\n' \
            "$name" "$MODEL" "$np" "$nd"
        printf 'run-dir = %s/%s\ndisagg-mode = %s\n' "$DIR" "$name" \
            "$([ "$np" = 0 ] && echo never || echo always)"
        printf '[router]\nhttp = 127.0.0.1:%s\ncontrol = 127.0.0.1:%s\n' $port $((port + 1))
        printf '[prefill]\nthreads = %s\nnice = %s\nkv-blocks = 2048\n' "$pth" "$pnice"
        printf '[decode]\nthreads = %s\nkv-blocks = 4096\nmax-batch = 32\n' "$dth"
        for kv in "$@"; do echo "$kv"; done
    } > "$DIR/$name.ini"
    port=$((port + 10))
}
deploy mixed-apart 0 1 2 1 0 "fused-step = false"
deploy mixed-fused 0 1 2 1 0 "fused-step = true"
deploy mixed-tpot 0 1 2 1 0 "fused-step = true" "tpot-target = $TARGET"
deploy 1p1d 1 1 1 1 0
# both daemons on both cores, the prefill niced: the kernel lends the
# decode's idle core to the prefill, the decode's steps preempt it
deploy 1p1d-lend 1 1 2 2 19
deploy 1p1d-2x2 1 1 2 2 0
W="--workload multi-turn --conversations 8 --turns 4 --concurrency 4 --input-len 64
   --output-len 32 --system-len 256 --ignore-eos --seed 1 --warmup 1"
for r in $(seq "$ROUNDS"); do
    for c in $CONFIGS; do
        "$PDCTL" up "$DIR/$c.ini" >/dev/null
        # shellcheck disable=SC2086
        "$BENCH" --url "$(cat "$DIR/$c/url")" $W --out "$DIR/$c.$r.json" >/dev/null
        "$PDCTL" admin decode-0 requests --run-dir "$DIR/$c" --json > "$DIR/$c.$r.adm" 2>/dev/null || true
        "$PDCTL" down --run-dir "$DIR/$c" >/dev/null
    done
done
python3 - "$DIR" "$ROUNDS" $CONFIGS <<'PY'
import json, sys
d, rounds, cfgs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print("| layout | req/s (best of %d) | mean TTFT | mean TPOT | p99 TPOT | failed | chunks (mean tokens) |" % rounds)
print("|---|---:|---:|---:|---:|---:|---:|")
for c in cfgs:
    runs = []
    for r in range(1, rounds + 1):
        j = json.load(open(f"{d}/{c}.{r}.json"))
        try:
            a = json.load(open(f"{d}/{c}.{r}.adm"))["counters"]
            ch = "%d (%.0f)" % (a["chunks"], a["chunk_tokens"] / a["chunks"]) if a["chunks"] else "0"
        except Exception:
            ch = "-"
        runs.append((j, ch))
    j, ch = max(runs, key=lambda x: x[0]["results"]["request_throughput"])
    s = j["results"]
    print(f"| {c} | {s['request_throughput']:.2f} | {s['mean_ttft_ms']/1000:.2f} s | "
          f"{s['mean_tpot_ms']:.1f} ms | {s['p99_tpot_ms']:.1f} ms | {s['failed']} | {ch} |")
PY
