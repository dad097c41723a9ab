#!/bin/bash
# routers_tput.sh BUILD CONC NREQ MAXTOK: short-request throughput with one
# router vs two (docs/BENCHMARKS.md "Several routers"). One deployment: two
# pd-routers, one pd-prefill, one pd-decode (sim engine, model $M, default
# the tiny geometry: the serving path's own cost), every daemon with a
# session to both routers. Run 1: one pd-bench, CONC in flight, all through
# router 0. Run 2: two pd-bench at once, CONC/2 each, one per router (what a
# round-robin balancer does). Prints req/s of each.
B=$1; C=$2; N=$3; MT=$4
D=$(mktemp -d /tmp/rtput-XXXX)
M=${M:-'sim:layers=2,kv_heads=2,head_dim=16,vocab=300,ctx=2048,no_sleep=1'}
S=$(head -c 32 /dev/urandom | xxd -p -c 64)
PIDS=()
for r in 0 1; do
    $B/router/pd-router --model="$M" --secret=$S --id=router-$r --http=127.0.0.1:0 \
        --control=127.0.0.1:0 --ready-file=$D/r$r.ready --log.level=warn \
        --max-concurrent=4096 >$D/r$r.log 2>&1 & PIDS+=($!)
done
for r in 0 1; do for i in $(seq 100); do [ -s $D/r$r.ready ] && break; sleep 0.05; done; done
port() { python3 -c "import json;print(json.load(open('$1'))['$2'])"; }
CP0=$(port $D/r0.ready control) CP1=$(port $D/r1.ready control)
HP0=$(port $D/r0.ready http) HP1=$(port $D/r1.ready http)
RL=127.0.0.1:$CP0,127.0.0.1:$CP1
$B/decode/pd-decode --model="$M" --secret=$S --router=$RL --kv-blocks=512 --max-batch=64 \
    --ready-file=$D/d.ready --log.level=warn --threads=1 >$D/d.log 2>&1 & PIDS+=($!)
$B/prefill/pd-prefill --model="$M" --secret=$S --router=$RL --kv-blocks=256 \
    --ready-file=$D/p.ready --log.level=warn --threads=1 >$D/p.log 2>&1 & PIDS+=($!)
for hp in $HP0 $HP1; do
    for i in $(seq 200); do curl -sf http://127.0.0.1:$hp/ready >/dev/null && break; sleep 0.05; done
done
bench() { # bench PORT CONC OUT
    $B/tools/bench/pd-bench --url http://127.0.0.1:$1 --concurrency $2 --num-requests $N \
        --warmup 50 --prompt-ids 4:8 --input-len 4 --output-len $MT --ignore-eos \
        --no-per-request --quiet --out $3 >/dev/null 2>&1
}
line() {
    python3 -c "import json,sys
rs=[json.load(open(f))['results'] for f in sys.argv[2:]]
tp=sum(r['request_throughput'] for r in rs)
print('%s: req/s=%.0f completed=%d failed=%d p50_e2el=%s ms p99_e2el=%s ms' % (sys.argv[1], tp,
      sum(r['completed'] for r in rs), sum(r['failed'] for r in rs),
      '/'.join('%.2f' % r['p50_e2el_ms'] for r in rs), '/'.join('%.2f' % r['p99_e2el_ms'] for r in rs)))" "$@"
}
bench $HP0 $C $D/one.json
line "1 router  (conc $C)" $D/one.json
bench $HP0 $((C / 2)) $D/two0.json & B0=$!
bench $HP1 $((C / 2)) $D/two1.json & B1=$!
wait $B0 $B1
line "2 routers (conc $((C / 2)) + $((C / 2)))" $D/two0.json $D/two1.json
kill "${PIDS[@]}"; wait 2>/dev/null; rm -rf $D
