#!/usr/bin/env bash
# tests/pdctl: the SLO planner (issue 35) against real deployments: router +
# sim-engine daemons on loopback (tests/pdctl/plan-sim.ini: budget 3, a
# prefill computes 4000 tokens/s, a decode step is 10 ms + 1 ms x batch),
# load from pd-bench. Every wait polls with a bound.
#   test_plan.sh phase|flap|mixed|leader SRC_ROOT PDCTL PD_BENCH
#   phase:  short chat, then long prompts: the planner re-splits 1:2 -> 2:1
#           within its bound (window + confirm ticks + the scale), zero
#           failed requests, its decision logged and in the metrics.
#   flap:   chat and long prompts alternating every 2 s: at most one
#           re-split, never back and forth.
#   mixed:  min-prefill 0 and tpot-p90 20 ms: light prompts (0.1 of a
#           prefill daemon) whose decodes need more than two daemons (chat
#           at 12 req/s, 128 tokens out: 3 decodes at full capacity) make
#           the planner switch to PD-mixed (0:3, routers disagg-mode never)
#           within its bound, heavy ones (long: 1.1 daemons, a pull far
#           cheaper than the stall a local prompt puts on its batch) back to
#           separate pools, zero failed requests across both switches.
#   leader: two planners: one leads, the other stands by; kill -9 the
#           leader, the other takes over (flock; then etcd when installed).
# PLAN_SET="planner.k=v ..." adds --set rows to `up` (to show a test fails
# with the planner's damping off, see tools/pdctl/README.md).
set -uo pipefail
MODE=$1 SRC=$2 PDCTL=$3 BENCH=$4
T=$(mktemp -d /tmp/pdctl-plan.XXXXXX)
cleanup() {
    local d f
    for d in "$T"/run*; do
        [ -f "$d/deployment.json" ] && "$PDCTL" down --run-dir "$d" >/dev/null 2>&1
        for f in "$d"/*.pid; do
            [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null
        done
    done
    [ -n "${KEEP:-}" ] || rm -rf "$T"
}
trap cleanup EXIT
fails=0
ok()   { echo "ok   - $*"; }
bad()  { echo "FAIL - $*"; fails=$((fails + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
poll() {     # poll SECONDS CMD...: until CMD succeeds
    local limit=$1; shift
    local end=$((SECONDS + limit))
    until "$@"; do
        [ $SECONDS -lt $end ] || return 1
        sleep 0.1
    done
}
json_get() { python3 -c "import json,sys; j=json.load(sys.stdin); print($1)"; }
SETS=()
for s in ${PLAN_SET:-}; do SETS+=(--set "$s"); done

up() {   # up RUN_DIR [--set ...]: a fresh plan-sim deployment
    local R=$1; shift
    if ! "$PDCTL" up "$SRC/tests/pdctl/plan-sim.ini" --run-dir "$R" "$@" "${SETS[@]}" >"$T/up.out" 2>&1; then
        bad "up: $(tail -5 "$T/up.out")"
        return 1
    fi
    URL=$(cat "$R/url")
}
# the phases (same seed each run): chat = short prompts, long answers at a
# high rate; long = long prompts, short answers
chat() { "$BENCH" --url "$URL" --rate 8 --duration "$1" --input-len 32 --prompt-ids 1000:30000 \
    --output-len 48 --ignore-eos --seed 1 --quiet --no-per-request --out "$2"; }
# chat whose decodes need all three daemons (the mixed test)
chat_heavy() { "$BENCH" --url "$URL" --rate 12 --duration "$1" --input-len 32 \
    --prompt-ids 1000:30000 --output-len 128 --ignore-eos --seed 1 --quiet --no-per-request --out "$2"; }
long() { "$BENCH" --url "$URL" --rate 3 --duration "$1" --input-len 1500 --prompt-ids 1000:30000 \
    --output-len 4 --ignore-eos --seed 2 --quiet --no-per-request --out "$2"; }
failed_of() { json_get 'j["results"]["failed"]' <"$1"; }
counts() {   # counts RUN_DIR -> "P:D" of live prefill / decode daemons
    "$PDCTL" status --run-dir "$1" --json |
        json_get '"%d:%d" % tuple(sum(1 for d in j["daemons"] if d["role"] == r and d["state"] == "ready") for r in ("prefill", "decode"))'
}
clean_logs() {   # clean_logs RUN_DIR: no sanitizer report from a planner (ASan tree)
    check "planner logs: no sanitizer report" bash -c '! grep -l "Sanitizer" "$1"/planner-*.log' _ "$1"
}
is_split() { [ "$(counts "$1" 2>/dev/null)" = "$2" ]; }
leader_of() {   # leader_of RUN_DIR -> the leading planner's name, or ""
    "$PDCTL" autoscale status --run-dir "$1" --json |
        json_get '",".join(p["name"] for p in j if p.get("leader"))'
}

phase() {
    local R=$T/run-phase t0 dt
    "$PDCTL" check "$SRC/tests/pdctl/plan-sim.ini" --set planner.bogus=1 >"$T/chk" 2>&1
    check "check: an unknown [planner] key is refused (exit 2)" bash -c \
        '[ $1 = 2 ] && grep -q "unknown key \"bogus\" in \[planner\]" "$2"' _ $? "$T/chk"
    "$PDCTL" check "$SRC/tests/pdctl/plan-sim.ini" --set planner.dwell=soon >"$T/chk" 2>&1
    check "check: a bad [planner] value is refused (exit 2)" bash -c \
        '[ $1 = 2 ] && grep -q "\[planner\] dwell: expected a duration" "$2"' _ $? "$T/chk"
    up "$R" || return
    "$PDCTL" autoscale on --run-dir "$R" >"$T/on.out" 2>&1
    check "autoscale on: planner-0 leads" grep -q "planner-0 started (pid [0-9]*, leader" "$T/on.out"
    chat 6s "$T/chat.json" || bad "pd-bench chat"
    check "chat phase: the planner holds 1:2" test "$(counts "$R")" = "1:2"
    "$PDCTL" plan --seconds 1 --run-dir "$R" >"$T/plan.out" 2>&1
    check "pdctl plan: a dry run names the budget and the split" \
        grep -qE "budget 3 daemons, running 1 prefill : 2 decode" "$T/plan.out"
    # the batch cap is the decodes' max-batch (64), not what their KV holds
    check "pdctl plan: the decodes' max-batch is the planner's batch bound" test "$("$PDCTL" plan \
        --seconds 1 --json --run-dir "$R" | json_get 'j["inputs"]["decode_max_batch"]')" = 64
    t0=$SECONDS
    long 24s "$T/long.json" &
    local bench=$!
    # the bound: window 3 s + confirm 2 ticks + the scale-up (start, register)
    if poll 20 is_split "$R" 2:1; then
        dt=$((SECONDS - t0))
        ok "long prompts: re-split to 2 prefill : 1 decode after ${dt}s (bound 20 s)"
    else
        bad "long prompts: no re-split to 2:1 in 20 s (now $(counts "$R"))"
    fi
    wait $bench || bad "pd-bench long"
    check "chat phase: zero failed requests" test "$(failed_of "$T/chat.json")" = 0
    check "long phase (across the re-split): zero failed requests" test "$(failed_of "$T/long.json")" = 0
    check "router: requests_failed 0" test "$("$PDCTL" admin router planner --run-dir "$R" --json |
        json_get 'j["counters"]["requests_failed"]')" = 0
    check "the decision is logged with its inputs" \
        grep -qE "leader RESPLIT reason=more_prefill want=2:1 running=1:2 .* prompt/s=[0-9]+" "$R/planner-0.log"
    check "metrics: desired prefill 2, one re-split" bash -c \
        'grep -qx "pd_planner_desired_daemons{role=\"prefill\"} 2" "$1" && grep -qx "pd_planner_resplits_total 1" "$1"' _ "$R/planner.prom"
    check "status lists the planner" bash -c '"$1" status --run-dir "$2" | grep -qE "^planner-0 +planner +leader"' _ "$PDCTL" "$R"
    "$PDCTL" down --run-dir "$R" >"$T/down.out" 2>&1
    clean_logs "$R"
    check "down stops the planner too" bash -c '! pgrep -f "autoscale run planner-0 --run-dir $1" >/dev/null' _ "$R"
}

flap() {
    local R=$T/run-flap i
    # production-like damping: a 10 s average, 3 ticks to confirm
    up "$R" --set planner.window=10s --set planner.confirm=3 || return
    "$PDCTL" autoscale on --run-dir "$R" >/dev/null 2>&1 || bad "autoscale on"
    for i in 1 2 3 4 5 6; do
        chat 2s "$T/c$i.json" || bad "pd-bench chat $i"
        long 2s "$T/l$i.json" || bad "pd-bench long $i"
    done
    local n up dn
    n=$(grep -c "leader RESPLIT" "$R/planner-0.log")
    up=$(grep -c "leader RESPLIT reason=more_prefill" "$R/planner-0.log")
    dn=$(grep -c "leader RESPLIT reason=more_decode" "$R/planner-0.log")
    check "flapping load: at most one re-split ($n)" test "$n" -le 1
    check "flapping load: never back and forth (more_prefill $up, more_decode $dn)" \
        test "$up" = 0 -o "$dn" = 0
    local f=0
    for i in 1 2 3 4 5 6; do f=$((f + $(failed_of "$T/c$i.json") + $(failed_of "$T/l$i.json"))); done
    check "flapping load: zero failed requests" test $f = 0
    "$PDCTL" down --run-dir "$R" >/dev/null 2>&1
    clean_logs "$R"
}

router_mixed() { "$PDCTL" admin router planner --run-dir "$1" --json | json_get 'j.get("mixed")'; }
is_mode() { [ "$(counts "$1" 2>/dev/null)" = "$2" ] && [ "$(router_mixed "$1")" = "$3" ]; }
is_separate() {   # at least one prefill ready, the routers not mixed
    local c; c=$(counts "$1" 2>/dev/null) || return 1
    [ "${c%%:*}" -ge 1 ] && [ "$(router_mixed "$1")" = False ]
}

mixed() {
    local R=$T/run-mixed t0 bench
    # tpot 20 ms: a decode carries 10 sequences (10 + 1 ms x 10), 500 tokens/s
    up "$R" --set deployment.disagg-mode=threshold --set planner.min-prefill=0 \
        --set planner.dwell=4s --set planner.tpot-p90=20ms || return
    "$PDCTL" autoscale on --run-dir "$R" >/dev/null 2>&1 || bad "autoscale on"
    long 6s "$T/ml1.json" || bad "pd-bench long 1"
    check "long prompts: separate pools (routers not mixed)" test "$(router_mixed "$R")" = False
    t0=$SECONDS
    chat_heavy 30s "$T/mc.json" &
    bench=$!
    # the bound: the prompt work decays (window 3 s) below 0.4, confirm 2
    # ticks, dwell 4 s, then drain the prefill
    if poll 25 is_mode "$R" 0:3 True; then
        ok "light prompts, decodes short (chat): PD-mixed 0:3 after $((SECONDS - t0))s (bound 25 s)"
    else
        bad "light prompts: not PD-mixed in 25 s (now $(counts "$R"), mixed $(router_mixed "$R"))"
    fi
    wait $bench || bad "pd-bench chat"
    t0=$SECONDS
    long 30s "$T/ml2.json" &
    bench=$!
    # work above 0.625, confirm, dwell, start a prefill and wait until registered
    if poll 30 is_separate "$R"; then
        ok "heavy prompts (long): separate pools again ($(counts "$R")) after $((SECONDS - t0))s (bound 30 s)"
    else
        bad "heavy prompts: not back to separate in 30 s (now $(counts "$R"), mixed $(router_mixed "$R"))"
    fi
    wait $bench || bad "pd-bench long 2"
    local f=$(( $(failed_of "$T/ml1.json") + $(failed_of "$T/mc.json") + $(failed_of "$T/ml2.json") ))
    check "zero failed requests across both switches" test "$f" = 0
    check "router: requests_failed 0" test "$("$PDCTL" admin router planner --run-dir "$R" --json |
        json_get 'j["counters"]["requests_failed"]')" = 0
    check "the switches are logged with the prompt work and decode load: to_mixed once, then to_separate once" bash -c \
        '[ "$(grep -cE "leader RESPLIT reason=to_mixed want=0:3 running=[12]:[12] mode=mixed .* work=0\.[0-3][0-9] dload=([2-9]|[1-9][0-9])\." "$1")" = 1 ] &&
         [ "$(grep -cE "leader RESPLIT reason=to_separate want=[12]:[12] running=0:3 mode=separate .* work=(0\.[6-9]|[1-9])" "$1")" = 1 ]' _ "$R/planner-0.log"
    check "metrics: pd_planner_mode separate, prompt work exported" bash -c \
        'grep -qx "pd_planner_mode{mode=\"separate\"} 1" "$1" && grep -q "^pd_planner_prompt_work_daemons " "$1"' _ "$R/planner.prom"
    "$PDCTL" down --run-dir "$R" >/dev/null 2>&1
    clean_logs "$R"
}

# two planners on one deployment: one leads; kill -9 it, the other leads
takeover() {
    local R=$1 what=$2 old new
    "$PDCTL" autoscale on --run-dir "$R" >/dev/null 2>&1 || bad "$what: autoscale on (1)"
    "$PDCTL" autoscale on --run-dir "$R" >/dev/null 2>&1 || bad "$what: autoscale on (2)"
    poll 10 bash -c '[ "$("$1" autoscale status --run-dir "$2" --json | python3 -c "import json,sys; print(len(json.load(sys.stdin)))")" = 2 ]' _ "$PDCTL" "$R"
    old=$(leader_of "$R")
    check "$what: exactly one of two planners leads ($old)" test "$old" = planner-0 -o "$old" = planner-1
    kill -KILL "$(cat "$R/$old.pid")"
    new=""
    local t0=$SECONDS
    poll 15 bash -c 'l=$(python3 -c "
import json,sys,os
for n in (\"planner-0\",\"planner-1\"):
    if n == sys.argv[2]: continue
    j=json.load(open(os.path.join(sys.argv[1], n + \".json\")))
    print(n if j.get(\"leader\") else \"\")" "$1" "$2"); [ -n "$l" ]' _ "$R" "$old" && new=ok
    check "$what: the other planner took over after kill -9 of $old ($((SECONDS - t0)) s)" test "$new" = ok
    check "$what: the new leader says so in its log" bash -c \
        'grep -h ": leader" "$1"/planner-*.log | grep -qv "^$2:"' _ "$R" "$old"
}

leader() {
    local R=$T/run-leader
    up "$R" || return
    takeover "$R" flock
    "$PDCTL" down --run-dir "$R" >/dev/null 2>&1
    clean_logs "$R"
    if ! command -v etcd >/dev/null; then
        echo "skip - etcd not installed: the etcd leader key is not tested"
        return
    fi
    local port
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    R=$T/run-leader-etcd
    up "$R" --set etcd=local:$port || return
    takeover "$R" etcd
    check "etcd: the leader holds its key under the deployment prefix" bash -c \
        'grep -q "leader by etcd 127.0.0.1:$2" "$1/planner-0.log" && grep -hq ": leader (/pdserve/plan-sim/planner/leader)" "$1"/planner-*.log' _ "$R" "$port"
    "$PDCTL" down --run-dir "$R" >/dev/null 2>&1
    clean_logs "$R"
}

case $MODE in
phase) phase ;;
flap) flap ;;
mixed) mixed ;;
leader) leader ;;
*) echo "usage: $0 phase|flap|mixed|leader SRC PDCTL PD_BENCH" >&2; exit 2 ;;
esac
echo "$MODE: $fails failure(s)"
[ $fails = 0 ]
