#!/bin/bash
# netns_ep.sh PDCTL - one EP decode group across two "hosts" (issue 36):
# network namespaces joined by a bridge in a "switch" namespace, the
# router and the prefill on one host, rank 0 of `decode-0` (ep = 2) on a
# second, rank 1 on a third ([netns] decode-0.r0 / decode-0.r1). The group's
# dispatch and combine go over tcp (`ep-tls = tcp`: one eager active message
# per peer and phase, kvxfer/DESIGN.md "Exchange windows") with two
# micro-batches per pass (the sim's overlap=1: two phases in flight per
# rank), KV pulls over UCX tcp too. Eight concurrent requests (4 decode-local,
# 4 disaggregated) must give the text of the same model with ep = 1 on
# loopback; both ranks generate; each rank runs in its namespace and logs
# its window over tcp on eth0. Needs root (ip netns add): exit 77 (SKIP)
# otherwise. Addresses: 198.18.N.0/24 inside the namespaces and one veth in
# the root namespace (pdctl polls the router from there); all removed on exit.
set -u
PDCTL=${1:?usage: netns_ep.sh PDCTL}

skip() { echo "SKIP: $*" >&2; exit 77; }
die() { echo "FAIL: $*" >&2; exit 1; }

command -v curl >/dev/null || skip "curl not installed"
command -v jq >/dev/null || skip "jq not installed"
[ -x "$PDCTL" ] || die "missing $PDCTL (build first)"

. "$(dirname "$0")/netns_lib.sh"
TMP=$(mktemp -d /tmp/pd-netns-ep.XXXXXX)
MODEL="sim:layers=4,kv_heads=2,head_dim=32,vocab=32000,ctx=4096,experts=8,top=2,embd=256,first_dense=1,prefill_tps=20000,decode_ms=2+0.1*b,overlap=1"

cleanup() {
    rc=$?
    trap - EXIT INT TERM
    for d in "$TMP"/run-*; do
        [ -f "$d/deployment.json" ] && "$PDCTL" down --run-dir "$d" >/dev/null 2>&1
    done
    netns_teardown
    if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then
        for f in "$TMP"/run-*/*.log; do
            [ -f "$f" ] && { echo "--- $f"; tail -n 20 "$f"; } >&2
        done
    fi
    [ -n "${E2E_KEEP:-}" ] || rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

netns_hosts pe r a b
NS_R=${NS[r]} NS_A=${NS[a]} NS_B=${NS[b]}

# ask NAME URL [NS]: 8 requests at once (prompts of 8 and 150 words: local
# and disaggregated), greedy; their texts in order to $TMP/NAME.out
ask() {
    local i n
    for i in 1 2 3 4 5 6 7 8; do
        n=$(( i % 2 ? 8 : 150 ))
        ${3:+ip netns exec "$3"} curl -sf --max-time 60 "$2/v1/completions" \
            -H 'Content-Type: application/json' \
            -d "{\"prompt\": \"$(yes "word$i" | head -n $n | tr '\n' ' ')\", \"max_tokens\": 24, \"temperature\": 0}" \
            >"$TMP/$1.$i.json" &
    done
    wait
    for i in 1 2 3 4 5 6 7 8; do
        jq -r '.choices[0].text' "$TMP/$1.$i.json" 2>/dev/null || echo "ERROR $i"
    done >"$TMP/$1.out"
}

# the reference: ep = 1 on loopback
cat >"$TMP/ref.ini" <<INI
[deployment]
name = ep-ref-$ID
model = $MODEL
prefill = 1
decode = 1
disagg-mode = threshold
disagg-threshold = 64
[router]
http = 127.0.0.1:0
control = 127.0.0.1:0
[prefill]
kv-blocks = 256
[decode]
kv-blocks = 256
INI
"$PDCTL" up "$TMP/ref.ini" --run-dir "$TMP/run-ref" >"$TMP/up-ref.out" 2>&1 ||
    die "pdctl up (reference): $(tail -3 "$TMP/up-ref.out")"
ask ref "$(cat "$TMP/run-ref/url")"
"$PDCTL" down --run-dir "$TMP/run-ref" >/dev/null 2>&1
grep -q ERROR "$TMP/ref.out" && die "reference: a request failed"

cat >"$TMP/ep.ini" <<INI
[deployment]
name = ep-hosts-$ID
model = $MODEL
prefill = 1
decode = 1
disagg-mode = threshold
disagg-threshold = 64
lease-ttl = 30s
transfer-timeout = 10s
ready-timeout = 60s
[router]
http = $NET.1:0
control = $NET.1:0
[prefill]
kv-blocks = 256
[decode]
ep = 2
ep-tls = tcp
ep-timeout = 5s
kv-blocks = 256
[env]
UCX_TLS = tcp
UCX_NET_DEVICES = eth0
[netns]
router = $NS_R
prefill-0 = $NS_R
decode-0.r0 = $NS_A
decode-0.r1 = $NS_B
INI
"$PDCTL" check "$TMP/ep.ini" >"$TMP/check.out" 2>&1 || die "pdctl check: $(cat "$TMP/check.out")"
"$PDCTL" up "$TMP/ep.ini" --run-dir "$TMP/run-ep" >"$TMP/up-ep.out" 2>&1 ||
    die "pdctl up (group across hosts): $(tail -5 "$TMP/up-ep.out")"
for pair in "decode-0.r0:$NS_A" "decode-0.r1:$NS_B" "router:$NS_R"; do
    name=${pair%%:*} ns=${pair#*:}
    pid=$(cat "$TMP/run-ep/$name.pid" 2>/dev/null)
    [ -n "$pid" ] || die "no pid file for $name"
    ip netns pids "$ns" | grep -qx "$pid" || die "$name (pid $pid) is not in namespace $ns"
done
echo "ok: router in $NS_R, decode-0.r0 in $NS_A, decode-0.r1 in $NS_B"
for r in 0 1; do
    grep -q "EP group: rank $r of 2 joined .*window over tcp" "$TMP/run-ep/decode-0.r$r.log" ||
        die "decode-0.r$r: no window over tcp: $(grep -h "EP group" "$TMP/run-ep/decode-0.r$r.log")"
done
echo "ok: $(grep -h "EP group: rank 1" "$TMP/run-ep/decode-0.r1.log" | sed 's/.*EP group/EP group/' | cut -c1-120)"
HTTP=$(jq -r .http "$TMP/run-ep/router.ready")
ask ep "http://$NET.1:$HTTP" "$NS_R"
grep -q ERROR "$TMP/ep.out" && die "group across hosts: a request failed: $(grep -n ERROR "$TMP/ep.out")"
cmp -s "$TMP/ref.out" "$TMP/ep.out" ||
    die "group across hosts: text differs from ep = 1: $(diff "$TMP/ref.out" "$TMP/ep.out" | head -4)"
echo "ok: 8 concurrent requests (4 disaggregated) equal ep = 1's text"
for r in 0 1; do
    t=$("$PDCTL" admin decode-0.r$r stats --run-dir "$TMP/run-ep" --json |
        jq '[.stats[] | select(.table == "decode") | .values.tokens_out | tonumber] | add // 0')
    [ "${t:-0}" -gt 0 ] || die "decode-0.r$r generated no tokens"
    echo "ok: decode-0.r$r generated $t tokens"
done
"$PDCTL" down --run-dir "$TMP/run-ep" >"$TMP/down.out" 2>&1 || die "pdctl down: $(cat "$TMP/down.out")"
if grep -l -E 'Sanitizer|runtime error:' "$TMP"/run-*/*.log 2>/dev/null; then
    die "sanitizer report in the daemon logs above"
fi
echo "PASS"
