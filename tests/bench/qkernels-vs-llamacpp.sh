#!/bin/sh
# qkernels-vs-llamacpp.sh - issue 11's side-by-side: pdserve's llama engine
# (build/engine/pd-eng-bench) and llama.cpp (npm node-llama-cpp's prebuilt CPU
# build, offline, tests/engine/llama/node/llbench.mjs) on the same GGUF
# files, alternating engine by engine, at each thread count:
#   decode tok/s at batch 1 (fastest of 8 steps at position 64) and
#   prefill tok/s of 64 tokens (--prefill N: N; best of 3), best of --rounds rounds,
# then the ratios pdserve / llama.cpp, and pdserve's batch-32 aggregate
# decode vs batch 1 for Q4_K_M.
#
# usage: tests/bench/qkernels-vs-llamacpp.sh [--build DIR] [--dir DIR]
#        [--types "f16 q8_0 q4_0 q4_K_M q6_K"] [--threads "1 2"] [--rounds 2]
#        [--layers N] [--prefill N]
# Models: pd-mkmodel --preset bench-0.5b --ffn 3584 --vocab-type spm --type T
# (the geometry of issue 11's table: ffn rows of whole K-quant super-blocks; made once
# into --dir, default /tmp/pd-qkbench; ~3 GB for the five types).
# Run it alone: on a shared 2-core machine every figure is a lower bound.
set -eu
build=build dir=/tmp/pd-qkbench types="f16 q8_0 q4_0 q4_K_M q6_K" threads="1 2" rounds=2
layers= prefill=64
while [ $# -gt 0 ]; do
    case $1 in
    --build) build=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --types) types=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --layers) layers="--layers $2"; shift 2 ;;
    --prefill) prefill=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--dir DIR] [--types LIST] [--threads LIST]" \
            "[--rounds N] [--layers N] [--prefill N]" >&2; exit 2 ;;
    esac
done
src=$(cd "$(dirname "$0")/../.." && pwd)
node_dir=$src/tests/engine/llama/node
mk=$build/engine/gguf/pd-mkmodel bench=$build/engine/pd-eng-bench
[ -x "$mk" ] && [ -x "$bench" ] || { echo "build pd-mkmodel and pd-eng-bench first ($build)" >&2; exit 1; }
dir_=$node_dir
( dir=$dir_; . "$node_dir/install.sh" ) || { echo "node-llama-cpp not available" >&2; exit 1; }
mkdir -p "$dir"

for t in $types; do
    f=$dir/bench-$t.gguf
    [ -s "$f" ] || "$mk" --preset bench-0.5b --ffn 3584 --vocab-type spm $layers --type "$t" -o "$f" >/dev/null
done

# best (max) of a value over rounds: file per (engine, type, threads, metric)
res=$(mktemp -d)
trap 'rm -rf "$res"' EXIT
keep_max() { # file value
    if [ ! -s "$1" ] || awk -v a="$2" -v b="$(cat "$1")" 'BEGIN { exit !(a > b) }'; then
        echo "$2" >"$1"
    fi
}
for r in $(seq 1 "$rounds"); do
    for t in $types; do
        for th in $threads; do
            f=$dir/bench-$t.gguf
            line=$("$bench" --model "$f" --threads "$th" --batches 1 --prefill "$prefill" --steps 8 |
                   grep "^bench-$t.gguf")
            keep_max "$res/pd.$t.$th.pre" "$(echo "$line" | awk '{ print $6 }')"
            keep_max "$res/pd.$t.$th.dec" "$(echo "$line" | awk '{ print $7 }')"
            js=$(cd "$node_dir" && node llbench.mjs "$f" "$th" "$prefill" 8)
            keep_max "$res/ll.$t.$th.pre" "$(echo "$js" | sed 's/.*"prefill_tps":\([0-9.e+-]*\).*/\1/')"
            keep_max "$res/ll.$t.$th.dec" "$(echo "$js" | sed 's/.*"decode_tps":\([0-9.e+-]*\).*/\1/')"
            echo "round $r $t ${th}t: pdserve $(cat "$res/pd.$t.$th.dec") / $(cat "$res/pd.$t.$th.pre")," \
                 "llama.cpp $(cat "$res/ll.$t.$th.dec") / $(cat "$res/ll.$t.$th.pre") (best so far)" >&2
        done
    done
done

echo "| type, threads | decode b1 tok/s pdserve / llama.cpp (ratio) | prefill $prefill tok/s pdserve / llama.cpp (ratio) |"
echo "|---|---|---|"
for t in $types; do
    for th in $threads; do
        pd=$(cat "$res/pd.$t.$th.dec") ll=$(cat "$res/ll.$t.$th.dec")
        pp=$(cat "$res/pd.$t.$th.pre") lp=$(cat "$res/ll.$t.$th.pre")
        awk -v t="$t" -v th="$th" -v pd="$pd" -v ll="$ll" -v pp="$pp" -v lp="$lp" 'BEGIN {
            printf "| %s, %s | %.1f / %.1f (**%.2f**) | %.0f / %.0f (**%.2f**) |\n",
                   t, th, pd, ll, pd / ll, pp, lp, pp / lp }'
    done
done

case " $types " in *" q4_K_M "*)
    echo
    echo "pdserve batch 32 vs batch 1, Q4_K_M (aggregate decode tok/s):"
    for th in $threads; do
        "$bench" --model "$dir/bench-q4_K_M.gguf" --threads "$th" --batches 1,32 --prefill 8 \
            --steps 6 | grep -E "^(model|bench-)" | sed "s/^/  ${th}t: /"
    done ;;
esac
