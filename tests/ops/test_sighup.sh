#!/usr/bin/env bash
# tests/ops: SIGHUP (logrotate's postrotate) reopens the log file of the
# router and of a daemon, and never stops them.
#   test_sighup.sh ROUTER DECODE MODEL
# The log files are moved away, SIGHUP sent twice: each process is alive
# after it, writes "log file reopened" into a new file at the old path, and
# the router still answers /health; SIGTERM still stops both. The decode
# logs in log.format = json: each of its lines must parse. Both speak
# systemd's notify protocol to a stand-in socket: READY, STATUS, a watchdog
# fed from the loop, STOPPING at SIGTERM.
set -u
ROUTER=$1 DECODE=$2 MODEL=$3
command -v curl >/dev/null 2>&1 || { echo "skip: curl"; exit 77; }
T=$(mktemp -d /tmp/pd-hup.XXXXXX)
fails=0
ok()  { echo "ok   - $*"; }
bad() { echo "FAIL - $*"; fails=$((fails + 1)); }
poll() { local end=$((SECONDS + $1)); shift; until "$@"; do [ $SECONDS -lt $end ] || return 1; sleep 0.05; done; }
cleanup() { kill -KILL "${RPID:-}" "${DPID:-}" "${NPID:-}" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT

# systemd's notify protocol (the units are Type=notify): one datagram
# socket per process stands in for systemd and records what each one says
python3 - "$T" <<'EOF' &
import os, select, socket, sys
t = sys.argv[1]
socks = {}
for who in ("router", "decode"):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(f"{t}/{who}.notify")
    socks[s] = who
open(f"{t}/notify.up", "w").close()
with open(f"{t}/notify.log", "a", buffering=1) as log:
    while True:
        for s in select.select(list(socks), [], [])[0]:
            for line in s.recv(4096).decode().split("\n"):
                log.write(f"{socks[s]} {line}\n")
EOF
NPID=$!
poll 10 test -e "$T/notify.up" || { bad "notify listener"; exit 1; }
export WATCHDOG_USEC=200000
NOTIFY_SOCKET=$T/router.notify "$ROUTER" --model="$MODEL" --insecure-no-auth --http=127.0.0.1:0 --control=127.0.0.1:0 \
    --log.file="$T/router.log" --ready-file="$T/router.ready" 2>"$T/router.err" &
RPID=$!
poll 20 test -s "$T/router.ready" || { bad "router not ready"; cat "$T/router.err" "$T/router.log"; exit 1; }
HTTP=$(sed -E 's/.*"http":([0-9]+).*/\1/' "$T/router.ready")
CTL=$(sed -E 's/.*"control":([0-9]+).*/\1/' "$T/router.ready")
NOTIFY_SOCKET=$T/decode.notify "$DECODE" --model="$MODEL" --insecure-no-auth --router=127.0.0.1:$CTL --kv-blocks=64 \
    --threads=1 --log.file="$T/decode.log" --log.format=json --ready-file="$T/decode.ready" 2>"$T/decode.err" &
DPID=$!
poll 20 test -s "$T/decode.ready" || { bad "decode not registered"; cat "$T/decode.err" "$T/decode.log"; exit 1; }

for who in router decode; do
    pid=$RPID; [ $who = decode ] && pid=$DPID
    for round in 1 2; do
        mv "$T/$who.log" "$T/$who.log.$round"
        kill -HUP "$pid"
        if poll 10 grep -q "SIGHUP: log file reopened" "$T/$who.log" 2>/dev/null; then
            ok "$who: SIGHUP $round reopened its log file"
        else
            bad "$who: no new log file after SIGHUP $round"
        fi
        kill -0 "$pid" 2>/dev/null && ok "$who alive after SIGHUP $round" || bad "$who exited on SIGHUP $round"
    done
done
# the decode logs in log.format = json: every line of every file is one object
if python3 - "$T"/decode.log* <<'EOF'
import json, sys
n = 0
for p in sys.argv[1:]:
    for line in open(p, encoding="utf-8"):
        o = json.loads(line); n += 1
        assert {"ts", "mono", "level", "comp", "msg"} <= o.keys(), line
assert n >= 3, n
EOF
then ok "decode: log.format=json lines all parse"; else bad "decode: log.format=json: a line is not JSON"; fi
code=$(curl -s -o /dev/null -w '%{http_code}' -m 5 "http://127.0.0.1:$HTTP/health")
[ "$code" = 200 ] && ok "router answers /health after the SIGHUPs" || bad "router /health: $code"
# the loops feed the watchdog every 100 ms: give each time for 3 feeds (a
# loaded box may have booted the decode just before the SIGHUPs)
fed3() { [ "$(grep -c "^$1 WATCHDOG=1" "$T/notify.log")" -ge 3 ]; }
poll 10 fed3 router; poll 10 fed3 decode
kill -TERM "$DPID" "$RPID"
stopped() { ! kill -0 "$RPID" 2>/dev/null && ! kill -0 "$DPID" 2>/dev/null; }
poll 40 stopped && ok "SIGTERM still stops both" || bad "not stopped by SIGTERM"
nl() { grep -c "^$1 $2" "$T/notify.log"; }
for who in router decode; do
    [ "$(nl $who READY=1)" = 1 ] && ok "$who: sd_notify READY=1 once" || bad "$who: READY=1 $(nl $who READY=1) times"
    [ "$(nl $who WATCHDOG=1)" -ge 3 ] && ok "$who: the loop fed the watchdog ($(nl $who WATCHDOG=1) times)" ||
        bad "$who: WATCHDOG=1 $(nl $who WATCHDOG=1) times"
    [ "$(nl $who STOPPING=1)" = 1 ] && ok "$who: STOPPING=1 at SIGTERM" || bad "$who: no STOPPING=1"
done
grep -q "^router STATUS=serving: http 127.0.0.1:0 (port $HTTP)" "$T/notify.log" && ok "router: STATUS names its ports" ||
    bad "router: STATUS: $(grep '^router STATUS' "$T/notify.log")"
grep -q "^decode STATUS=serving: registered with 1 of 1 routers" "$T/notify.log" && ok "decode: STATUS after it registered" ||
    bad "decode: STATUS: $(grep '^decode STATUS' "$T/notify.log")"
[ $fails = 0 ] && echo "test_sighup: all ok"
exit $((fails > 0))
