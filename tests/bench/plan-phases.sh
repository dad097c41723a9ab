#!/usr/bin/env bash
# plan-phases.sh - the SLO planner (issue 35) against static P:D splits: a
# budget of 6 daemons, the sim engine at Llama-3-8B KV geometry, a workload
# in three phases replayed by pd-bench with the same seeds for every
# configuration. Prints every command it runs; loopback only; every daemon
# is stopped on exit.
#
#   tests/bench/plan-phases.sh [--build DIR] [--out DIR] [--phase S] [--reps N]
#                              [--configs "1P:5D 3P:3D planner ..."]
#                              [--planner "dwell=20s window=10s ..."]  (extra [planner] rows)
#                              [--time-scale K] [--phases "chat long agent"]
#                              [--per-request]  (keep pd-bench's per-request records)
#
# Phases (--phase seconds each, default 30; Poisson arrivals; the rates are
# modeled time's, divided by --time-scale):
#   chat   short chat at a high rate: 20 req/s, 128 prompt / 128 answer tokens
#   long   long prompts, short answers: 8 req/s, 2000 / 16
#   long12 the same at 12 req/s (1.5x: more than one prefill and the
#          decodes' overflow carry; not in the default --phases)
#   agent  agent turns on long shared prefixes: 6 req/s, 4 groups x 1536-token
#          prefix + 256 new tokens, 64 answer tokens (shared-prefix workload)
# Configurations: the static splits 1P:5D .. 5P:1D (disagg-mode always),
# mixed-6D (6 decodes, disagg-mode never), `planner` (starts 3P:3D with the
# routers at always, `pdctl autoscale on`, [planner] rows below: min-prefill 0,
# so it may choose PD-mixed and back to separate-mode always) and
# `planner-mixed` (the same, starting PD-mixed 0P:6D, routers never). SLO: TTFT <= 1 s,
# TPOT <= 50 ms of modeled time (x K on the wall clock).
# --time-scale K (default 4) runs the modeled world K times slower (sim
# speedup=1/K): rates / K, SLOs and timeouts x K. The KV bytes stay real
# (128 KiB a token written, and pulled in separate pools), so K sets how much
# the box's own memcpy and CPU weigh against the modeled compute. At K=1 the
# long phase writes ~2 GB/s of KV and pulls as much on 2 cores shared by 6
# daemons, a router and pd-bench, and every split, PD-mixed included,
# saturates near 50 % attainment (BENCHMARKS.md); at K=4 a 2000-token
# prompt's 256 MiB pull (~25 ms at this box's ~10 GB/s shm get) is ~0.03x its
# 800-ms modeled prefill, no more than its weight on a 100 Gb/s RDMA link
# (~0.1x of a 200-ms prefill).
# Output in --out DIR: one pd-bench JSON per (rep, config, phase),
# summary.tsv (goodput and SLO attainment per phase), planner logs.
set -uo pipefail

SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${PD_BUILD_DIR:-$SRC/build}
OUT= PHASE=30 REPS=1 PLANNER_EXTRA= TS=4 PHASES="chat long agent" PER_REQ=--no-per-request
CONFIGS="1P:5D 2P:4D 3P:3D 4P:2D 5P:1D mixed-6D planner planner-mixed"
while [ $# -gt 0 ]; do
    case $1 in
    --build) BUILD=$2; shift ;;
    --out) OUT=$2; shift ;;
    --phase) PHASE=$2; shift ;;
    --reps) REPS=$2; shift ;;
    --configs) CONFIGS=$2; shift ;;
    --planner) PLANNER_EXTRA=$2; shift ;;
    --time-scale) TS=$2; shift ;;
    --phases) PHASES=$2; shift ;;
    --per-request) PER_REQ= ;;
    -h|--help) sed -n '2,39p' "$0"; exit 0 ;;
    *) echo "plan-phases: unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
    shift
done
PDCTL=$BUILD/tools/pdctl/pdctl
BENCH=$BUILD/tools/bench/pd-bench
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/plan-phases.XXXXXX)
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
DEPLOY=$SRC/tests/bench/sim-llama3-8b-sweep.ini
case $TS in ''|*[!0-9]*|0) echo "plan-phases: --time-scale takes a whole number >= 1" >&2; exit 2 ;; esac
SLO="ttft=${TS}s,tpot=$((50 * TS))ms"
MODEL=$(sed -n 's/^model = //p' "$DEPLOY" | sed "s/speedup=1\b/speedup=$(awk -v k="$TS" 'BEGIN { print 1 / k }')/")
scale() { awk -v r="$1" -v k="$TS" 'BEGIN { print r / k }'; }
# decode arenas of 768 blocks (1.5 GiB: 6 x 2000-token sequences, 16 x 256);
# the planner's damping scaled to the short phases
COMMON=(--set model="$MODEL" --set router.http=127.0.0.1:0 --set router.control=127.0.0.1:0
        --set decode.kv-blocks=768 --set decode.max-batch=16)
PLANNER=(--set planner.budget=6 --set planner.min-prefill=0 --set planner.separate-mode=always
         --set planner.interval=1s
         --set planner.window=6s --set planner.confirm=2 --set planner.dwell=10s
         --set planner.ttft-p90=${TS}s --set planner.tpot-p90=$((50 * TS))ms)
for kv in $PLANNER_EXTRA; do PLANNER+=(--set "planner.$kv"); done

RUNS=()
cleanup() {
    local d f
    for d in "${RUNS[@]}"; do
        [ -f "$d/deployment.json" ] && "$PDCTL" down --run-dir "$d" >/dev/null 2>&1
        for f in "$d"/*.pid; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done
    done
}
trap cleanup EXIT
trap 'echo "plan-phases: interrupted" >&2; exit 130' INT TERM
say() { printf '+ %s\n' "$*"; }
mem_avail_mb() { awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo; }

phase_args() {
    case $1 in
    chat) echo --rate "$(scale 20)" --input-len 128 --prompt-ids 1000:30000 --output-len 128 --seed 1 ;;
    long) echo --rate "$(scale 8)" --input-len 2000 --prompt-ids 1000:30000 --output-len 16 --seed 2 ;;
    long12) echo --rate "$(scale 12)" --input-len 2000 --prompt-ids 1000:30000 --output-len 16 --seed 4 ;;
    agent) echo --rate "$(scale 6)" --workload shared-prefix --prefix-len 1536 --prefix-groups 4 \
               --prefix-prompts 1000 --input-len 256 --prompt-ids 1000:30000 --output-len 64 --seed 3 ;;
    esac
}

echo "plan-phases: results in $OUT; $(nproc) cores, MemAvailable $(mem_avail_mb) MiB, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf 'rep\tconfig\tphase\tsent\tcompleted\tfailed\tgoodput\tattain_pct\tttft_p90\ttpot_p90\tsplit_end\n' >"$OUT/summary.tsv"
for rep in $(seq 1 "$REPS"); do
    for cfg in $CONFIGS; do
        case $cfg in
        mixed-6D) NP=0 ND=6 MODE=never ;;
        planner) NP=3 ND=3 MODE=threshold ;;   # the routers go to always below
        planner-mixed) NP=0 ND=6 MODE=never ;;
        *P:*D) NP=${cfg%%P:*}; ND=${cfg#*:}; ND=${ND%D}; MODE=always ;;
        esac
        if [ "$(mem_avail_mb)" -lt 10240 ]; then
            echo "plan-phases: less than 10 GiB available; skipping $cfg" >&2
            continue
        fi
        RUN=$OUT/run-$rep-${cfg//:/}
        RUNS+=("$RUN")
        UP=("$PDCTL" up "$DEPLOY" --run-dir "$RUN" --set prefill="$NP" --set decode="$ND"
            --set disagg-mode="$MODE" "${COMMON[@]}")
        case $cfg in planner*) UP+=("${PLANNER[@]}") ;; esac
        say "${UP[@]}"
        if ! "${UP[@]}" >"$RUN.up.log" 2>&1; then
            echo "plan-phases: $cfg up failed" >&2; tail -5 "$RUN.up.log" >&2; continue
        fi
        URL=$(cat "$RUN/url")
        if [ "$cfg" = planner ]; then   # separate pools like the static splits
            say "$PDCTL" disagg-mode always --run-dir "$RUN"
            "$PDCTL" disagg-mode always --run-dir "$RUN"
        fi
        if [ "${cfg#planner}" != "$cfg" ]; then
            say "$PDCTL" autoscale on --run-dir "$RUN"
            "$PDCTL" autoscale on --run-dir "$RUN"
        fi
        # warm-up, not counted: 5 s of light chat (first-touch of the arenas,
        # connections); the same for every configuration
        W=("$BENCH" --url "$URL" --rate 2 --input-len 128 --prompt-ids 1000:30000 --output-len 32
           --seed 9 --duration 5s --ignore-eos --no-per-request --quiet)
        say "${W[@]}"
        "${W[@]}" >/dev/null 2>&1
        for ph in $PHASES; do
            J=$OUT/$rep-${cfg//:/}-$ph.json
            # shellcheck disable=SC2046
            B=("$BENCH" --url "$URL" $(phase_args $ph) --duration "${PHASE}s" --ignore-eos
               --slo "$SLO" --request-timeout $((20 * TS))s $PER_REQ --quiet --out "$J")
            say "${B[@]}"
            "${B[@]}" >"$J.log" 2>&1 || { echo "plan-phases: pd-bench failed" >&2; tail -3 "$J.log" >&2; }
            split=$("$PDCTL" status --run-dir "$RUN" --json | python3 -c '
import json, sys
j = json.load(sys.stdin)
print("%dP:%dD" % tuple(sum(1 for d in j["daemons"] if d["role"] == r) for r in ("prefill", "decode")))')
            [ -s "$J" ] && python3 - "$J" "$rep" "$cfg" "$ph" "$split" >>"$OUT/summary.tsv" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
sent = r["completed"] + r["failed"]
f = lambda k, d: "-" if r.get(k) is None else f"{r[k]:.{d}f}"
print("\t".join([sys.argv[2], sys.argv[3], sys.argv[4], str(sent), str(r["completed"]),
                 str(r["failed"]), f("request_goodput", 2),
                 f"{100.0 * r.get('good_requests', 0) / max(1, sent):.0f}",
                 f("p90_ttft_ms", 0), f("p90_tpot_ms", 1), sys.argv[5]]))
PY
            tail -1 "$OUT/summary.tsv" | tr '\t' ' ' | sed 's/^/  = /'
        done
        case $cfg in planner*) cp "$RUN"/planner-0.log "$OUT/$cfg-$rep.log" ;; esac
        say "$PDCTL" down --run-dir "$RUN"
        "$PDCTL" down --run-dir "$RUN" >"$RUN.down.log" 2>&1 || cat "$RUN.down.log" >&2
    done
done
column -t -s $'\t' "$OUT/summary.tsv" 2>/dev/null || cat "$OUT/summary.tsv"
