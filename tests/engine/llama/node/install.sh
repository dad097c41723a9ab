#!/bin/sh
# install.sh: sourced by the llama.cpp reference tests (../run_llamacpp.sh,
# run_llamacpp.sh): installs the test-only npm package node-llama-cpp
# (prebuilt llama.cpp CPU binaries; no build, no install scripts) into this
# folder's node_modules (git-ignored) once. Tests running in parallel share
# one install: the check and the install both happen under the lock, and
# only a finished install leaves the marker, so nobody sees a half-extracted
# package. Exits 77 (skip) without node/npm or the registry. Needs $dir =
# this folder.
command -v node >/dev/null 2>&1 || { echo "node not installed: skip"; exit 77; }
(
    flock 9
    [ -f "$dir/node_modules/.pdserve-install-ok" ] && exit 0
    command -v npm >/dev/null 2>&1 || { echo "npm not installed"; exit 1; }
    cd "$dir" && timeout 600 npm install --omit=optional --ignore-scripts --no-audit \
        --no-fund --loglevel=error && touch "$dir/node_modules/.pdserve-install-ok"
) 9>"$dir/.install.lock" || { echo "npm install failed (offline?): skip"; exit 77; }
