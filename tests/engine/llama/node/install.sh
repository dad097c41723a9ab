#!/bin/sh
# install.sh: sourced by the llama.cpp reference tests (../run_llamacpp.sh,
# run_llamacpp.sh; needs $dir = this folder): installs the test-only npm
# package node-llama-cpp (prebuilt llama.cpp CPU binaries; .npmrc: no
# optional GPU builds, no install scripts) into node_modules (git-ignored)
# once, through tests/npm-install.sh (one install shared by parallel tests).
# Exits 77 (skip) without node/npm or the registry.
#
# LLAMACPP_CPU=VARIANT (x64, haswell, skylakex, icelake, sapphirerapids,
# zen4, ...: the libggml-cpu-VARIANT.so files the package ships) forces
# llama.cpp onto that CPU variant: ggml loads the best-scoring
# libggml-cpu-*.so beside libggml, so variants/VARIANT/ gets a hard-linked
# copy of node_modules holding only that one, and $dir points there. A
# variant this CPU cannot execute scores 0 and llama.cpp fails to load: the
# test then fails, so only ask for variants the CPU runs (llref.mjs prints
# the one loaded as "llama.cpp cpu: X").
sh "$dir/../../../npm-install.sh" "$dir" || exit $?
if [ -n "${LLAMACPP_CPU:-}" ]; then
    bins=node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
    [ -f "$dir/$bins/libggml-cpu-$LLAMACPP_CPU.so" ] ||
        { echo "LLAMACPP_CPU=$LLAMACPP_CPU: no $bins/libggml-cpu-$LLAMACPP_CPU.so"; exit 1; }
    v=$dir/variants/$LLAMACPP_CPU
    (
        flock 9
        if [ ! -f "$v/.ok" ]; then
            rm -rf "$v" && mkdir -p "$v" && cp -al "$dir/node_modules" "$v/" &&
                find "$v/$bins" -name 'libggml-cpu-*.so' ! -name "libggml-cpu-$LLAMACPP_CPU.so" \
                    -delete && touch "$v/.ok" || exit 1
        fi
        cp "$dir"/*.mjs "$dir/package.json" "$v/" # the scripts as they are now
    ) 9>"$dir/.install.lock" || { echo "cannot make $v"; exit 1; }
    dir=$v
fi
