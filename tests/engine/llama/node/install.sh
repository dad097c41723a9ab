#!/bin/sh
# install.sh: sourced by the llama.cpp reference tests (../run_llamacpp.sh,
# run_llamacpp.sh): installs the test-only npm package node-llama-cpp
# (prebuilt llama.cpp CPU binaries; no build, no install scripts) into this
# folder's node_modules (git-ignored) once, under a lock so tests running
# in parallel share one install. Exits 77 (skip) without node/npm or the
# registry. Needs $dir = this folder.
command -v node >/dev/null 2>&1 || { echo "node not installed: skip"; exit 77; }
if [ ! -d "$dir/node_modules/node-llama-cpp" ] || [ ! -d "$dir/node_modules/@node-llama-cpp/linux-x64" ]; then
    command -v npm >/dev/null 2>&1 || { echo "npm not installed: skip"; exit 77; }
    (
        flock 9
        if [ ! -d "$dir/node_modules/@node-llama-cpp/linux-x64" ]; then
            cd "$dir" && timeout 600 npm install --omit=optional --ignore-scripts --no-audit \
                --no-fund --loglevel=error
        fi
    ) 9>"$dir/.install.lock" || { echo "npm install failed (offline?): skip"; exit 77; }
fi
