#!/bin/sh
# amx-table.sh - issue 37's table: pd-eng-bench prefill tok/s at 64, 512 and
# 2048 tokens and batch-32 decode, PD_QDOT=vnni vs amx run back to back per
# cell, for each model and thread count, --rounds rounds; prints the raw
# lines (path, threads, prompt, model row) to stdout and, at the end, the
# best of the rounds per cell as a markdown table.
#
# usage: tests/bench/amx-table.sh [--bench BIN] [--rounds N] [--threads "1 2"]
#        [--prefill "64 512 2048"] MODEL.gguf...
# Models: pd-mkmodel --preset bench-0.5b --layers 6 --type T (docs/BENCHMARKS.md).
set -eu
bench=build/engine/pd-eng-bench rounds=3 threads="1 2" prefill="64 512 2048"
while [ $# -gt 0 ]; do
    case $1 in
    --bench) bench=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --prefill) prefill=$2; shift 2 ;;
    --*) echo "usage: $0 [--bench BIN] [--rounds N] [--threads LIST] [--prefill LIST] MODEL..." >&2
         exit 2 ;;
    *) break ;;
    esac
done
[ $# -gt 0 ] || { echo "$0: no model" >&2; exit 2; }
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
for r in $(seq 1 "$rounds"); do
    for m in "$@"; do
        for t in $threads; do
            for p in $prefill; do
                # batch-32 decode with the 512-token runs only
                if [ "$p" = 512 ]; then b="--batches 32 --steps 4"; else b="--batches 1 --steps 1"; fi
                for q in vnni amx; do
                    line=$(PD_QDOT=$q "$bench" --model "$m" --threads "$t" --prefill "$p" $b |
                           grep "^$(basename "$m") ")
                    echo "$q $t $p $line" | tee -a "$raw"
                done
            done
        done
    done
done
# fields: path threads prompt model type isa params MB/token prefill/s [dec@b32]
echo
echo "| model | threads | prefill 64 VNNI / AMX | prefill 512 | prefill 2048 | decode b32 (at 512 runs) |"
echo "|---|---:|---|---|---|---|"
awk '{ k = $4 SUBSEP $2; key[k] = 1
       v = $9 + 0; c = $1 SUBSEP k SUBSEP $3; if (v > best[c]) best[c] = v
       if ($3 == 512 && NF >= 10) { d = $1 SUBSEP k SUBSEP "dec"; if ($10 + 0 > best[d]) best[d] = $10 + 0 } }
     END { n = 0
       for (k in key) order[++n] = k
       for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (order[j] < order[i]) { t = order[i]; order[i] = order[j]; order[j] = t }
       for (i = 1; i <= n; i++) { k = order[i]; split(k, f, SUBSEP); line = "| " f[1] " | " f[2]
         split("64 512 2048 dec", cols, " ")
         for (c = 1; c <= 4; c++) { a = best["vnni" SUBSEP k SUBSEP cols[c]]; b = best["amx" SUBSEP k SUBSEP cols[c]]
           line = line sprintf(" | %.0f / %.0f (%.2fx)", a, b, a > 0 ? b / a : 0) }
         print line " |" } }' "$raw"
