#!/bin/sh
# run_llamacpp.sh PD_RUN TOK_CLI MODEL NODE_DIR: install node-llama-cpp and
# its prebuilt linux-x64 CPU binary into NODE_DIR/node_modules (git-ignored,
# test-only; no build scripts run) on first use, then run
# llamacpp_check.mjs. Exit 77 (skip) without node/npm, the registry, or a
# prebuilt binary for this machine.
set -u
pdrun=$1 tokcli=$2 model=$3 dir=$4
. "$dir/install.sh"
exec node "$dir/llamacpp_check.mjs" "$pdrun" "$tokcli" "$model"
