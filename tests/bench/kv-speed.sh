#!/bin/bash
# kv-speed.sh - decode tokens/s per KV cache dtype at a context length,
# pdserve (build/engine/pd-eng-bench) beside llama.cpp (node-llama-cpp,
# tests/engine/llama/node/llbatch.mjs) with the same cache types, on the same
# GGUF, alternating engine by engine R times; the best of the R runs counts
# (issue 32). Both: B sequences each holding CTX tokens of KV, one token per
# sequence per step, the fastest of STEPS steps.
#   tests/bench/kv-speed.sh BUILD MODEL.gguf [R] [CTXS...]
# Defaults: R 2, CTXS "1024 4000", batches 1 and 32 (KVSPEED_BATCHES),
# threads 2 (KVSPEED_THREADS). fp8_e4m3 has no llama.cpp counterpart.
# Prints a table: tok/s, the dtype vs f16 in the same engine, and pdserve vs
# llama.cpp for the same cache type. Never run by a test.
set -eu
B=$(cd "${1:?BUILD}" && pwd); MODEL=$(realpath "${2:?MODEL.gguf}"); R=${3:-2}
shift 3 2>/dev/null || shift $#; CTXS=${*:-1024 4000}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
T=${KVSPEED_THREADS:-2}; BATCHES=${KVSPEED_BATCHES:-1,32}; STEPS=${KVSPEED_STEPS:-4}
PD_DT=f16,bf16,q8_0,fp8_e4m3,q4_0
LL_DT="F16:F16 BF16:BF16 Q8_0:Q8_0 Q4_0:Q4_0"
OUT=$(mktemp); trap 'rm -f "$OUT"' EXIT
for ctx in $CTXS; do
  for r in $(seq "$R"); do
    # pd-eng-bench: "NAME kv=DT  type isa params MB/token prefill/s dec@b1 dec@b32 ..."
    "$B/engine/pd-eng-bench" --model "$MODEL" --kv "$PD_DT" --threads "$T" --batches "$BATCHES" \
      --prefill 16 --steps "$STEPS" --ctx "$ctx" | tee -a /dev/stderr |
      awk -v ctx="$ctx" -v bs="$BATCHES" '/ kv=/ { split(bs, b, ","); sub("kv=", "", $2);
          for (i = 1; i <= length(b); i++) print "pdserve", $2, ctx, b[i], $(7 + i) }' >> "$OUT"
    (cd "$ROOT/tests/engine/llama/node" &&
       node llbatch.mjs "$MODEL" "$T" "$ctx" "$BATCHES" "$STEPS" $LL_DT) | tee -a /dev/stderr |
      python3 -c 'import json, sys
for l in sys.stdin:
    r = json.loads(l); print("llama.cpp", r["k"], r["ctx"], r["batch"], r["decode_tps"])' >> "$OUT"
  done
done
python3 - "$OUT" <<'PY'
import sys
best = {}
for l in open(sys.argv[1]):
    eng, dt, ctx, b, tps = l.split()
    k = (eng, dt, int(ctx), int(b)); best[k] = max(best.get(k, 0), float(tps))
ctxs = sorted({k[2] for k in best}); bs = sorted({k[3] for k in best})
print("| kv-dtype | " + " | ".join(f"b{b} @{c}: pdserve (vs f16) | llama.cpp (vs f16) | pd/llama"
                                     for c in ctxs for b in bs) + " |")
print("|---" * (1 + 3 * len(ctxs) * len(bs)) + "|")
for dt in ["f16", "bf16", "q8_0", "fp8_e4m3", "q4_0"]:
    cells = []
    for c in ctxs:
        for b in bs:
            p, l = best.get(("pdserve", dt, c, b)), best.get(("llama.cpp", dt, c, b))
            pf, lf = best.get(("pdserve", "f16", c, b)), best.get(("llama.cpp", "f16", c, b))
            cells.append(f"{p:.1f} ({p / pf:.2f}x)" if p else "-")
            cells.append(f"{l:.1f} ({l / lf:.2f}x)" if l else "-")
            cells.append(f"**{p / l:.2f}x**" if p and l else "-")
    print(f"| {dt} | " + " | ".join(cells) + " |")
PY
