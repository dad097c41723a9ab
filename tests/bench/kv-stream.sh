#!/bin/bash
# kv-stream.sh - second-token gap vs a full KV pull, kv-stream = layer vs whole
# (issue 15). One router + one prefill + one decode of the sim engine at the
# Llama-3-8B geometry (pdctl up deploy/local-1p1d.ini with --set), per
# transport (UCX_TLS=tcp, then UCX's default = shared memory on one host) and
# per kv-stream mode; per prompt length, pd-bench sends R requests one at a
# time (max_tokens 4, ignore EOS) and we print the medians of TTFT, the gap
# between token 0 and token 1 (itl_ms[0]) and the decode's pull time (kvx
# pull latency p50 over those requests). With layer the decode gets the
# handle before the prompt pass (early hand-off), so its pull spans the
# prefill's compute: "gap / full pull" divides by the whole-mode pull of
# the same transport and length (a full pull at the transport's bandwidth),
# which is why whole runs first.
#   tests/bench/kv-stream.sh BUILD [R] [LENS...]
# KVSTREAM_TLS="tcp" (default "tcp shm") and KVSTREAM_DTYPES="f16 q8_0 q4_0"
# (deployment kv-dtype, default "f16"; issue 32) narrow or widen the sweep;
# the last column is the decode's bytes pulled per request.
set -u
B=$(cd "${1:-build}" && pwd); R=${2:-5}; shift 2 2>/dev/null; LENS=${*:-1000 3000 6000}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# A debug build (PD_DEBUG_POISON, meson's default debugoptimized) fills every
# freed KV block with 0xdb on the daemon's loop: at 3000 tokens 376 MiB per
# request, 60-160 ms measured on the decode (the allocation that evicts the
# previous request's cached blocks, before the pull can start) and on the
# prefill (after each lease ends). Measure a release build:
#   meson setup build-rel -Dbuildtype=release && ninja -C build-rel
if grep -q '^#define PD_DEBUG_POISON 1' "$B/pd_build_config.h" 2>/dev/null; then
  echo "kv-stream.sh: $B is a debug build (PD_DEBUG_POISON): freed KV is poisoned on the" \
       "loop, the numbers would include it; use -Dbuildtype=release (KVSTREAM_DEBUG_OK=1 to go on)" >&2
  [ "${KVSTREAM_DEBUG_OK:-0}" = 1 ] || exit 2
fi
M="sim:llama3-8b,prefill_tps=10000,decode_ms=20+0.3*b,speedup=1,kv_check=sample"
admin() { python3 - "$1" "$2" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1])
s.sendall((sys.argv[2] + "\n").encode()); b = b""
while not b.endswith(b"\n"):
    x = s.recv(1 << 20)
    if not x: break
    b += x
sys.stdout.write(b.decode())
PY
}
FULL=$(mktemp /tmp/pd-kvstream-full-XXXXXX)
printf '| transport | kv-dtype | kv-stream | prompt | TTFT p50 ms | gap token0→1 p50 ms | pull p50 ms | gap / full pull | MiB pulled / request |\n|---|---|---|---|---|---|---|---|---|\n'
for tls in ${KVSTREAM_TLS:-tcp shm}; do
 for dt in ${KVSTREAM_DTYPES:-f16}; do
  for mode in whole layer; do
   for n in $LENS; do
    run=$(mktemp -d /tmp/pd-kvstream-XXXXXX)
    env=(); [ $tls = tcp ] && env=(UCX_TLS=tcp)
    env "${env[@]}" "$B/tools/pdctl/pdctl" up "$ROOT/deploy/local-1p1d.ini" --run-dir "$run" \
        --set router.http=127.0.0.1:0 --set router.control=127.0.0.1:0 \
        --set deployment.model="$M" --set deployment.disagg-mode=always \
        --set prefill.kv-blocks=480 --set decode.kv-blocks=480 --set prefill.kv-stream=$mode \
        --set deployment.kv-dtype=$dt \
        --foreground > "$run/out.txt" 2>&1 &
    pid=$!
    for i in $(seq 600); do
      grep -q 'is ready: ' "$run/out.txt" 2>/dev/null && break
      kill -0 $pid 2>/dev/null || break
      sleep 0.1
    done
    if ! grep -q 'is ready: ' "$run/out.txt" 2>/dev/null; then
      echo "| $tls | $dt | $mode | $n | deployment did not start: $(grep -m1 -i error "$run"/*.log "$run/out.txt" 2>/dev/null | cut -c1-160) |"
      kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$run"; continue
    fi
    url=$(cat "$run/url")
      before=$(admin "$run/decode-0.sock" xfer)
      "$B/tools/bench/pd-bench" --url "$url" --concurrency 1 --num-requests "$R" --warmup 1 \
          --prompt-ids 1000:100000 --input-len "fixed:$n" --output-len fixed:4 --ignore-eos \
          --quiet --out "$run/r$n.json" > /dev/null 2>&1
      after=$(admin "$run/decode-0.sock" xfer)
      python3 - "$run/r$n.json" "$tls" "$mode" "$n" "$before" "$after" "$FULL" "$dt" <<'PY'
import json, sys, statistics as st
r = json.load(open(sys.argv[1])); tls, mode, n = sys.argv[2:5]; dt = sys.argv[8]
b, a = json.loads(sys.argv[5]), json.loads(sys.argv[6])
reqs = [q for q in r.get("requests", []) if q.get("ttft_ms") is not None and q.get("itl_ms")]
ttft = st.median(q["ttft_ms"] for q in reqs); gap = st.median(q["itl_ms"][0] for q in reqs)
tb, ta = b.get("xfer", b)["total"], a.get("xfer", a)["total"]
pulls = ta["pulls_ok"] - tb["pulls_ok"]
pull = ta["latency"]["p50_ns"] / 1e6   # a fresh deployment per (transport, mode, length)
full_f = sys.argv[7]; full = {}
for line in open(full_f):
    k, v = line.split(); full[k] = float(v)
key = f"{tls}/{dt}/{n}"
if mode == "whole":
    with open(full_f, "a") as f: f.write(f"{key} {pull}\n")
    full[key] = pull
ref = full.get(key, pull)
mib = (ta["bytes_pulled"] - tb["bytes_pulled"]) / max(pulls, 1) / 2**20
print(f"| {tls} | {dt} | {mode} | {n} | {ttft:.1f} | {gap:.1f} | {pull:.1f} | {gap / ref:.2f} | {mib:.1f} |"
      + ("" if pulls == len(reqs) + 1 else f" ({pulls} pulls)"))
PY
    kill -TERM $pid; wait $pid 2>/dev/null; rm -rf "$run"
   done
  done
 done
done
rm -f "$FULL"
