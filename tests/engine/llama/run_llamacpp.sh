#!/bin/sh
# run_llamacpp.sh TEST PD_MKMODEL LLQ [filter]: install the test-only npm
# package node-llama-cpp (prebuilt llama.cpp CPU binaries, no build, no
# scripts) into node/ on first use, then run TEST against llama.cpp.
# Exit 77 (skip) without node/npm or the registry.
set -u
bin=$1 mk=$2 llq=$3
dir=$(cd "$(dirname "$0")/node" && pwd)
. "$dir/install.sh"
lib=$(ls "$dir"/node_modules/@node-llama-cpp/linux-x64/bins/*/libllama.v*.so 2>/dev/null | head -1)
[ -n "$lib" ] || { echo "no libllama in @node-llama-cpp/linux-x64: skip"; exit 77; }
shift 3
exec "$bin" "$mk" "$llq" "$lib" "$dir" "$@"
