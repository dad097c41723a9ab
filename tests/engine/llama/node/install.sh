#!/bin/sh
# install.sh: sourced by the llama.cpp reference tests (../run_llamacpp.sh,
# run_llamacpp.sh): installs the test-only npm package node-llama-cpp
# (prebuilt llama.cpp CPU binaries; no build, no install scripts) into this
# folder's node_modules (git-ignored) once. Tests running in parallel share
# one install: the check and the install both happen under the lock, and
# only a finished install leaves the marker, so nobody sees a half-extracted
# package. Exits 77 (skip) without node/npm or the registry. Needs $dir =
# this folder.
sh "$dir/../../../npm-install.sh" "$dir" --omit=optional --ignore-scripts || exit $?
