#!/bin/sh
# run_llamacpp.sh PD_RUN TOK_CLI MODEL NODE_DIR: install node-llama-cpp and
# its prebuilt linux-x64 CPU binary into NODE_DIR/node_modules (git-ignored,
# test-only; no build scripts run) on first use, then run
# llamacpp_check.mjs. Exit 77 (skip) without node/npm, the registry, or a
# prebuilt binary for this machine.
set -u
pdrun=$1 tokcli=$2 model=$3 dir=$4
command -v node >/dev/null 2>&1 || { echo "node not installed: skip"; exit 77; }
# one install shared with ../run_llamacpp.sh (same folder, same lock)
if [ ! -d "$dir/node_modules/node-llama-cpp" ] || [ ! -d "$dir/node_modules/@node-llama-cpp/linux-x64" ]; then
    command -v npm >/dev/null 2>&1 || { echo "npm not installed: skip"; exit 77; }
    (
        flock 9
        if [ ! -d "$dir/node_modules/@node-llama-cpp/linux-x64" ]; then
            cd "$dir" && timeout 600 npm ci --omit=optional --ignore-scripts --no-audit \
                --no-fund --loglevel=error
        fi
    ) 9>"$dir/.install.lock" || { echo "npm install failed (offline?): skip"; exit 77; }
fi
exec node "$dir/llamacpp_check.mjs" "$pdrun" "$tokcli" "$model"
