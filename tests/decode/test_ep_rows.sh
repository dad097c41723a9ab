#!/bin/sh
# test_ep_rows.sh PD_DECODE MOE_MODEL DENSE_MODEL - the decode daemon's EP
# config rows (issue 36): ep-size/ep-rank reach the engine's load options
# (its refusals show it), a bad rank is refused at boot, and a group rank
# loads its slice, meets the others through ep-dir (the exchange window's
# metadata, validated), runs one idle pass of the group, then stops
# (serving as a group, the step barrier, is not built yet).
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
run 1 "ep-dir (the group's rendezvous directory) is needed" --model "$moe" --ep-size 2 --ep-rank 1
# a foreign or oversized file in the rendezvous directory is refused
mkdir "$d/bad" "$d/big" "$d/g"
head -c 300 /dev/urandom >"$d/bad/rank-0.meta"
head -c 100000 /dev/zero >"$d/big/rank-0.meta"
run 1 "rank 0's metadata: bad magic" --model "$moe" --ep-size 2 --ep-rank 1 --ep-dir "$d/bad"
run 1 "rank 0's metadata: exceeds a hard limit" --model "$moe" --ep-size 2 --ep-rank 1 --ep-dir "$d/big"
# two real ranks meet and run one pass of the group's exchanges
for r in 0 1; do
    "$dec" --secret-file "$d/secret" --mem.ledger "$d/ledger" --cpu-arbiter off --kv-blocks 16 \
        --model "$moe" --ep-size 2 --ep-rank $r --ep-dir "$d/g" >"$d/out$r" 2>&1 </dev/null &
    eval pid$r=\$!
done
wait $pid0; rc0=$?
wait $pid1; rc1=$?
for r in 0 1; do
    grep -q "EP group: rank $r of 2 joined through .*idle pass of the group in" "$d/out$r" ||
        { cat "$d/out$r"; fail "rank $r did not join (exit $rc0 $rc1)"; }
done
echo "ok: two ranks joined: $(grep -h 'EP group' "$d/out0" "$d/out1" | sed 's/.*EP group/EP group/')"
run 0 "^[0-9][0-9]*$" --model "$moe" --ep-size 2 --ep-rank 1 --print-arena-bytes
exit 0
