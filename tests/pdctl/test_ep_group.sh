#!/usr/bin/env bash
# tests/pdctl: an expert-parallel decode group through `pdctl up` (issue 36),
# real processes on loopback. A generated qwen3moe model (64 experts, top-8)
# served by 1 prefill + one decode of `ep = 2` (two rank processes) gives
# the same tokens as the same deployment with `ep = 1` (one whole daemon),
# for greedy and seeded sampling, disaggregated (long prompts) and
# decode-local (the rest), twelve requests at once so both ranks serve; the
# group stops cleanly on `pdctl down`. Failover: two groups of 2 (decode =
# 2, ep = 2); a long stream's rank is killed -9 mid-stream, the stream
# finishes with no error and the reference's tokens (the router replays it
# on the other group; the dead rank's partner leaves with "EP group lost a
# rank").
# The same with `ep-overlap` (two micro-batches per pass, the window's post
# and wait). The same twelve requests through one group of `ep = 4` (four ranks, all
# serving) equal ep = 1's too. A group of 4 beside a whole-model decode
# (decode = 2, ep = 4, whole = 1; the router's max-retries left to pdctl:
# 5): a group rank serving one of three concurrent long streams is killed
# -9, all three finish with the reference's tokens, the group's replayed
# onto decode-1, and the group's three other ranks report it lost.
# A dense model with ep = 2 is refused by `pdctl up` before anything starts,
# and so are whole >= decode and whole with ep = 1.
#   test_ep_group.sh SRC_ROOT PDCTL MODEL.gguf DENSE.gguf
set -uo pipefail
SRC=$1 PDCTL=$2 MODEL=$3 DENSE=$4
command -v curl >/dev/null 2>&1 || { echo "curl not installed: skip"; exit 77; }
T=$(mktemp -d /tmp/pdctl-ep.XXXXXX)
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

# dep NAME DECODES EP [WHOLE [MAX-RETRIES]]: a deployment file (WHOLE: [decode]
# whole, the last WHOLE decodes hold the whole model; MAX-RETRIES "-": unset)
dep() {
    local whole=${4:-0} mr=${5:-4}
    cat >"$T/$1.ini" <<EOF
[deployment]
name = $1
model = $MODEL
prefill = 1
decode = $2
disagg-mode = threshold
disagg-threshold = 128
[router]
http = 127.0.0.1:0
control = 127.0.0.1:0
$([ "$mr" = - ] || echo "max-retries = $mr")
[prefill]
threads = 1
kv-blocks = 512
[decode]
ep = $3
$([ "$whole" = 0 ] || echo "whole = $whole")
threads = 1
kv-blocks = 512
max-batch = 16
ep-timeout = 2s
EOF
}
up() { # up NAME: pdctl up into $T/run-NAME
    if "$PDCTL" up "$T/$1.ini" --run-dir "$T/run-$1" >"$T/up-$1.out" 2>&1; then
        ok "pdctl up $1"
    else
        bad "pdctl up $1: $(tail -5 "$T/up-$1.out")"
        exit 1
    fi
}
tokens_out() { # tokens_out RUN DAEMON
    "$PDCTL" stats "$2" --json --run-dir "$1" 2>/dev/null |
        python3 -c 'import json,sys; print(int(json.load(sys.stdin)["stats"][0]["values"]["tokens_out"]))' 2>/dev/null ||
        echo 0
}

# twelve requests at once: 4 decode-local prompts (one of ~110 tokens: its
# chunk takes two forward passes on its rank while the other pads with an
# idle one) + 2 long disaggregated ones (disagg-threshold 128), each greedy
# and seeded (temperature 0.9, seed); one line each
batch() { # batch URL OUT
    python3 - "$1" >"$2" <<'PY'
import json, sys, threading, urllib.request
url = sys.argv[1]
prompts = ["Hi", "What is two plus two?", "Name a colour.",
           "The quick brown fox jumps over the lazy dog, then naps under the old oak tree for a while.",
           "Write a long story about a lighthouse keeper who finds a message in a bottle on the shore one morning, "
           "and follow the message across the sea to the person who wrote it, many years before, in another land.",
           "Explain in detail why the sky is blue during the day and red at sunset, with the physics involved: "
           "Rayleigh scattering, the path length through the air, and what clouds and dust do to the colours we see."]
reqs = []
for p in prompts:
    reqs.append({"messages": [{"role": "user", "content": p}], "max_tokens": 32, "temperature": 0})
    reqs.append({"messages": [{"role": "user", "content": p}], "max_tokens": 32, "temperature": 0.9,
                 "seed": 1234})
out = [None] * len(reqs)
def go(i):
    try:
        r = urllib.request.Request(url + "/v1/chat/completions", json.dumps(reqs[i]).encode(),
                                   {"Content-Type": "application/json"})
        j = json.load(urllib.request.urlopen(r, timeout=60))
        c = j["choices"][0]
        out[i] = json.dumps([c["message"]["content"], c["finish_reason"],
                             j["usage"]["completion_tokens"]])
    except Exception as e:
        out[i] = "ERROR " + repr(e)
ts = [threading.Thread(target=go, args=(i,)) for i in range(len(reqs))]
for t in ts: t.start()
for t in ts: t.join()
print("\n".join(out))
PY
}

# ---- a dense model cannot be split -------------------------------------------
dep dense 1 2
sed -i "s#^model = .*#model = $DENSE#" "$T/dense.ini"
"$PDCTL" up "$T/dense.ini" --run-dir "$T/run-dense" >"$T/dense.out" 2>&1
rc=$?
if [ $rc = 2 ] && grep -q "ep = 2: a rank does not load: .*needs a MoE model" "$T/dense.out" &&
   [ ! -e "$T/run-dense/deployment.json" ]; then
    ok "dense model, ep = 2: refused at up, nothing started"
else bad "dense model, ep = 2: rc $rc: $(cat "$T/dense.out")"; fi

# ---- [decode] whole: combinations refused at load, nothing started -------------
refused() { # refused NAME WANT-REGEX
    "$PDCTL" up "$T/$1.ini" --run-dir "$T/run-$1" >"$T/$1.out" 2>&1
    local rc=$?
    if [ $rc = 2 ] && grep -q "$2" "$T/$1.out" && [ ! -e "$T/run-$1/deployment.json" ]; then
        ok "$1: refused ($(head -1 "$T/$1.out" | sed 's/.*: \[decode\]/[decode]/'))"
    else bad "$1: rc $rc: $(cat "$T/$1.out")"; fi
}
dep whole-all 2 2 2
refused whole-all "whole = 2 with decode = 2: no EP group is left"
dep whole-ep1 2 1 1
refused whole-ep1 "whole = 1 needs ep > 1"

# ---- correctness: ep = 1 (reference) vs ep = 2 --------------------------------
dep ref 1 1
dep ep2 1 2
up ref
batch "$(cat "$T/run-ref/url")" "$T/ref.txt"
# the long stream's reference (greedy), for the failover below
STREAM='{"messages": [{"role": "user", "content": "Tell me everything you know, at length."}], "max_tokens": 1500, "temperature": 0}'
curl -s -m 60 "$(cat "$T/run-ref/url")/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "$STREAM" | python3 -c 'import json,sys; c=json.load(sys.stdin)["choices"][0]; print(json.dumps(c["message"]["content"]))' \
    >"$T/ref-stream.txt"
"$PDCTL" down --run-dir "$T/run-ref" >/dev/null 2>&1
up ep2
st=$("$PDCTL" status --run-dir "$T/run-ep2" 2>&1)
if grep -q "decode-0.r0 .*decode ep decode-0 rank 0 .*ready" <<<"$st" &&
   grep -q "decode-0.r1 .*decode ep decode-0 rank 1 .*ready" <<<"$st"; then
    ok "pdctl status: the group's two ranks, ready"
else bad "pdctl status: $st"; fi
batch "$(cat "$T/run-ep2/url")" "$T/ep2.txt"
if grep -q ERROR "$T/ref.txt" "$T/ep2.txt"; then
    bad "a request failed: $(grep -h ERROR "$T/ref.txt" "$T/ep2.txt" | head -2)"
elif cmp -s "$T/ref.txt" "$T/ep2.txt"; then
    ok "ep = 2: the 12 completions (greedy, seeded; local, disaggregated) equal ep = 1's"
else
    bad "ep = 2 differs from ep = 1: $(diff "$T/ref.txt" "$T/ep2.txt" | head -6)"
fi
nd=$("$PDCTL" stats router --json --run-dir "$T/run-ep2" 2>/dev/null | python3 -c 'import sys,re
s = sys.stdin.read()
f = lambda k: int(float(re.search(r"\"%s\": *([0-9.]+)" % k, s).group(1)))
print(f("requests_disaggregated"), f("requests_local"))' 2>/dev/null)
if [ "$nd" = "4 8" ]; then ok "ep = 2: 4 requests disaggregated, 8 decode-local"
else bad "ep = 2: disaggregated / local: '$nd', want '4 8'"; fi
t0=$(tokens_out "$T/run-ep2" decode-0.r0) t1=$(tokens_out "$T/run-ep2" decode-0.r1)
if [ "$t0" -gt 0 ] && [ "$t1" -gt 0 ]; then ok "both ranks served (tokens out: $t0, $t1)"
else bad "both ranks should serve: tokens out $t0, $t1"; fi
s=$SECONDS
if "$PDCTL" down --run-dir "$T/run-ep2" >"$T/down.out" 2>&1 && [ $((SECONDS - s)) -lt 20 ] &&
   ! grep -q "EP group lost" "$T"/run-ep2/decode-0.r*.log &&
   [ "$(grep -c "drained: flushing and exiting" "$T"/run-ep2/decode-0.r*.log | grep -c ':1$')" = 2 ]; then
    ok "pdctl down: the group left together in $((SECONDS - s)) s"
else bad "pdctl down of the group: $(cat "$T/down.out"; tail -3 "$T"/run-ep2/decode-0.r*.log)"; fi

# ---- ep = 2 with two micro-batches per pass (ep-overlap): the same tokens ----
dep ep2ov 1 2
echo "ep-overlap = true" >>"$T/ep2ov.ini"
up ep2ov
batch "$(cat "$T/run-ep2ov/url")" "$T/ep2ov.txt"
if [ "$(grep -l "EP group: rank .*two micro-batches per pass" "$T"/run-ep2ov/decode-0.r*.log | wc -l)" != 2 ]; then
    bad "ep-overlap: the ranks do not log two micro-batches: $(grep -h "EP group: rank" "$T"/run-ep2ov/decode-0.r*.log)"
elif ! grep -q ERROR "$T/ep2ov.txt" && cmp -s "$T/ref.txt" "$T/ep2ov.txt"; then
    ok "ep = 2, ep-overlap (two micro-batches per pass, post/wait on the window): the 12 completions equal ep = 1's"
else
    bad "ep-overlap differs from ep = 1 (or failed): $(diff "$T/ref.txt" "$T/ep2ov.txt" | head -6)"
fi
"$PDCTL" down --run-dir "$T/run-ep2ov" >/dev/null 2>&1

# ---- correctness: ep = 4 (four ranks, 16 experts each) vs ep = 1 -------------
dep ep4 1 4 0 -
up ep4
st=$("$PDCTL" status --run-dir "$T/run-ep4" 2>&1)
if [ "$(grep -c "decode-0.r[0-3] .*decode ep decode-0 rank [0-3] .*ready" <<<"$st")" = 4 ] &&
   grep -q "^max-retries = 5$" "$T/run-ep4/router.ini"; then
    ok "pdctl status: the group's four ranks, ready; router max-retries = 5 (set by pdctl)"
else bad "pdctl status (ep = 4): $st; $(grep max-retries "$T/run-ep4/router.ini")"; fi
batch "$(cat "$T/run-ep4/url")" "$T/ep4.txt"
if grep -q ERROR "$T/ep4.txt"; then
    bad "ep = 4: a request failed: $(grep -h ERROR "$T/ep4.txt" | head -2)"
elif cmp -s "$T/ref.txt" "$T/ep4.txt"; then
    ok "ep = 4: the 12 completions (greedy, seeded; local, disaggregated) equal ep = 1's"
else
    bad "ep = 4 differs from ep = 1: $(diff "$T/ref.txt" "$T/ep4.txt" | head -6)"
fi
served=0 touts=""
for k in 0 1 2 3; do
    t=$(tokens_out "$T/run-ep4" decode-0.r$k)
    touts="$touts $t"
    [ "$t" -gt 0 ] && served=$((served + 1))
done
if [ $served = 4 ]; then ok "ep = 4: every rank served (tokens out:$touts)"
else bad "ep = 4: every rank should serve: tokens out$touts"; fi
s=$SECONDS
if "$PDCTL" down --run-dir "$T/run-ep4" >"$T/down4.out" 2>&1 && [ $((SECONDS - s)) -lt 20 ] &&
   ! grep -q "EP group lost" "$T"/run-ep4/decode-0.r*.log; then
    ok "pdctl down: the group of 4 left together in $((SECONDS - s)) s"
else bad "pdctl down of the group of 4: $(cat "$T/down4.out"; tail -3 "$T"/run-ep4/decode-0.r*.log)"; fi

# ---- failover: two groups of 2, one rank of the serving group killed ------------
dep fo 2 2
up fo
grep -q "^max-retries = 4$" "$T/run-fo/router.ini" && ok "the file's max-retries = 4 is kept" ||
    bad "max-retries: $(grep max-retries "$T/run-fo/router.ini")"
URL=$(cat "$T/run-fo/url")
python3 - "$URL" "$STREAM" "$PDCTL" "$T/run-fo" >"$T/fo.txt" 2>"$T/fo.err" <<'PY'
import json, os, signal, subprocess, sys, urllib.request
url, body, pdctl, run = sys.argv[1:5]
req = json.loads(body)
req["stream"] = True
r = urllib.request.Request(url + "/v1/chat/completions", json.dumps(req).encode(),
                           {"Content-Type": "application/json"})
resp = urllib.request.urlopen(r, timeout=90)
text, n, killed, err, finish = "", 0, None, None, None
def live(name):
    o = subprocess.run([pdctl, "stats", name, "--json", "--run-dir", run], capture_output=True,
                       text=True).stdout
    try:
        return json.loads(o)["stats"][0]["values"]["live"]
    except Exception:
        return 0
for line in resp:
    line = line.decode().strip()
    if not line.startswith("data: ") or line == "data: [DONE]":
        continue
    j = json.loads(line[6:])
    if "error" in j:
        err = j["error"]
        break
    c = j["choices"][0]
    text += c["delta"].get("content") or ""
    finish = c.get("finish_reason") or finish
    n += 1
    if n == 20 and killed is None:
        for name in ["decode-0.r0", "decode-0.r1", "decode-1.r0", "decode-1.r1"]:
            if live(name) > 0:
                pid = int(open(os.path.join(run, name + ".pid")).read())
                os.kill(pid, signal.SIGKILL)
                killed = name
                break
print(json.dumps(text))
print(killed, finish, json.dumps(err), file=sys.stderr)
PY
read -r killed finish errj <"$T/fo.err" || true
if [ "$killed" = None ] || [ -z "$killed" ]; then
    bad "failover: no rank was serving the stream at its 20th chunk ($(cat "$T/fo.err"))"
elif [ "$errj" != null ] || [ "$finish" = None ]; then
    bad "failover: the stream ended with an error after $killed was killed: $(cat "$T/fo.err")"
elif cmp -s "$T/fo.txt" "$T/ref-stream.txt"; then
    ok "failover: $killed killed -9 mid-stream; the stream finished ($finish) with the reference's tokens"
else
    bad "failover: tokens differ from the reference after $killed was killed: $(head -c 200 "$T/fo.txt") vs $(head -c 200 "$T/ref-stream.txt")"
fi
# the killed rank's partner leaves with the group
if [ -n "$killed" ] && [ "$killed" != None ]; then
    partner=${killed%.r*}.r$((1 - ${killed##*.r}))
    i=0
    until grep -q "EP group lost a rank" "$T/run-fo/$partner.log" 2>/dev/null; do
        i=$((i + 1)); [ $i -lt 100 ] || break; sleep 0.1
    done
    if grep -q "EP group lost a rank" "$T/run-fo/$partner.log"; then
        ok "$partner: $(grep -h 'EP group lost' "$T/run-fo/$partner.log" | sed 's/.*EP group/EP group/')"
    else bad "$partner did not report the group lost: $(tail -3 "$T/run-fo/$partner.log")"; fi
fi
"$PDCTL" down --run-dir "$T/run-fo" >/dev/null 2>&1

# ---- a group of 4 beside a whole-model decode: decode = 2, ep = 4, whole = 1 ---
# (decode-0.r0 .. .r3 and decode-1), max-retries left to pdctl (2 + ep - 1 =
# 5). Three copies of the long stream at once (the router spreads them, so
# at least one runs on the group); at the first one's 20th chunk the group
# rank serving a stream is killed -9: the group goes (its three other ranks
# report it), every stream finishes with the reference's tokens, replayed
# onto the whole daemon.
dep mix 2 4 1 -
up mix
st=$("$PDCTL" status --run-dir "$T/run-mix" 2>&1)
if [ "$(grep -c "decode-0.r[0-3] .*decode ep decode-0 rank [0-3] .*ready" <<<"$st")" = 4 ] &&
   grep -Eq "^ *decode-1 +decode .*ready" <<<"$st" && ! grep -q "decode-1.r" <<<"$st" &&
   grep -q "^max-retries = 5$" "$T/run-mix/router.ini"; then
    ok "pdctl status: a group of 4 and a whole decode, ready; router max-retries = 5"
else bad "pdctl status (group + whole): $st; $(grep max-retries "$T/run-mix/router.ini")"; fi
URL=$(cat "$T/run-mix/url")
python3 - "$URL" "$STREAM" "$PDCTL" "$T/run-mix" >"$T/mix.txt" 2>"$T/mix.err" <<'PY'
import json, os, signal, subprocess, sys, threading, urllib.request
url, body, pdctl, run = sys.argv[1:5]
req = json.loads(body)
req["stream"] = True
lock = threading.Lock()
killed = [None]
def live(name):
    o = subprocess.run([pdctl, "stats", name, "--json", "--run-dir", run], capture_output=True,
                       text=True).stdout
    try:
        return json.loads(o)["stats"][0]["values"]["live"]
    except Exception:
        return 0
res = [None] * 3
def go(i):
    text, n, err, finish = "", 0, None, None
    try:
        r = urllib.request.Request(url + "/v1/chat/completions", json.dumps(req).encode(),
                                   {"Content-Type": "application/json"})
        for line in urllib.request.urlopen(r, timeout=120):
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            j = json.loads(line[6:])
            if "error" in j:
                err = j["error"]
                break
            c = j["choices"][0]
            text += c["delta"].get("content") or ""
            finish = c.get("finish_reason") or finish
            n += 1
            if n == 20:
                with lock:
                    if killed[0] is None:
                        killed[0] = "none"
                        for name in ["decode-0.r%d" % k for k in range(4)]:
                            if live(name) > 0:
                                pid = int(open(os.path.join(run, name + ".pid")).read())
                                os.kill(pid, signal.SIGKILL)
                                killed[0] = name
                                break
    except Exception as e:
        err = repr(e)
    res[i] = (text, finish, err)
ts = [threading.Thread(target=go, args=(i,)) for i in range(3)]
for t in ts: t.start()
for t in ts: t.join()
for text, finish, err in res:
    print(json.dumps(text))
    print(finish, json.dumps(err), file=sys.stderr)
print(killed[0], file=sys.stderr)
PY
killed=$(tail -1 "$T/mix.err")
ref=$(cat "$T/ref-stream.txt")
same=$(grep -cxF -- "$ref" "$T/mix.txt")
if [ "$killed" = none ] || [ -z "$killed" ]; then
    bad "group + whole: no group rank served a stream at the 20th chunk ($(cat "$T/mix.err"))"
elif [ "$(head -3 "$T/mix.err" | grep -cv '^None \|null$')" != 0 ] ||
     [ "$(head -3 "$T/mix.err" | grep -c ' null$')" != 3 ]; then
    bad "group + whole: a stream ended with an error after $killed was killed: $(cat "$T/mix.err")"
elif [ "$same" = 3 ]; then
    ok "group + whole: $killed killed -9 mid-stream; the 3 streams finished with the reference's tokens"
else
    bad "group + whole: $same of 3 streams equal the reference after $killed was killed"
fi
nf=$(grep -c "failover .* to 'decode-1'" "$T/run-mix/router.log" 2>/dev/null)
if [ "${nf:-0}" -gt 0 ]; then ok "group + whole: $nf stream(s) replayed onto decode-1 (the whole daemon)"
else bad "group + whole: no failover onto decode-1 in the router log: $(grep -h "failover\|retry" "$T/run-mix/router.log" | head -5)"; fi
if [ -n "$killed" ] && [ "$killed" != none ]; then
    lost=0
    for k in 0 1 2 3; do
        [ "decode-0.r$k" = "$killed" ] && continue
        i=0
        until grep -q "EP group lost a rank" "$T/run-mix/decode-0.r$k.log" 2>/dev/null; do
            i=$((i + 1)); [ $i -lt 100 ] || break; sleep 0.1
        done
        grep -q "EP group lost a rank" "$T/run-mix/decode-0.r$k.log" && lost=$((lost + 1))
    done
    if [ $lost = 3 ]; then ok "group of 4: the three other ranks report the group lost"
    else bad "group of 4: $lost of 3 other ranks report the group lost"; fi
fi
"$PDCTL" down --run-dir "$T/run-mix" >/dev/null 2>&1
[ "$fails" = 0 ] || { echo "$fails failure(s) (KEEP=1 keeps $T)"; exit 1; }
exit 0
