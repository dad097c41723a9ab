#!/bin/sh
# run_openai.sh TEST_BIN ROUTER MODEL NODE_DIR: install the openai client
# (test-only, node_modules is git-ignored) and run openai_test.mjs against
# pd-router + fake daemons. Exit 77 (skip) without node/npm or the package.
set -u
bin=$1 router=$2 model=$3 dir=$4
command -v node >/dev/null 2>&1 || { echo "node not installed: skip"; exit 77; }
sh "$(dirname "$0")/../../npm-install.sh" "$dir" || exit $?
exec "$bin" "$router" "$model" --node "$dir/openai_test.mjs"
