#!/usr/bin/env bash
# Issue #28 finding 1 with real processes: two daemons whose KV arenas each
# fit but not together (mem.budget sizes the host's budget at 50 MB so the
# test needs 67 MB, not 37 GB). The second refuses at boot with a sentence
# naming both shares, before it maps anything; the first keeps running. A
# daemon killed without releasing (SIGKILL) leaves an entry the next boot
# reclaims; a clean exit releases its own. pdctl check / up refuse the same
# plan before starting anything.
#   test_mem_budget.sh SRC_ROOT PDCTL PD_PREFILL PD_DECODE
set -uo pipefail
SRC=$1 PDCTL=$2 PREFILL=$3 DECODE=$4
T=$(mktemp -d /tmp/pd-membudget.XXXXXX)
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    [ -f "$T/run/deployment.json" ] && "$PDCTL" down --run-dir "$T/run" >/dev/null 2>&1
    [ -n "${KEEP:-}" ] || rm -rf "$T"
}
trap cleanup EXIT
fails=0
ok()  { echo "ok   - $*"; }
bad() { echo "FAIL - $*"; fails=$((fails + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
poll() {     # poll SECONDS CMD...: until CMD succeeds
    local end=$((SECONDS + $1)); shift
    until "$@"; do [ $SECONDS -lt $end ] || return 1; sleep 0.05; done
}

# sim:llama3-8b blocks are 2 MiB: 16 blocks = 33.6 MB per daemon
MODEL='sim:llama3-8b,no_sleep=1'
common=(--model="$MODEL" --kv-blocks=16 --insecure-no-auth --router=127.0.0.1:1
        --mem.budget=50000000 --mem.ledger="$T/ledger" --log.level=info)
WANT='pd-decode d0 33.6 MB \+ pd-prefill p0 33.6 MB > budget 50.0 MB'

"$DECODE" "${common[@]}" --id=d0 --admin.socket="$T/d0.sock" 2>"$T/d0.log" &
D0=$!; PIDS+=("$D0")
check "d0 booted (its arena committed in the ledger)" \
    poll 20 grep -qE "^$D0 [0-9]+ 33554432 1 pd-decode d0$" "$T/ledger"

timeout 20 "$PREFILL" "${common[@]}" --id=p0 --admin.socket="$T/p0.sock" 2>"$T/p0.log"
rc=$?
check "p0 refused at boot (exit 1, got $rc)" test $rc = 1
check "the refusal names both shares and the budget: $(grep -o 'fit.*' "$T/p0.log" | head -1)" \
    grep -qE "$WANT" "$T/p0.log"
check "p0 never registered an arena (no admin socket)" test ! -e "$T/p0.sock"
check "d0 still runs" kill -0 "$D0"
check "the ledger holds d0 only" test "$(wc -l <"$T/ledger")" = 1

# d0 dies without releasing: its entry is reclaimed, p0 now fits
kill -KILL "$D0"; wait "$D0" 2>/dev/null
"$PREFILL" "${common[@]}" --id=p0 --admin.socket="$T/p0.sock" 2>"$T/p0b.log" &
P0=$!; PIDS+=("$P0")
check "after d0's SIGKILL, p0 boots (dead entry reclaimed)" poll 20 test -S "$T/p0.sock"
check "the ledger holds p0 only" poll 5 bash -c "[ \"\$(cut -d' ' -f5- '$T/ledger')\" = 'pd-prefill p0' ]"
kill -TERM "$P0"
check "p0 exits on SIGTERM" poll 20 bash -c "! kill -0 $P0 2>/dev/null"
wait "$P0" 2>/dev/null
check "a clean exit releases its entry" test ! -s "$T/ledger"

# pdctl: the plan's sum is checked before anything starts
dep=(--set prefill=1 --set decode=1 --set prefill.kv-blocks=16 --set decode.kv-blocks=16
     --set "model=$MODEL" --set router.http=127.0.0.1:0 --set router.control=127.0.0.1:0
     --set mem-ledger="$T/ledger2")
PLAN='pd-prefill prefill-0 33.6 MB \+ pd-decode decode-0 33.6 MB > budget 50.0 MB'
"$PDCTL" check "$SRC/deploy/sim-llama3-70b-2p6d.ini" "${dep[@]}" --set mem-budget=50000000 \
    >"$T/out" 2>"$T/err"
rc=$?
check "pdctl check refuses the plan (exit 1, got $rc): $(cat "$T/err")" \
    bash -c "[ $rc = 1 ] && grep -qE '$PLAN' '$T/err'"
"$PDCTL" check "$SRC/deploy/sim-llama3-70b-2p6d.ini" "${dep[@]}" --set mem-budget=80000000 \
    >"$T/out" 2>"$T/err"
check "pdctl check passes under a budget that holds both" grep -q ": ok:" "$T/out"
"$PDCTL" up "$SRC/deploy/sim-llama3-70b-2p6d.ini" "${dep[@]}" --set mem-budget=50000000 \
    --run-dir "$T/run" >"$T/out" 2>"$T/err"
rc=$?
check "pdctl up refuses the plan (exit 1, got $rc): $(cat "$T/err")" \
    bash -c "[ $rc = 1 ] && grep -qE '$PLAN.*nothing was started' '$T/err'"
check "pdctl up started nothing (no pid file, no log)" \
    bash -c "! ls '$T/run'/*.pid '$T/run'/*.log >/dev/null 2>&1"

"$PDCTL" check "$SRC/deploy/sim-llama3-70b-2p6d.ini" "${dep[@]}" \
    --set prefill.print-arena-bytes=true >"$T/out" 2>"$T/err"
rc=$?
check "print-arena-bytes is pdctl's, not a deployment key (exit 2, got $rc)" \
    bash -c "[ $rc = 2 ] && grep -q 'unknown key \"print-arena-bytes\"' '$T/err'"

echo "mem-budget: $fails failure(s)"
[ $fails = 0 ]
