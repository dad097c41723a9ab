#!/usr/bin/env bash
# tests/pdctl: a real-vocabulary Qwen3-MoE model (random weights, Llama-3's
# 128256-token BPE vocabulary from the npm reference tokenizer, Q4_K_M mix)
# served disaggregated through `pdctl up --set deployment.model=...`; every
# completion must equal pd-run's (text and token count).
#   test_realvocab.sh SRC_ROOT PDCTL PD_MKMODEL PD_RUN TOK_CLI
# Exit 77 (skip) when the npm vocabulary cannot be installed (offline).
set -uo pipefail
SRC=$1 PDCTL=$2 MK=$3 PDRUN=$4 TOKCLI=$5
T=$(mktemp -d /tmp/pdctl-realvocab.XXXXXX)
R=$T/run
cleanup() {
    [ -f "$R/deployment.json" ] && "$PDCTL" down --run-dir "$R" >/dev/null 2>&1
    for f in "$R"/*.pid; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done
    [ -n "${KEEP:-}" ] || rm -rf "$T"
}
trap cleanup EXIT
fails=0
ok()  { echo "ok   - $*"; }
bad() { echo "FAIL - $*"; fails=$((fails + 1)); }

# the Llama-3 vocabulary as a tokenizer-only GGUF (tests/engine/tok's npm
# cross-check writes it, and checks our tokenizer against the reference)
"$SRC/tests/engine/tok/run_xcheck.sh" "$TOKCLI" "$T/vocab" >"$T/xcheck.log" 2>&1
rc=$?
[ $rc = 77 ] && { echo "npm reference vocabulary unavailable: skip"; exit 77; }
[ $rc = 0 ] || { echo "tokenizer cross-check failed:"; tail -5 "$T/xcheck.log"; exit 1; }
VOCAB=$T/vocab/llama3-vocab.gguf
MODEL=$T/qwen3moe-llama3vocab-q4_K_M.gguf
"$MK" --preset byte --arch qwen3moe --experts 8 --experts-used 2 --expert-ffn 384 \
    --type q4_K_M --vocab-from "$VOCAB" --name qwen3moe-test -o "$MODEL" >/dev/null ||
    { echo "pd-mkmodel failed"; exit 1; }

"$PDCTL" up "$SRC/deploy/local-1p1d.ini" --run-dir "$R" \
    --set router.http=127.0.0.1:0 --set router.control=127.0.0.1:0 \
    --set deployment.model="$MODEL" --set deployment.disagg-mode=always \
    >"$T/up.out" 2>&1
if [ $? != 0 ]; then
    echo "pdctl up failed:"; cat "$T/up.out"; for f in "$R"/*.log; do tail -5 "$f"; done
    exit 1
fi
URL=$(cat "$R/url")
ok "pdctl up with deployment.model=$(basename "$MODEL")"

n=0
while IFS= read -r prompt; do
    n=$((n + 1))
    body=$(python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1], "max_tokens": 24, "temperature": 0}))' "$prompt")
    resp=$(curl -s -m 120 "$URL/v1/completions" -H 'Content-Type: application/json' -d "$body")
    got=$(python3 -c 'import json,sys; j=json.loads(sys.stdin.read()); print(json.dumps([j["choices"][0]["text"], j["usage"]["completion_tokens"]]))' <<<"$resp" 2>/dev/null)
    ref_text=$("$PDRUN" --model "$MODEL" --prompt "$prompt" --max-tokens 24 --threads 1 2>/dev/null)
    ref_n=$("$PDRUN" --model "$MODEL" --prompt "$prompt" --max-tokens 24 --threads 1 --tokens-out 2>/dev/null | wc -w)
    want=$(python3 -c 'import json,sys; print(json.dumps([sys.argv[1], int(sys.argv[2])]))' "$ref_text" "$ref_n")
    if [ -n "$got" ] && [ "$got" = "$want" ]; then ok "prompt $n: $got"
    else bad "prompt $n: served $got ($resp), pd-run $want"; fi
done <<'EOF_PROMPTS'
The capital of France is
Once upon a time, in a land far away, there lived a dragon who loved mathematics and
def fibonacci(n):
Ünïcödé — ✓ 日本語 テキスト 🚀 and numbers 12345 67890
EOF_PROMPTS

dis=$("$PDCTL" stats router --json --run-dir "$R" 2>/dev/null |
    grep -o '"requests_disaggregated": *[0-9.]*' | grep -o '[0-9][0-9.]*$' | cut -d. -f1)
if [ "${dis:-0}" -ge 4 ]; then ok "all $dis requests were disaggregated"
else bad "router counted ${dis:-?} disaggregated requests"; fi
"$PDCTL" down --run-dir "$R" >/dev/null 2>&1 && ok "pdctl down" || bad "pdctl down"
[ $fails = 0 ]
