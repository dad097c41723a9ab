#!/usr/bin/env bash
# tests/pdctl: an EP decode group of the sim engine through `pdctl up`
# (issue 36): the node's EP join is engine-generic (eng_ops_t ep_cap /
# ep_pass_rows), so a sim MoE layout (8 experts, top-2; real dispatch and
# combine byte volumes over the ranks' window, compute as sleeps) serves as
# one decode instance of ep = 2. Eight concurrent requests (4 decode-local,
# 4 disaggregated) give the same text as the same deployment with ep = 1,
# both ranks generate, and `down` is clean. The same group with two
# micro-batches per pass (overlap=1: the node's window gets micro-batch 1's
# slots, the exchanges go through post and wait) gives the same text too.
#   test_ep_sim.sh SRC_ROOT PDCTL
set -uo pipefail
SRC=$1 PDCTL=$2
command -v curl >/dev/null 2>&1 || { echo "curl not installed: skip"; exit 77; }
T=$(mktemp -d /tmp/pdctl-epsim.XXXXXX)
cleanup() {
    local d f
    for d in "$T"/run-*; do
        [ -f "$d/deployment.json" ] && "$PDCTL" down --run-dir "$d" >/dev/null 2>&1
        for f in "$d"/*.pid; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done
    done
    [ -n "${KEEP:-}" ] || rm -rf "$T"
}
trap cleanup EXIT
fails=0
ok()  { echo "ok   - $*"; }
bad() { echo "FAIL - $*"; fails=$((fails + 1)); }
MODEL="sim:layers=4,kv_heads=2,head_dim=32,vocab=32000,ctx=4096,experts=8,top=2,embd=256,first_dense=1,prefill_tps=20000,decode_ms=2+0.1*b"

up() {   # up NAME EP [SPEC-SUFFIX]
    if ! "$PDCTL" up "$SRC/tests/pdctl/plan-sim.ini" --run-dir "$T/run-$1" \
        --set "deployment.model=$MODEL${3:-}" --set deployment.disagg-mode=threshold \
        --set deployment.disagg-threshold=64 --set decode=1 --set decode.ep="$2" \
        >"$T/$1.up" 2>&1; then
        bad "up $1: $(tail -3 "$T/$1.up")"
        return 1
    fi
}
# ask NAME: 8 requests at once (prompts of 8 and 150 words: local and
# disaggregated), greedy; their texts in order to $T/NAME.out
ask() {
    local url i n
    url=$(cat "$T/run-$1/url")
    for i in 1 2 3 4 5 6 7 8; do
        n=$(( i % 2 ? 8 : 150 ))
        curl -sf "$url/v1/completions" -H 'Content-Type: application/json' \
            -d "{\"prompt\": \"$(yes "word$i" | head -n $n | tr '\n' ' ')\", \"max_tokens\": 24, \"temperature\": 0}" \
            >"$T/$1.$i.json" &
    done
    wait
    for i in 1 2 3 4 5 6 7 8; do
        python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"])' \
            "$T/$1.$i.json" 2>/dev/null || echo "ERROR $i"
    done >"$T/$1.out"
}
tokens_out() {   # tokens_out RUN DAEMON
    "$PDCTL" admin "$2" stats --run-dir "$1" --json |
        python3 -c 'import json,sys; j=json.load(sys.stdin); print(sum(int(t["values"]["tokens_out"]) for t in j["stats"] if t["table"] == "decode"))' 2>/dev/null || echo 0
}

# same_text NAME LABEL: NAME's texts equal ref's, and both ranks generated
same_text() {
    local a b
    if [ -s "$T/ref.out" ] && ! grep -q ERROR "$T/ref.out" "$T/$1.out" &&
       cmp -s "$T/ref.out" "$T/$1.out"; then
        ok "$2 gives ep = 1's text for 8 concurrent requests"
    else
        bad "$2: text differs from ep = 1 (or a request failed): $(diff "$T/ref.out" "$T/$1.out" | head -4)"
    fi
    a=$(tokens_out "$T/run-$1" decode-0.r0); b=$(tokens_out "$T/run-$1" decode-0.r1)
    if [ "$a" -gt 0 ] && [ "$b" -gt 0 ]; then ok "$2: both ranks generate ($a, $b tokens)"
    else bad "$2: a rank did not generate (r0 $a, r1 $b)"; fi
}

up ref 1 && ask ref
"$PDCTL" down --run-dir "$T/run-ref" >/dev/null 2>&1
up ep 2 && ask ep
same_text ep "ep = 2 (sim MoE layout)"
if "$PDCTL" down --run-dir "$T/run-ep" >"$T/down.out" 2>&1 && ! grep -qi "kill\|timed out" "$T/down.out"; then
    ok "down stops the group cleanly"
else
    bad "down: $(tail -3 "$T/down.out")"
fi
up ov 2 ,overlap=1 && ask ov
same_text ov "ep = 2 with two micro-batches per pass (overlap=1)"
"$PDCTL" down --run-dir "$T/run-ov" >/dev/null 2>&1
echo "$fails failure(s)"
[ $fails = 0 ]
