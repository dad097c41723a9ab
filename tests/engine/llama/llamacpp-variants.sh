#!/bin/sh
# llamacpp-variants.sh BUILD_DIR [VARIANT...]: the llama.cpp comparisons
# (llama-vs-llamacpp, ngram-model-llamacpp) once per CPU variant of
# node-llama-cpp's prebuilt llama.cpp (LLAMACPP_CPU, node/install.sh): by
# default every variant this CPU can execute. Shows that the comparisons
# hold whichever build of llama.cpp a machine's CPU selects. Prints one line
# per variant and test; exit 1 if any failed. Not part of `make test`
# (about 75 s per variant).
set -u
build=$(cd "${1:?usage: llamacpp-variants.sh BUILD_DIR [VARIANT...]}" && pwd)
shift
here=$(cd "$(dirname "$0")" && pwd)
dir=$here/node
. "$dir/install.sh"
bins=$dir/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
variants=${*:-$(ls "$bins" | sed -n 's/^libggml-cpu-\(.*\)\.so$/\1/p')}
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { for f in "$@"; do case " $flags " in *" $f "*) ;; *) return 1;; esac; done; }
# what each variant's ggml build needs (ggml/src/CMakeLists.txt's
# GGML_CPU_ALL_VARIANTS list; a variant whose features the CPU lacks scores 0)
runs() {
    case $1 in
        x64) return 0;;
        sse42) has sse4_2;;
        sandybridge) has sse4_2 avx;;
        ivybridge) has sse4_2 avx f16c;;
        piledriver) has sse4_2 avx f16c fma fma4;;
        haswell) has sse4_2 avx f16c avx2 bmi2 fma;;
        skylakex) has sse4_2 avx f16c avx2 bmi2 fma avx512f avx512cd avx512vl avx512dq avx512bw;;
        cannonlake) runs skylakex && has avx512vbmi avx512ifma;;
        cascadelake) runs skylakex && has avx512_vnni;;
        icelake) runs cannonlake && has avx512_vnni;;
        cooperlake) runs cascadelake && has avx512_bf16;;
        zen4) runs icelake && has avx512_bf16;;
        alderlake) has sse4_2 avx f16c avx2 bmi2 fma avx_vnni;;
        sapphirerapids) runs icelake && has avx512_bf16 amx_tile amx_int8;;
        *) return 1;;
    esac
}
fails=0
for v in $variants; do
    if ! runs "$v"; then echo "skip  $v: this CPU lacks its instructions"; continue; fi
    log=$(mktemp)
    LLAMACPP_CPU=$v "$here/run_llamacpp.sh" "$build/tests/engine/llama/test-llamacpp" \
        "$build/engine/gguf/pd-mkmodel" "$build/tests/engine/llama/llq" >"$log" 2>&1
    rc=$?
    loaded=$(sed -n 's/^llama.cpp cpu: //p' "$log" | sort -u | tr '\n' ' ')
    ties=$(sed -n 's/.*(\([0-9]*\) near-tie stops.*/\1/p' "$log" | awk '{ s += $1 } END { print s + 0 }')
    echo "$([ $rc = 0 ] && echo ok || echo FAIL)  $v llama-vs-llamacpp (loaded: $loaded; prompts stopped at a near-tie: $ties; $(tail -1 "$log"))"
    [ $rc = 0 ] || { fails=$((fails + 1)); grep -E "^FAIL|first difference" "$log" | head -5; }
    LLAMACPP_CPU=$v "$dir/run_llamacpp.sh" "$build/tests/engine/llama/pd-run-test-copy" \
        "$build/tests/engine/tok/tok_cli" "$build/engine/gguf/builtin.gguf" "$dir" >"$log" 2>&1
    rc=$?
    echo "$([ $rc = 0 ] && echo ok || echo FAIL)  $v ngram-model-llamacpp ($(grep -c near-tie "$log") near-ties; $(sed -n 's/^llama.cpp cpu: //p' "$log"))"
    [ $rc = 0 ] || { fails=$((fails + 1)); grep MISMATCH "$log" | head -3; }
    rm -f "$log"
done
exit $((fails > 0))
