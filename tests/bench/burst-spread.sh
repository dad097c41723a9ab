#!/usr/bin/env bash
# burst-spread.sh - how a burst of requests lands on the daemons: 1P:2D
# (--prefill N: NP:2D), the sim engine at Llama-3-8B KV geometry
# (sim-llama3-8b-sweep.ini: 2 s heartbeats, max-batch 16), a Poisson
# background of RATE/s plus BURST requests at once every 8 s, as agent
# frameworks fan out tool calls (256-token prompts, 200-token answers;
# --input-len / --output-len), 48 s. The router picks each request's
# daemons when it arrives; a burst falls between two heartbeats. Prints
# pd-bench's TTFT / TPOT / e2e and each stream's longest gap after token 0
# (a decode's queue shows in TTFT, or in that gap when the prefill's token 0
# went out first), then per decode the
# streams it ran and the most it ran and queued at once (polled every
# 0.2 s). Loopback only; the deployment is stopped on exit.
#
#   tests/bench/burst-spread.sh [--build DIR] [--out DIR] [--rate R] [--burst N]
#                               [--input-len N] [--output-len N] [--prefill N]
set -uo pipefail

SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${PD_BUILD_DIR:-$SRC/build} OUT= RATE=2 BURST=12 INLEN=256 OUTLEN=200 NPF=1
while [ $# -gt 0 ]; do
    case $1 in
    --build) BUILD=$2; shift ;;
    --out) OUT=$2; shift ;;
    --rate) RATE=$2; shift ;;
    --burst) BURST=$2; shift ;;
    --input-len) INLEN=$2; shift ;;
    --output-len) OUTLEN=$2; shift ;;
    --prefill) NPF=$2; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "burst-spread: unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
    shift
done
. "$SRC/tests/bench/sim2d.sh"
sim2d_init burst-spread

# the trace: Poisson background + bursts, unique prompts (no prefix reuse)
python3 - "$OUT/trace.jsonl" "$RATE" "$BURST" "$INLEN" "$OUTLEN" <<'PY'
import json, random, sys
out, rate, burst = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
inlen, outlen = int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(7)
ev, t = [], 0.0
while True:
    t += rng.expovariate(rate)
    if t >= 48.0:
        break
    ev.append(t)
for b in range(6):
    ev += [4.0 + 8.0 * b] * burst
hid = 0
with open(out, "w") as f:
    for t in sorted(ev):
        f.write(json.dumps({"timestamp": int(t * 1000), "input_length": inlen,
                            "output_length": outlen, "hash_ids": [hid]}) + "\n")
        hid += 1
PY

sim2d_up "$NPF"
B=("$BENCH" --url "$URL" --workload trace --trace "$OUT/trace.jsonl" --ignore-eos
   --request-timeout 60s --quiet --out "$OUT/bench.json")
say "${B[@]}"
"${B[@]}" >"$OUT/bench.log" 2>&1 &
BP=$!
# each decode's running and queued streams as it reports them
: >"$OUT/poll.txt"
while kill -0 $BP 2>/dev/null; do
    for d in decode-0 decode-1; do
        s=$("$PDCTL" admin "$d" stats --json --run-dir "$RUN" 2>/dev/null | tr -d ' \n')
        run=$(grep -o '"running":[0-9]*' <<<"$s" | head -1 | cut -d: -f2)
        wq=$(grep -o '"waiting":[0-9]*' <<<"$s" | head -1 | cut -d: -f2)
        echo "$d ${run:-0} ${wq:-0}" >>"$OUT/poll.txt"
    done
    sleep 0.2
done
wait $BP
for d in decode-0 decode-1; do
    "$PDCTL" admin "$d" stats --json --run-dir "$RUN" >"$OUT/$d-stats.json" 2>/dev/null
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
j = json.load(open(out + "/bench.json"))
r = j["results"]
gaps = sorted(max(q["itl_ms"]) for q in j["requests"] if q["success"] and q["itl_ms"])
print("prompt tokens (mean): %.0f" % (sum(q["input_tokens"] for q in j["requests"]) / max(1, len(j["requests"]))))
print("pd-bench: %d completed, %d failed; ttft p50 %.0f ms, p90 %.0f ms, p99 %.0f ms; "
      "tpot p50 %.1f ms, p99 %.1f ms; e2e p50 %.0f ms, p90 %.0f ms, p99 %.0f ms"
      % (r["completed"], r["failed"], r["p50_ttft_ms"], r["p90_ttft_ms"], r["p99_ttft_ms"],
         r["p50_tpot_ms"], r["p99_tpot_ms"], r["p50_e2el_ms"], r["p90_e2el_ms"], r["p99_e2el_ms"]))
print("longest gap after token 0, per stream: > 1 s %d, > 2 s %d, worst %.1f s"
      % (sum(g > 1000 for g in gaps), sum(g > 2000 for g in gaps), gaps[-1] / 1000 if gaps else 0))
peak = {}
for line in open(out + "/poll.txt"):
    d, run, wq = line.split()
    p = peak.setdefault(d, [0, 0])
    p[0], p[1] = max(p[0], int(run)), max(p[1], int(wq))
for d in sorted(peak):
    try:
        t = [t for t in json.load(open("%s/%s-stats.json" % (out, d)))["stats"]
             if t["table"] == "decode"][0]["values"]
        done = t["completed"]
    except Exception:
        done = "?"
    print("%s: %s streams ended, at most %d running, at most %d queued" % (d, done, peak[d][0], peak[d][1]))
PY
