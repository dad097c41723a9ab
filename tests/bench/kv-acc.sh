#!/bin/bash
# kv-acc.sh - what each KV cache dtype costs in accuracy, pdserve beside
# llama.cpp with the same cache types (issue 32). Each engine is compared with
# its own f16-KV run on the same tokens (teacher forcing): mean KL(f16 || dtype)
# in nats, max and RMS |dlogit|, argmax agreement, mean -ln p; and pdserve's
# f16 with llama.cpp's f16 (the two engines' own gap, the floor).
#   tests/bench/kv-acc.sh BUILD MODEL.gguf [N_SCORE] [LENS...]
# MODEL: a 0.5B-geometry model with a vocabulary llama.cpp loads, e.g.
# build/engine/gguf/pd-mkmodel --preset bench-0.5b --type q4_K_M --vocab-type
# spm -o bench-q4_K_M.gguf (add --layers 2 for a model whose logits are not
# chaotic in the input: random weights over 24 layers turn any rounding,
# f16 in another engine too, into a KL of ~0.2); random weights, token ids a
# fixed LCG sequence. N_SCORE (default 64) last positions of each length
# (default "1024 4000") are scored. Then the built-in model's held-out text
# (as tests/engine/llama ngram-model: every position, bits/byte).
# llama.cpp: node-llama-cpp's prebuilt CPU build (tests/engine/llama/node,
# installed by its install.sh), flash attention on (needed for a quantized V
# cache). fp8_e4m3 has no llama.cpp counterpart. KVACC_PD_DT / KVACC_LL_DT
# narrow the K:V pairs (f16:f16 / F16:F16 must stay: the reference).
# Never run by a test.
set -eu
B=$(cd "${1:?BUILD}" && pwd); MODEL=$(realpath "${2:?MODEL.gguf}"); N=${3:-64}
shift 3 2>/dev/null || shift $#; LENS=${*:-1024 4000}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
NODE_DIR=$ROOT/tests/engine/llama/node
T=${KVACC_THREADS:-2}
PD_DT=${KVACC_PD_DT:-"f16:f16 bf16:bf16 q8_0:q8_0 fp8_e4m3:fp8_e4m3 q4_0:q4_0 q8_0:q4_0"}
LL_DT=${KVACC_LL_DT:-"F16:F16 BF16:BF16 Q8_0:Q8_0 Q4_0:Q4_0 Q8_0:Q4_0"}
W=$(mktemp -d); trap '[ -n "${KVACC_KEEP:-}" ] || rm -rf "$W"' EXIT
[ -z "${KVACC_KEEP:-}" ] || echo "kv-acc: logits kept in $W" >&2

pd_runs() { # MODEL IDS_CSV N OUTDIR [--prompt args]: one pd-run per dtype pair
  local model=$1 ids=$2 n=$3 out=$4
  for kv in $PD_DT; do
    "$B/engine/pd-run" --model "$model" --tokens "$ids" --score "$n" --threads "$T" \
      --kv-k "${kv%%:*}" --kv-v "${kv##*:}" --logits-out "$out/pd-${kv%%:*}-${kv##*:}.bin" >/dev/null
  done
}

for L in $LENS; do
  D=$W/len$L; mkdir -p "$D"
  python3 - "$L" > "$D/ids.json" <<'PY'
import json, sys
n = int(sys.argv[1]); x = 12345; out = [1]
while len(out) < n:
    x = (x * 1103515245 + 12345) & 0x7fffffff
    out.append(3 + (x >> 8) % 31997)
print(json.dumps(out))
PY
  ids=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1])))))' "$D/ids.json")
  echo "== $(basename "$MODEL"), $L tokens, last $N scored"
  pd_runs "$MODEL" "$ids" "$N" "$D"
  (cd "$NODE_DIR" && KVACC_THREADS=$T node kvacc.mjs "$MODEL" "$D/ids.json" "$N" "$D" $LL_DT)
done

# the built-in model on held-out text: the ngram-model test writes the text
BI=$B/engine/gguf/builtin.gguf
if [ -f "$BI" ]; then
  PD_HELDOUT_OUT=$W/heldout.txt "$B/tests/engine/llama/test-ngram-model" "$BI" \
    "$B/engine/gguf/byte.gguf" >/dev/null 2>&1 || true
  if [ -s "$W/heldout.txt" ]; then
    D=$W/builtin; mkdir -p "$D"
    txt=$(cat "$W/heldout.txt")
    # the ids pdserve's tokenizer gives (BOS first), for llama.cpp too
    "$B/engine/pd-run" --model "$BI" --prompt "$txt" --score 1 --tokens-out |
      python3 -c 'import json,sys; print(json.dumps(json.loads(sys.stdin.read())["ids"]))' > "$D/ids.json"
    ids=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1])))))' "$D/ids.json")
    NB=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))) - 1)' "$D/ids.json")
    BYTES=$(wc -c < "$W/heldout.txt")
    echo "== built-in model, held-out $BYTES bytes, $NB tokens scored (bits/byte = nll * tokens / bytes / ln 2)"
    pd_runs "$BI" "$ids" "$NB" "$D"
    (cd "$NODE_DIR" && KVACC_THREADS=$T node kvacc.mjs "$BI" "$D/ids.json" "$NB" "$D" $LL_DT) |
      python3 -c '
import json, math, sys
nb, by = int(sys.argv[1]), int(sys.argv[2])
for l in sys.stdin:
    r = json.loads(l); r["bits_per_byte"] = r["nll"] * nb / by / math.log(2); print(json.dumps(r))' "$NB" "$BYTES"
  fi
fi
