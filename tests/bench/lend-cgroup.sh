#!/bin/bash
# lend-cgroup.sh BUILD - issue 34: is the kernel's own cgroup CPU weight
# enough to lend a co-located decode's idle core to a prefill, against
# pdserve's `nice` (node_set_nice, which also nices the daemon's autogroup)?
# One 1P:1D deployment on this host (2 + 2 engine threads, the `byte`
# preset at dim 768 / 8 layers / q8_0, as tests/pdctl `pdctl-lending`),
# three ways to rank the prefill below the decode:
#   none    prefill and decode at nice 0, no cgroup
#   nice    prefill `nice = 19` (pdserve's way)
#   cgroup  both at nice 0, each in its own cpu cgroup: the prefill's
#           weight 1 (v2 cpu.weight) / shares 2 (v1 cpu.shares), the
#           decode's the default (100 / 1024) - what systemd's CPUWeight=
#           sets for a unit
# Per way and round: a decoding stream alone (3 x 100 tokens: idle TPOT),
# then the same stream under a prefill burst (4 prompts of 250 words, 2 at
# a time): its TPOT, and the burst's wall time (what the prefill got).
# ROUNDS (default 3) rounds, the ways interleaved; prints one line per run
# and the median per way. Needs root for the cgroups. Never run by a test.
# Result: docs/BENCHMARKS.md "Co-located daemons vs llama-server".
set -euo pipefail
BUILD=$(realpath "${1:?usage: lend-cgroup.sh BUILD}")
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PDCTL=$BUILD/tools/pdctl/pdctl
BENCH=$BUILD/tools/bench/pd-bench
ROUNDS=${ROUNDS:-3}
WAYS=${WAYS:-"none nice cgroup"}
DIR=$(mktemp -d /tmp/pd-lendcg.XXXXXX)
M=$DIR/mid.gguf
# the cgroup hierarchy: v2 when cpu is a controller there, else v1's cpu
if grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    CG=/sys/fs/cgroup; WFILE=cpu.weight; WLOW=1; WDEF=100
    echo +cpu > "$CG/cgroup.subtree_control" 2>/dev/null || true
elif [ -d /sys/fs/cgroup/cpu ]; then
    CG=/sys/fs/cgroup/cpu; WFILE=cpu.shares; WLOW=2; WDEF=1024
else
    echo "no cpu cgroup controller on this host" >&2; exit 2
fi
cleanup() {
    "$PDCTL" down --run-dir "$DIR/run" >/dev/null 2>&1 || true
    for g in pd-lend-prefill pd-lend-decode; do rmdir "$CG/$g" 2>/dev/null || true; done
    rm -rf "$DIR"
}
trap cleanup EXIT
mkdir -p "$CG/pd-lend-prefill" "$CG/pd-lend-decode"
echo "$WLOW" > "$CG/pd-lend-prefill/$WFILE"
echo "$WDEF" > "$CG/pd-lend-decode/$WFILE"
echo "# cgroup: $CG ($WFILE prefill $WLOW, decode $WDEF); autogroups $(cat /proc/sys/kernel/sched_autogroup_enabled)"
"$BUILD/engine/gguf/pd-mkmodel" --preset byte --dim 768 --layers 8 --heads 12 --kv-heads 4 \
    --ffn 2048 --type q8_0 -o "$M" >/dev/null
tpot() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["results"]; print("%.3f" % j["mean_tpot_ms"] if j["failed"] == 0 else "failed")' "$1"; }
stream() { "$BENCH" --url="$1" --input-len=8 --output-len=100 --ignore-eos --num-requests=3 \
               --quiet --out="$2" >/dev/null 2>&1; }
move() {  # move PIDFILE GROUP: every thread of the daemon into the group
    local pid; pid=$(cat "$1")
    if [ "$WFILE" = cpu.weight ]; then echo "$pid" > "$CG/$2/cgroup.procs"
    else for t in /proc/"$pid"/task/*; do echo "${t##*/}" > "$CG/$2/tasks"; done; fi
}
declare -A RES
for r in $(seq 1 "$ROUNDS"); do
    for way in $WAYS; do
        R=$DIR/run
        pnice=0; [ "$way" = nice ] && pnice=19
        echo "+ $PDCTL up deploy/local-1p1d.ini --set deployment.model=mid.gguf --set prefill.threads=2 --set decode.threads=2 --set prefill.nice=$pnice --set deployment.disagg-threshold=0 ($way)" >&2
        "$PDCTL" up "$SRC/deploy/local-1p1d.ini" --run-dir "$R" --set deployment.model="$M" \
            --set router.http=127.0.0.1:0 --set router.control=127.0.0.1:0 \
            --set deployment.disagg-threshold=0 --set prefill.threads=2 --set decode.threads=2 \
            --set prefill.nice=$pnice >/dev/null
        if [ "$way" = cgroup ]; then
            move "$R/prefill-0.pid" pd-lend-prefill
            move "$R/decode-0.pid" pd-lend-decode
        fi
        URL=$(cat "$R/url")
        stream "$URL" "$DIR/warm.json"
        stream "$URL" "$DIR/idle.json"
        t0=$(date +%s%N)
        "$BENCH" --url="$URL" --input-len=250 --output-len=1 --concurrency=2 --num-requests=4 \
            --quiet --out="$DIR/burst.json" >/dev/null 2>&1 &
        bp=$!
        sleep 0.5
        stream "$URL" "$DIR/under.json"
        wait "$bp"
        burst_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
        idle=$(tpot "$DIR/idle.json") under=$(tpot "$DIR/under.json")
        printf '%-7s round %d: TPOT idle %s ms, under the burst %s ms (%.2fx), burst %d ms\n' \
            "$way" "$r" "$idle" "$under" "$(python3 -c "print($under / $idle)")" "$burst_ms"
        RES[$way]+="$idle $under $burst_ms;"
        "$PDCTL" down --run-dir "$R" >/dev/null 2>&1
    done
done
for way in $WAYS; do
    python3 - "$way" "${RES[$way]}" <<'EOF'
import statistics, sys
runs = [list(map(float, x.split())) for x in sys.argv[2].split(";") if x.strip()]
med = lambda k: statistics.median(r[k] for r in runs)
print("%-7s median of %d: TPOT idle %.3f ms, under the burst %.3f ms (%.2fx), burst %.0f ms"
      % (sys.argv[1], len(runs), med(0), med(1), statistics.median(r[1] / r[0] for r in runs), med(2)))
EOF
done
