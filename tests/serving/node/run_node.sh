#!/bin/sh
# run_node.sh TEST_E2E ROUTER PREFILL DECODE PD_RUN MODEL NODE_DIR [SCRIPT [GROUP]]:
# install the official openai client (and zod, for its structured-output
# helper) into NODE_DIR/node_modules (git-ignored) on first use, then let
# test-e2e start a real deployment and run SCRIPT (default openai_e2e.mjs)
# against it (GROUP: test-e2e's deployment, default node). Exit 77 (skip) without node/npm or the registry.
set -u
bin=$1 router=$2 prefill=$3 decode=$4 pdrun=$5 model=$6 dir=$7 script=${8:-openai_e2e.mjs} group=${9:-node}
command -v node >/dev/null 2>&1 || { echo "node not installed: skip"; exit 77; }
sh "$(dirname "$0")/../../npm-install.sh" "$dir" || exit $?
exec "$bin" "$group" "$router" "$prefill" "$decode" "$pdrun" "$model" "$dir/$script"
