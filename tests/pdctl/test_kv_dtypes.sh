#!/usr/bin/env bash
# tests/pdctl: every KV cache dtype end to end through `pdctl up` (issue 32).
# For each K/V dtype pair, a 1P:1D deployment of the random-weight byte model
# (where the KV format changes the tokens) started with --set kv-dtype-k /
# kv-dtype-v serves a long prompt disaggregated and a short one decode-local
# (disagg-threshold 32); both completions must equal pd-run's with the same
# dtypes, both daemons must report those dtypes and the block size the format
# gives (bytes per 32 K + 32 V values vs f16's 128), and the outputs must not
# all be the same across dtypes (the dtype reaches the math).
#   test_kv_dtypes.sh SRC_ROOT PDCTL PD_RUN MODEL.gguf
set -uo pipefail
SRC=$1 PDCTL=$2 PDRUN=$3 MODEL=$4
command -v curl >/dev/null 2>&1 || { echo "curl not installed: skip"; exit 77; }
T=$(mktemp -d /tmp/pdctl-kvdt.XXXXXX)
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
jget() { python3 -c 'import json,sys; j=json.loads(sys.stdin.read())
for k in sys.argv[1].split("."): j = j[k]
print(j)' "$1" 2>/dev/null; }

LONG="The quick brown fox jumps over the lazy dog, then naps under the old oak tree."
SHORT="Hi there"
f16_block=
outs=
# K V bytes-per-32-K-and-32-V-values
while read -r K V PER64; do
    rm -rf "$R"
    if ! "$PDCTL" up "$SRC/deploy/local-1p1d.ini" --run-dir "$R" \
        --set router.http=127.0.0.1:0 --set router.control=127.0.0.1:0 \
        --set deployment.model="$MODEL" --set kv-dtype-k="$K" --set kv-dtype-v="$V" \
        >"$T/up.out" 2>&1; then
        bad "k=$K v=$V: pdctl up failed: $(tail -3 "$T/up.out")"
        continue
    fi
    URL=$(cat "$R/url")
    d0=$("$PDCTL" stats router --json --run-dir "$R" 2>/dev/null)
    for p in "$LONG" "$SHORT"; do
        body=$(python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1], "max_tokens": 16, "temperature": 0}))' "$p")
        resp=$(curl -s -m 60 "$URL/v1/completions" -H 'Content-Type: application/json' -d "$body")
        got=$(python3 -c 'import json,sys; print(json.dumps(json.loads(sys.stdin.read())["choices"][0]["text"]))' <<<"$resp" 2>/dev/null)
        want=$("$PDRUN" --model "$MODEL" --prompt "$p" --max-tokens 16 --threads 1 \
                 --kv-k "$K" --kv-v "$V" 2>/dev/null |
               python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()[:-1]))')
        if [ -n "$got" ] && [ "$got" = "$want" ]; then ok "k=$K v=$V, ${#p} bytes: $got"
        else bad "k=$K v=$V, ${#p} bytes: served $got ($resp), pd-run $want"; fi
        outs="$outs"$'\n'"$got"
    done
    d1=$("$PDCTL" stats router --json --run-dir "$R" 2>/dev/null)
    nd=$(python3 -c 'import json,sys,re
def f(s, k): return float(re.search(r"\"%s\": *([0-9.]+)" % k, s).group(1))
print(int(f(sys.argv[2], "requests_disaggregated") - f(sys.argv[1], "requests_disaggregated")),
      int(f(sys.argv[2], "requests_local") - f(sys.argv[1], "requests_local")))' "$d0" "$d1" 2>/dev/null)
    [ "$nd" = "1 1" ] && ok "k=$K v=$V: one disaggregated, one decode-local" ||
        bad "k=$K v=$V: disaggregated, local = ${nd:-?} (want 1 1)"
    for d in prefill-0 decode-0; do
        kv=$("$PDCTL" admin "$d" kv --run-dir "$R" --json 2>/dev/null)
        dk=$(jget kv_dtype_k <<<"$kv") dv=$(jget kv_dtype_v <<<"$kv") bb=$(jget block_bytes <<<"$kv")
        [ "$dk $dv" = "$K $V" ] || bad "$d: kv_dtype_k/v $dk/$dv, want $K/$V"
        [ -z "$f16_block" ] && f16_block=$bb
        [ "$((bb * 128))" = "$((f16_block * PER64))" ] ||
            bad "$d k=$K v=$V: block_bytes $bb, want $f16_block * $PER64 / 128"
    done
    ok "k=$K v=$V: both daemons store blocks of $bb bytes (f16: $f16_block)"
    "$PDCTL" down --run-dir "$R" >/dev/null 2>&1 || bad "k=$K v=$V: pdctl down"
done <<'EOF_DT'
f16 f16 128
bf16 bf16 128
q8_0 q8_0 68
fp8_e4m3 fp8_e4m3 66
q4_0 q4_0 36
q8_0 q4_0 52
fp8_e4m3 bf16 97
EOF_DT
distinct=$(sort -u <<<"$outs" | grep -c .)
[ "$distinct" -ge 6 ] && ok "$distinct distinct completions over 7 dtype pairs" ||
    bad "only $distinct distinct completions: the dtype does not reach the math?"
[ $fails = 0 ]
