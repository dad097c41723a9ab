#!/bin/sh
# amx-ttft.sh - issue 37: TTFT of a 2k-token prompt through `pdctl up` 1P:1D,
# the daemons' integer dot on AMX tiles vs VNNI (the `qdot` config row),
# deployment by deployment back to back, --rounds rounds. Per deployment:
# 1 warm-up request, then -n requests of --input-len token ids (distinct
# prompts: no prefix-cache hits), --output-len 1, one at a time; prints each
# run's TTFT min / median / mean and at the end the best median per path.
#
# usage: tests/bench/amx-ttft.sh [--build DIR] [--rounds N] [-n N]
#        [--input-len N] [--threads N] MODEL.gguf
# Binds 127.0.0.1:18731 / 17731 only; pdctl down on exit (trap).
set -eu
build=build rounds=3 n=3 len=2048 threads=1
while [ $# -gt 0 ]; do
    case $1 in
    --build) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -n) n=$2; shift 2 ;;
    --input-len) len=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --*) echo "usage: $0 [--build DIR] [--rounds N] [-n N] [--input-len N] [--threads N] MODEL" >&2
         exit 2 ;;
    *) break ;;
    esac
done
model=${1:?usage: $0 [options] MODEL.gguf}
build=$(cd "$build" && pwd)
pdctl=$build/tools/pdctl/pdctl bench=$build/tools/bench/pd-bench
work=$(mktemp -d /tmp/pd-amx-ttft.XXXXXX)
run=
down() { [ -n "$run" ] && "$pdctl" down --run-dir "$run" >/dev/null 2>&1 || true; run=; }
trap 'down; rm -rf "$work"' EXIT INT TERM
for r in $(seq 1 "$rounds"); do
    for q in vnni amx; do
        run=$work/run-$q-$r
        cat >"$work/$q.ini" <<INI
[deployment]
name = amx-ttft
model = $model
prefill = 1
decode = 1
run-dir = $run
disagg-mode = threshold
disagg-threshold = 32
[router]
http = 127.0.0.1:18731
control = 127.0.0.1:17731
[prefill]
threads = $threads
qdot = $q
kv-blocks = 1024
[decode]
threads = 1
qdot = $q
kv-blocks = 1024
INI
        "$pdctl" up "$work/$q.ini" >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; exit 1; }
        grep -h "qdot path" "$run"/*.log 2>/dev/null | head -1 | sed 's/.*qdot path/  qdot path/' >&2 || true
        "$bench" --url http://127.0.0.1:18731 --prompt-ids 100:30000 --input-len "$len" \
            --output-len 1 --num-requests "$n" --concurrency 1 --warmup 1 --seed "$r" \
            --out "$work/$q-$r.json" >/dev/null
        python3 - "$work/$q-$r.json" "$q" "$r" <<'PY' | tee -a "$work/all"
import json, sys
d = json.load(open(sys.argv[1]))
t = sorted(x["ttft_ms"] for x in d["requests"] if x.get("success") and x.get("ttft_ms") is not None)
if not t:
    print(sys.argv[2], sys.argv[3], "no successful request"); sys.exit(0)
print(sys.argv[2], sys.argv[3], "ttft ms min %.0f median %.0f mean %.0f (n %d)" %
      (t[0], t[len(t) // 2], sum(t) / len(t), len(t)))
PY
        down
    done
done
echo "best median TTFT (ms) over $rounds rounds, $len-token prompts, prefill threads $threads:"
for q in vnni amx; do
    awk -v q="$q" '$1 == q && $8 != "" { if (b == "" || $8 + 0 < b) b = $8 + 0 } END { print "  " q ": " b }' "$work/all"
done
