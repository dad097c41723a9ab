#!/usr/bin/env bash
# drain-stall.sh - what a decode drain costs the streams it moves: 1P:2D,
# the sim engine at Llama-3-8B KV geometry (speedup 1: real 128 KiB/token
# KV written, pulled and, on a move, pulled again), long prompts (2000 /
# OUTLEN tokens, Poisson RATE/s) for 40 s; decode-1 is drained through the
# router three times, 8 s after the previous one ended (`set-backend
# decode-1 drain`, what `pdctl drain` and a planner re-split send), and set
# ready once it is empty. Prints per
# drain the streams there, how many the router asked to move and when it
# was empty; then the router's kept / migrated counters, migration_resume,
# and from pd-bench's per-request records each stream's longest gap after
# its first token (a move stalls it: export, the target's pull, any wait
# for room there). Loopback only; the deployment is stopped on exit.
#
#   tests/bench/drain-stall.sh [--build DIR] [--out DIR] [--rate R] [--output-len N]
set -uo pipefail

SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${PD_BUILD_DIR:-$SRC/build} OUT= RATE=2 OUTLEN=64
while [ $# -gt 0 ]; do
    case $1 in
    --build) BUILD=$2; shift ;;
    --out) OUT=$2; shift ;;
    --rate) RATE=$2; shift ;;
    --output-len) OUTLEN=$2; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "drain-stall: unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
    shift
done
. "$SRC/tests/bench/sim2d.sh"
sim2d_init drain-stall
sim2d_up 1
B=("$BENCH" --url "$URL" --rate "$RATE" --input-len 2000 --prompt-ids 1000:30000
   --output-len "$OUTLEN" --seed 2 --duration 40s --ignore-eos --request-timeout 60s --quiet
   --out "$OUT/bench.json")
say "${B[@]}"
"${B[@]}" >"$OUT/bench.log" 2>&1 &
BP=$!
# requests on decode-1 not ended (a light poll: no interpreter per call)
busy() {
    "$PDCTL" admin decode-1 requests --json --run-dir "$RUN" 2>/dev/null |
        grep -o '"state":"[a-z]*"' | grep -vc '"finished"\|"failed"\|"canceled"'
}
for i in 1 2 3; do
    sleep 8
    n0=$(busy)
    t0=$(date +%s%N)
    asked=$("$PDCTL" admin router set-backend decode-1 drain --run-dir "$RUN" --json |
            grep -o '"migrating":[0-9]*' | cut -d: -f2)
    while [ "$(busy)" != 0 ]; do sleep 0.1; done
    t1=$(date +%s%N)
    echo "drain $i: $n0 requests on decode-1, ${asked:-?} asked to move, empty after $(( (t1 - t0) / 1000000 )) ms"
    "$PDCTL" admin router set-backend decode-1 ready --run-dir "$RUN" >/dev/null
done
wait $BP
"$PDCTL" admin router stats --json --run-dir "$RUN" >"$OUT/router-stats.json"
python3 - "$OUT/router-stats.json" "$OUT/bench.json" <<'PY'
import json, sys
v = [t for t in json.load(open(sys.argv[1]))["stats"] if t["table"] == "router"][0]["values"]
m = v["migration_resume"]
print("router: kept on drain %s, migrated %d, failed %d; migration_resume p50 %.0f ms, p99 %.0f ms, sum %.1f s"
      % (v.get("requests_kept_on_drain", "-"), v["requests_migrated"], v["requests_failed"],
         m.get("p50_ns", 0) / 1e6, m.get("p99_ns", 0) / 1e6, m.get("sum_ns", 0) / 1e9))
j = json.load(open(sys.argv[2]))
r = j["results"]
gaps = sorted(max(q["itl_ms"][1:]) for q in j["requests"] if q["success"] and len(q["itl_ms"]) > 1)
print("pd-bench: %d completed, %d failed; e2e p50 %.0f ms, p90 %.0f ms" %
      (r["completed"], r["failed"], r["p50_e2el_ms"], r["p90_e2el_ms"]))
print("longest gap after token 1, per stream: > 0.5 s %d, > 2 s %d, > 5 s %d, worst %.1f s, sum of gaps > 0.5 s %.1f s"
      % (sum(g > 500 for g in gaps), sum(g > 2000 for g in gaps), sum(g > 5000 for g in gaps),
         gaps[-1] / 1000 if gaps else 0, sum(g for g in gaps if g > 500) / 1000))
PY
