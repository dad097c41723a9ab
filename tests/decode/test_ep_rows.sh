#!/bin/sh
# test_ep_rows.sh PD_DECODE MOE_MODEL DENSE_MODEL - the decode daemon's EP
# config rows (issue 36): ep-size/ep-rank reach the engine's load options
# (its refusals show it), a bad rank is refused at boot, and a group rank
# loads its slice then stops (serving as a group is not built yet).
set -u
dec=$1 moe=$2 dense=$3
d=$(mktemp -d) || exit 1
trap 'rm -rf "$d"' EXIT
fail() { echo "FAIL: $*"; cat "$d/err" 2>/dev/null; exit 1; }
run() { # expected-exit pattern args...
    want=$1 pat=$2; shift 2
    "$dec" --secret-file "$d/secret" --mem.ledger "$d/ledger" --cpu-arbiter off \
        --kv-blocks 16 "$@" >"$d/out" 2>"$d/err" </dev/null
    rc=$?
    [ "$rc" = "$want" ] || fail "$* : exit $rc, want $want"
    grep -q -- "$pat" "$d/out" "$d/err" || fail "$* : no \"$pat\""
    echo "ok: $*"
}
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$d/secret"
chmod 600 "$d/secret"
run 2 "ep-rank 2: 0..ep-size-1" --model "$moe" --ep-size 2 --ep-rank 2
run 1 "does not divide the expert count" --model "$moe" --ep-size 3
run 1 "needs a MoE model" --model "$dense" --ep-size 2
run 1 "loaded rank 1's experts" --model "$moe" --ep-size 2 --ep-rank 1
run 0 "^[0-9][0-9]*$" --model "$moe" --ep-size 2 --ep-rank 1 --print-arena-bytes
exit 0
