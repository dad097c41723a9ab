# sim2d.sh - sourced by drain-stall.sh and burst-spread.sh: their NP:2D
# deployment of sim-llama3-8b-sweep.ini (disaggregated always, loopback
# ports), stopped when the script exits.
#   sim2d_init NAME  with SRC, BUILD, OUT set: PDCTL, BENCH, OUT (made
#                    absolute; a mktemp dir if empty), RUN, the exit trap
#   sim2d_up NPF     brings it up with NPF prefills, sets URL, warms it up
#                    (5 s of short requests)
say() { printf '+ %s\n' "$*"; }

sim2d_init() {
    PDCTL=$BUILD/tools/pdctl/pdctl BENCH=$BUILD/tools/bench/pd-bench
    [ -n "$OUT" ] || OUT=$(mktemp -d "/tmp/$1.XXXXXX")
    mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
    RUN=$OUT/run
    trap '"$PDCTL" down --run-dir "$RUN" >/dev/null 2>&1' EXIT
}

sim2d_up() {
    local up=("$PDCTL" up "$SRC/tests/bench/sim-llama3-8b-sweep.ini" --run-dir "$RUN"
              --set prefill="$1" --set decode=2 --set disagg-mode=always
              --set router.http=127.0.0.1:0 --set router.control=127.0.0.1:0)
    say "${up[@]}"
    "${up[@]}" >"$OUT/up.log" 2>&1 || { tail -5 "$OUT/up.log" >&2; exit 1; }
    URL=$(cat "$RUN/url")
    "$BENCH" --url "$URL" --rate 2 --input-len 128 --prompt-ids 1000:30000 --output-len 32 \
        --seed 9 --duration 5s --ignore-eos --no-per-request --quiet >/dev/null 2>&1
}
