#!/usr/bin/env bash
# pd-sweep.sh - capacity report: goodput of P:D splits of a fixed number of
# daemons over a range of request rates, with pd-bench against deployments
# brought up by pdctl (loopback only). Prints every command it runs.
#
#   tests/bench/pd-sweep.sh [--quick] [--real] [--build DIR] [--out DIR]
#                           [--docs] [--rates "R1 R2 ..."] [--duration S]
#
#   (default)  sim engine, Llama-3-8B geometry (tests/bench/sim-llama3-8b-sweep.ini),
#              4 daemons as 1P:3D 2P:2D 3P:1D and PD-mixed (4D, disagg-mode never)
#   --real     the real built-in GGUF model (BUILD/engine/gguf/builtin.gguf),
#              1P:1D vs PD-mixed 2D at one rate (2 cores: 2 daemons)
#   --quick    smoke mode (bench-smoke test): 1P:1D, 1 rate, 3 s, small arenas
#   --docs     copy the plot to docs/pd-sweep.png (--real: docs/pd-sweep-real.png);
#              the BENCHMARKS.md section is written from section.md by hand
# Output in --out DIR (default /tmp/pd-sweep.XXXXXX): one pd-bench JSON per
# point, summary.tsv, section.md, pd-sweep.png. Every daemon is stopped on
# exit (pdctl down, then SIGKILL of any pid left), also on Ctrl-C.
# Runtime is bounded: each point runs --duration plus at most one request
# timeout; the whole default sweep takes ~15 minutes.
set -uo pipefail

SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${PD_BUILD_DIR:-$SRC/build}
OUT=
QUICK=0 REAL=0 DOCS=0
RATES= DURATION=
while [ $# -gt 0 ]; do
    case $1 in
    --quick) QUICK=1 ;;
    --real) REAL=1 ;;
    --docs) DOCS=1 ;;
    --build) BUILD=$2; shift ;;
    --out) OUT=$2; shift ;;
    --rates) RATES=$2; shift ;;
    --duration) DURATION=$2; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "pd-sweep: unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
    shift
done
PDCTL=$BUILD/tools/pdctl/pdctl
BENCH=$BUILD/tools/bench/pd-bench
for b in "$PDCTL" "$BENCH"; do
    [ -x "$b" ] || { echo "pd-sweep: $b missing (build first, or --build DIR)" >&2; exit 2; }
done
TMP_OUT=0
[ -n "$OUT" ] || { OUT=$(mktemp -d /tmp/pd-sweep.XXXXXX); TMP_OUT=$QUICK; }
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)

# ---- the workload and the splits -------------------------------------------
DEPLOY=$SRC/tests/bench/sim-llama3-8b-sweep.ini
SLO_TTFT=1s SLO_TPOT=50ms
IN_LEN=1024 OUT_LEN=128 IDS=1000:30000
WARMUP=4 REQ_TIMEOUT=15s
SETS=()                      # extra --set for every split
if [ $QUICK = 1 ]; then
    # tiny: the pipeline (up, bench, JSON, report, plot, down) in seconds
    SPLITS=("1P:1D 1 1 always")
    : "${RATES:=4}" "${DURATION:=3}"
    IN_LEN=64 OUT_LEN=8 WARMUP=2 REQ_TIMEOUT=10s
    SETS=(--set 'model=sim:llama3-8b,prefill_tps=100000,decode_ms=2+0.1*b,kv_check=sample'
          --set prefill.kv-blocks=64 --set decode.kv-blocks=64)
    MEM_NEED_MB=1024
elif [ $REAL = 1 ]; then
    # the built-in GGUF (vocab 260, ctx 4096) on the llama engine, one thread
    # per daemon: 2 daemons on the 2 cores
    SPLITS=("1P:1D 1 1 always" "mixed-2D 0 2 never")
    : "${RATES:=2}" "${DURATION:=25}"
    IDS=3:255
    SETS=(--set model=builtin --set engine=llama
          --set prefill.kv-blocks=1024 --set decode.kv-blocks=2048 --set decode.max-batch=32)
    MEM_NEED_MB=2048
else
    # name prefill decode disagg-mode: a fixed total of 4 daemons
    SPLITS=("1P:3D 1 3 always" "2P:2D 2 2 always" "3P:1D 3 1 always" "mixed-4D 0 4 never")
    : "${RATES:=3 5 7 10 14}" "${DURATION:=20}"
    MEM_NEED_MB=$((4 * 2304 + 2048))   # 4 decode arenas (2.25 GiB) + margin
fi
SLO="ttft=$SLO_TTFT,tpot=$SLO_TPOT"

# ---- cleanup: every daemon we started goes ----------------------------------
RUNS=()
BENCH_PID=
cleanup() {
    local d f p
    [ -n "$BENCH_PID" ] && kill "$BENCH_PID" 2>/dev/null
    for d in "${RUNS[@]}"; do
        [ -f "$d/deployment.json" ] && "$PDCTL" down --run-dir "$d" >/dev/null 2>&1
        for f in "$d"/*.pid; do
            [ -f "$f" ] || continue
            p=$(cat "$f")
            [ -n "$p" ] && kill -KILL "$p" 2>/dev/null
        done
    done
    [ "$TMP_OUT" = 1 ] && rm -rf "$OUT"   # --quick without --out: nothing to keep
}
trap cleanup EXIT
trap 'echo "pd-sweep: interrupted" >&2; exit 130' INT TERM

say() { printf '+ %s\n' "$*"; }          # the exact commands, copy-pastable
mem_avail_mb() { awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo; }
daemon_cpu_ticks() {   # sum of utime+stime of the run dir's daemons
    local d=$1 f s=0 t
    for f in "$d"/*.pid; do
        [ -f "$f" ] || continue
        t=$(awk '{print $14 + $15}' "/proc/$(cat "$f")/stat" 2>/dev/null) || t=0
        s=$((s + ${t:-0}))
    done
    echo $s
}

echo "pd-sweep: results in $OUT"
echo "pd-sweep: $(nproc) cores, MemAvailable $(mem_avail_mb) MiB, load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$(mem_avail_mb)" -lt "$MEM_NEED_MB" ]; then
    echo "pd-sweep: need ~$MEM_NEED_MB MiB available for the KV arenas; not starting" >&2
    exit 1
fi

printf 'split\trate\tcompleted\tfailed\tduration_s\treq_tput\tgoodput\tgood\tttft_p50\tttft_p99\ttpot_p50\ttpot_p99\tout_tok_s\tdaemon_cpu_pct\tload1\tattain_pct\n' \
    >"$OUT/summary.tsv"
T0=$SECONDS
fails=0
for sp in "${SPLITS[@]}"; do
    read -r NAME NP ND MODE <<<"$sp"
    for R in $RATES; do
        RUN=$OUT/run-${NAME//:/}-$R
        RUNS+=("$RUN")
        UP=("$PDCTL" up "$DEPLOY" --run-dir "$RUN" --set prefill="$NP" --set decode="$ND"
            --set disagg-mode="$MODE" --set router.http=127.0.0.1:0
            --set router.control=127.0.0.1:0 "${SETS[@]}")
        say "${UP[@]}"
        if ! "${UP[@]}" >"$RUN.up.log" 2>&1; then
            echo "pd-sweep: $NAME up failed:" >&2; cat "$RUN.up.log" >&2
            for f in "$RUN"/*.log; do [ -f "$f" ] && tail -3 "$f" >&2; done
            fails=$((fails + 1)); continue
        fi
        URL=$(cat "$RUN/url")
        J=$OUT/${NAME//:/}-r$R.json
        B=("$BENCH" --url "$URL" --rate "$R" --duration "${DURATION}s" --warmup "$WARMUP"
           --input-len "$IN_LEN" --prompt-ids "$IDS" --output-len "$OUT_LEN" --ignore-eos
           --slo "$SLO" --seed 1 --request-timeout "$REQ_TIMEOUT" --no-per-request --quiet
           --out "$J")
        say "${B[@]}"
        c0=$(daemon_cpu_ticks "$RUN"); t0=$(date +%s.%N)
        # in the background + wait: a signal reaches the trap at once
        "${B[@]}" >"$J.log" 2>&1 &
        BENCH_PID=$!
        wait "$BENCH_PID" || { echo "pd-sweep: pd-bench failed:" >&2; tail -5 "$J.log" >&2; }
        BENCH_PID=
        c1=$(daemon_cpu_ticks "$RUN"); t1=$(date +%s.%N)
        load1=$(cut -d' ' -f1 /proc/loadavg)
        # the KV-transfer matrix (pull counts, bytes, GB/s, latency) of the point
        "$PDCTL" xfer all --run-dir "$RUN" --json >"$J.xfer.json" 2>/dev/null
        say "$PDCTL" down --run-dir "$RUN"
        "$PDCTL" down --run-dir "$RUN" >"$RUN.down.log" 2>&1 || cat "$RUN.down.log" >&2
        if [ ! -s "$J" ]; then fails=$((fails + 1)); continue; fi
        cpu=$(awk -v c="$((c1 - c0))" -v hz="$(getconf CLK_TCK)" -v a="$t0" -v b="$t1" \
              'BEGIN {printf "%.0f", 100 * c / hz / (b - a)}')
        python3 - "$J" "$NAME" "$R" "$cpu" "$load1" >>"$OUT/summary.tsv" <<'PY' || fails=$((fails + 1))
import json, sys
j = json.load(open(sys.argv[1])); r = j["results"]
def f(k, d=1):
    v = r.get(k); return "-" if v is None else f"{v:.{d}f}"
print("\t".join([sys.argv[2], sys.argv[3], str(r["completed"]), str(r["failed"]),
                 f("duration"), f("request_throughput", 2), f("request_goodput", 2),
                 str(r.get("good_requests", 0)), f("p50_ttft_ms", 0), f("p99_ttft_ms", 0),
                 f("p50_tpot_ms"), f("p99_tpot_ms"), f("output_throughput", 0),
                 sys.argv[4], sys.argv[5],
                 f"{100.0 * r.get('good_requests', 0) / max(1, r['completed'] + r['failed']):.0f}"]))
PY
        tail -1 "$OUT/summary.tsv" | tr '\t' ' ' | sed 's/^/  = /'
    done
done
ELAPSED=$((SECONDS - T0))
echo "pd-sweep: $((${#SPLITS[@]})) splits x $(wc -w <<<"$RATES") rates in ${ELAPSED}s"
column -t -s $'\t' "$OUT/summary.tsv" 2>/dev/null || cat "$OUT/summary.tsv"

# ---- plot: goodput vs rate, one line per split ------------------------------
if command -v gnuplot >/dev/null 2>&1; then
    plot=""
    for sp in "${SPLITS[@]}"; do
        read -r NAME _ <<<"$sp"
        awk -F'\t' -v n="$NAME" 'NR > 1 && $1 == n {print $2, $7, $6}' "$OUT/summary.tsv" \
            >"$OUT/${NAME//:/}.dat"
        plot+="${plot:+, }'$OUT/${NAME//:/}.dat' using 1:2 with linespoints lw 2 pt 7 title '$NAME'"
    done
    TITLE="goodput (TTFT <= $SLO_TTFT, TPOT <= $SLO_TPOT), input $IN_LEN / output $OUT_LEN tokens"
    gnuplot <<GP || echo "pd-sweep: gnuplot failed" >&2
set terminal pngcairo size 900,560 font 'sans,11'
set output '$OUT/pd-sweep.png'
set title "$TITLE"
set xlabel 'offered request rate (req/s, Poisson)'
set ylabel 'goodput (req/s meeting the SLO)'
set key top left
set grid
set yrange [0:*]
plot $plot, x with lines dt 2 lc rgb 'gray' title 'offered rate'
GP
fi

# ---- report section ---------------------------------------------------------
python3 - "$OUT" "$SLO_TTFT" "$SLO_TPOT" "$IN_LEN" "$OUT_LEN" "$DURATION" "$ELAPSED" \
    "$QUICK$REAL" >"$OUT/section.md" <<'PY'
import csv, sys
out, ttft, tpot, inl, outl, dur, el, mode = sys.argv[1:]
rows = list(csv.DictReader(open(out + "/summary.tsv"), delimiter="\t"))
print("| split | rate | done/failed | goodput | SLO met | req/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | out tok/s | daemon CPU | load1 |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['split']} | {r['rate']} | {r['completed']}/{r['failed']} | **{r['goodput']}** | {r['attain_pct']} % | "
          f"{r['req_tput']} | {r['ttft_p50']} / {r['ttft_p99']} | {r['tpot_p50']} / {r['tpot_p99']} | "
          f"{r['out_tok_s']} | {r['daemon_cpu_pct']} % | {r['load1']} |")
best = {r["split"]: (0.0, "-") for r in rows}
for r in rows:
    g = float(r["goodput"]) if r["goodput"] not in ("-", "") else 0.0
    if g > best[r["split"]][0]:
        best[r["split"]] = (g, r["rate"])
print()
print("Peak goodput per split: " + ", ".join(f"{k} {v[0]:.2f} req/s (at {v[1]} req/s)" for k, v in best.items()) + ".")
PY
cat "$OUT/section.md"

if [ $QUICK = 1 ]; then
    # smoke: every request of the point must have finished within the SLO
    awk -F'\t' 'NR > 1 && ($4 != 0 || $8 == 0 || $3 == 0) {bad = 1} END {exit bad}' \
        "$OUT/summary.tsv" || { echo "pd-sweep: quick point failed or missed the SLO" >&2; fails=$((fails + 1)); }
    [ $(($(wc -l <"$OUT/summary.tsv") - 1)) = ${#SPLITS[@]} ] || fails=$((fails + 1))
fi
if [ $DOCS = 1 ]; then
    dst=$SRC/docs/pd-sweep.png
    [ $REAL = 1 ] && dst=$SRC/docs/pd-sweep-real.png
    say cp "$OUT/pd-sweep.png" "$dst"
    cp "$OUT/pd-sweep.png" "$dst"
fi
[ $fails = 0 ] || { echo "pd-sweep: $fails point(s) failed" >&2; exit 1; }
exit 0
