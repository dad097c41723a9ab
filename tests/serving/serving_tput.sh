#!/bin/bash
# serving_tput.sh BUILD CONC NREQ MAXTOK [pd-bench args]: short-request
# throughput through pd-router (1 router + 1 prefill + 1 decode, sim engine,
# model from $M, default sim:llama3-8b,no_sleep=1) with pd-bench; prints one
# line of req/s and latencies (docs/BENCHMARKS.md "Serving").
B=$1; C=$2; N=$3; MT=$4; shift 4
D=$(mktemp -d /tmp/tput-XXXX)
M=${M:-'sim:llama3-8b,no_sleep=1'}
S=$(head -c 32 /dev/urandom | xxd -p -c 64)
$B/router/pd-router --model="$M" --secret=$S --http=127.0.0.1:0 --control=127.0.0.1:0 --ready-file=$D/r.ready --log.level=warn --max-concurrent=4096 >$D/r.log 2>&1 & RP=$!
for i in $(seq 100); do [ -s $D/r.ready ] && break; sleep 0.05; done
CP=$(python3 -c "import json;print(json.load(open('$D/r.ready'))['control'])")
HP=$(python3 -c "import json;print(json.load(open('$D/r.ready'))['http'])")
$B/decode/pd-decode --model="$M" --secret=$S --router=127.0.0.1:$CP --kv-blocks=512 --max-batch=64 --ready-file=$D/d.ready --log.level=warn --threads=1 >$D/d.log 2>&1 & DP=$!
$B/prefill/pd-prefill --model="$M" --secret=$S --router=127.0.0.1:$CP --kv-blocks=256 --ready-file=$D/p.ready --log.level=warn --threads=1 >$D/p.log 2>&1 & PP=$!

for i in $(seq 200); do curl -sf http://127.0.0.1:$HP/ready >/dev/null && break; sleep 0.05; done
$B/tools/bench/pd-bench --url http://127.0.0.1:$HP --concurrency $C --num-requests $N --warmup 50 --prompt-ids 4:8 --output-len $MT --ignore-eos --no-per-request --out $D/out.json "$@" >$D/bench.txt 2>&1
python3 -c "import json;r=json.load(open('$D/out.json'))['results'];print('conc=$C maxtok=$MT req/s=%.0f completed=%d failed=%d p50_e2el=%.2fms p99_e2el=%.2fms p50_ttft=%.2fms'%(r['request_throughput'],r['completed'],r['failed'],r['p50_e2el_ms'],r['p99_e2el_ms'],r['p50_ttft_ms']))"
kill $RP $DP $PP; wait 2>/dev/null; rm -rf $D
