#!/bin/sh
# test_ep_rows.sh PD_DECODE MOE_MODEL DENSE_MODEL - the decode daemon's EP
# config rows (issue 36): ep-size/ep-rank reach the engine's load options
# (its refusals show it), a bad rank is refused at boot, and a group rank
# loads its slice, meets the others through ep-dir (the exchange window's
# metadata, validated), runs one idle pass of the group and then serves in
# lockstep (the step barrier's idle votes keep it up) with one compat hash
# (the group's, from the ranks' expert digests); SIGTERM to the whole
# group ends it cleanly (exit 0, both ranks), and a rank killed -9 makes
# the other leave with "EP group lost a rank" and exit 1 within ep-timeout.
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
# two real ranks meet, run one pass of the group's exchanges, then vote
# (idle rounds) until stopped; no router listens at the address given
group() { # dir: start ranks 0 and 1 (pid0, pid1)
    mkdir "$d/$1"
    for r in 0 1; do
        "$dec" --secret-file "$d/secret" --mem.ledger "$d/ledger" --cpu-arbiter off \
            --kv-blocks 16 --router 127.0.0.1:1 --ep-timeout 1s --drain-timeout 5s \
            --model "$moe" --ep-size 2 --ep-rank $r --ep-dir "$d/$1" >"$d/$1.out$r" 2>&1 \
            </dev/null &
        eval pid$r=\$!
    done
    for r in 0 1; do # joined
        i=0
        until grep -q "EP group: rank $r of 2 joined through .*idle pass of the group in" \
            "$d/$1.out$r"; do
            i=$((i + 1))
            [ $i -lt 300 ] || { cat "$d/$1.out$r"; fail "rank $r did not join"; }
            sleep 0.1
        done
    done
}
group g
sleep 1.5 # past ep-timeout: the idle votes keep the group up
kill -0 $pid0 && kill -0 $pid1 || fail "a rank left an idle group: $(cat "$d/g.out0" "$d/g.out1")"
h0=$(sed -n 's/.*compat hash \([0-9a-f]*\).*/\1/p' "$d/g.out0")
h1=$(sed -n 's/.*compat hash \([0-9a-f]*\).*/\1/p' "$d/g.out1")
[ -n "$h0" ] && [ "$h0" = "$h1" ] || fail "the ranks' compat hashes differ: '$h0' '$h1'"
echo "ok: two ranks joined and stay up: $(grep -h 'EP group' "$d/g.out0" "$d/g.out1" |
    sed 's/.*EP group/EP group/' | tr '\n' ' ')"
kill -TERM $pid0 $pid1
wait $pid0; rc0=$?
wait $pid1; rc1=$?
[ $rc0 = 0 ] && [ $rc1 = 0 ] || { cat "$d/g.out0" "$d/g.out1"; fail "SIGTERM: exit $rc0 $rc1"; }
echo "ok: SIGTERM to the group: both ranks exit 0"
group h
kill -KILL $pid1
wait $pid0; rc0=$?
wait $pid1
[ $rc0 = 1 ] && grep -q "EP group lost a rank" "$d/h.out0" ||
    { cat "$d/h.out0"; fail "rank 1 killed: rank 0 exit $rc0"; }
echo "ok: rank 1 killed: rank 0 $(grep -h 'EP group lost' "$d/h.out0" | sed 's/.*EP group/EP group/')"
run 0 "^[0-9][0-9]*$" --model "$moe" --ep-size 2 --ep-rank 1 --print-arena-bytes
exit 0
