#!/bin/bash
# netns_e2e.sh BUILD_ROOT [PD_RUN] - pd-router, pd-prefill and pd-decode on three
# "hosts" (network namespaces joined by a bridge in a fourth, "switch",
# namespace), started by `pdctl up` with a [netns] section; KV over UCX tcp
# between the namespaces. Greedy outputs of several prompts (> 1 KV block
# included) must equal pd-run's with the disaggregated path forced
# (disagg-mode = always), and the decode's `xfer` must show bytes pulled from
# the prefill. Needs root (ip netns add): exit 77 (SKIP) with a message if not
# permitted. Addresses: 198.18.N.0/24 (RFC 2544 benchmark range) inside the
# namespaces, plus one on a veth this test adds to the root namespace (pdctl
# polls the router's GET /ready from there). Everything is removed on exit.
set -u
BUILD=${1:?usage: netns_e2e.sh BUILD_ROOT}
BUILD=$(cd "$BUILD" && pwd)
PDCTL=$BUILD/tools/pdctl/pdctl
PDRUN=${2:-$BUILD/engine/pd-run}
MODEL=$BUILD/engine/gguf/builtin.gguf

skip() { echo "SKIP: $*" >&2; exit 77; }
die() { echo "FAIL: $*" >&2; exit 1; }

command -v ip >/dev/null || skip "iproute2 (ip) not installed"
command -v curl >/dev/null || skip "curl not installed"
command -v jq >/dev/null || skip "jq not installed"
for b in "$PDCTL" "$PDRUN" "$MODEL"; do [ -e "$b" ] || die "missing $b (build first)"; done

. "$(dirname "$0")/netns_lib.sh"
TMP=$(mktemp -d /tmp/pd-netns.XXXXXX)
UP=0

cleanup() {
    rc=$?
    trap - EXIT INT TERM
    if [ "$UP" = 1 ]; then
        "$PDCTL" down --run-dir "$TMP/run" >"$TMP/down.out" 2>&1 ||
            { echo "pdctl down failed:"; cat "$TMP/down.out"; } >&2
    fi
    netns_teardown
    if [ "$rc" != 0 ] && [ "$rc" != 77 ] && [ -d "$TMP/run" ]; then
        for f in "$TMP"/run/*.log; do
            [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; } >&2
        done
    fi
    [ -n "${E2E_KEEP:-}" ] || rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# switch: a bridge in its own namespace; each host: eth0 = 198.18.N.{1,2,3}
netns_hosts pd r p d
NS_R=${NS[r]} NS_P=${NS[p]} NS_D=${NS[d]}

cat >"$TMP/netns.ini" <<INI
[deployment]
name = netns-$ID
model = builtin
prefill = 1
decode = 1
run-dir = $TMP/run
disagg-mode = always
lease-ttl = 30s
transfer-timeout = 10s
ready-timeout = 60s
stop-timeout = 20s

[router]
http = $NET.1:0
control = $NET.1:0

[prefill]
threads = 1
kv-blocks = 256
metrics.listen = $NET.2:0

[decode]
threads = 1
kv-blocks = 256
metrics.listen = $NET.3:0

[env]
UCX_TLS = tcp
UCX_NET_DEVICES = eth0

[netns]
router = $NS_R
prefill-0 = $NS_P
decode-0 = $NS_D
INI

"$PDCTL" check "$TMP/netns.ini" || die "pdctl check rejected the deployment file"
"$PDCTL" up "$TMP/netns.ini" >"$TMP/up.out" 2>&1
rc=$?
cat "$TMP/up.out"
[ $rc = 0 ] || die "pdctl up exited $rc"
UP=1

# the daemons really run inside their namespaces
for pair in "router:$NS_R" "prefill-0:$NS_P" "decode-0:$NS_D"; do
    name=${pair%%:*} ns=${pair#*:}
    pid=$(cat "$TMP/run/$name.pid" 2>/dev/null)
    [ -n "$pid" ] || die "no pid file for $name"
    ip netns pids "$ns" | grep -qx "$pid" || die "$name (pid $pid) is not in namespace $ns"
done
HTTP=$(jq -r .http "$TMP/run/router.ready")
[ -n "$HTTP" ] && [ "$HTTP" != null ] || die "router ready file has no http port"
URL=http://$NET.1:$HTTP

# prompts: token ids, block-tokens 16 -> 1, 2, 3 and 7 blocks
n_ok=0
for len in 7 17 40 100; do
    ids=$(seq -s, 11 $((10 + len)) | awk -F, '{for(i=1;i<=NF;i++) printf "%s%d", (i>1?",":""), ($i*37)%250+4}')
    want=$("$PDRUN" --engine llama --model "$MODEL" --tokens "$ids" --max-tokens 24 \
           --temperature 0 --threads 1 2>/dev/null) || die "pd-run failed on $len tokens"
    body="{\"prompt\":[$ids],\"max_tokens\":24,\"temperature\":0}"
    # the client runs on the router's host (its namespace)
    out=$(ip netns exec "$NS_R" curl -sS --max-time 60 -H 'Content-Type: application/json' \
          -d "$body" "$URL/v1/completions") || die "request ($len tokens) failed: $out"
    got=$(printf '%s' "$out" | jq -r '.choices[0].text')
    [ "$got" = "$want" ] || die "prompt of $len tokens: got '$got', pd-run says '$want' (reply $out)"
    n_ok=$((n_ok + 1))
done
# streamed, from the root namespace over the host veth
ids=$(seq -s, 5 60)
want=$("$PDRUN" --engine llama --model "$MODEL" --tokens "$ids" --max-tokens 16 --temperature 0 \
       --threads 1 2>/dev/null)
got=$(curl -sS -N --max-time 60 -H 'Content-Type: application/json' \
      -d "{\"prompt\":[$ids],\"max_tokens\":16,\"temperature\":0,\"stream\":true}" \
      "$URL/v1/completions" | sed -n 's/^data: //p' | grep -v '^\[DONE\]$' |
      jq -j '.choices[0].text // empty')
[ "$got" = "$want" ] || die "streamed: got '$got', pd-run says '$want'"
echo "ok: $((n_ok + 1)) prompts equal pd-run's across namespaces"

# KV really crossed namespaces: decode pulled bytes from the prefill
x=$("$PDCTL" xfer decode-0 --json --run-dir "$TMP/run") || die "pdctl xfer decode-0 failed"
pulled=$(printf '%s' "$x" | jq '[.. | objects | .bytes_pulled? // empty] | max // 0')
pulls_ok=$(printf '%s' "$x" | jq '[.. | objects | .pulls_ok? // empty] | max // 0')
echo "decode xfer: pulls_ok=$pulls_ok bytes_pulled=$pulled"
[ "${pulls_ok%.*}" -ge 5 ] || die "decode reports $pulls_ok pulls, want >= 5: $x"
[ "${pulled%.*}" -gt 0 ] || die "decode pulled no KV bytes: $x"
m=$(ip netns exec "$NS_D" curl -sS --max-time 10 "http://$NET.3:$(jq -r .metrics "$TMP/run/decode-0.ready")/metrics") ||
    die "decode /metrics unreachable in its namespace"
printf '%s\n' "$m" | grep -q '^pd_kvx_bytes_pulled_total{.*} [1-9]' || die "decode /metrics: no KV bytes pulled"

"$PDCTL" down --run-dir "$TMP/run" >"$TMP/down.out" 2>&1 || { cat "$TMP/down.out"; die "pdctl down failed"; }
UP=0
if grep -l -E 'Sanitizer|runtime error:' "$TMP"/run/*.log 2>/dev/null; then
    die "sanitizer report in the daemon logs above"
fi
echo "PASS"
