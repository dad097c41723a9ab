#!/bin/sh
# run_xcheck.sh TOK_CLI WORKDIR - cross-check against npm reference tokenizers.
# Installs the test-only npm packages (npm/package-lock.json) on first use;
# exits 77 (meson: skipped) when node/npm are missing or the install fails.
dir=$(cd "$(dirname "$0")/npm" && pwd)
# one install for every test using npm/ (tok_xcheck_npm, tok_bench_smoke,
# tok_chat_xcheck run in parallel)
sh "$dir/../../../npm-install.sh" "$dir" || exit $?
if [ "$3" = bench ]; then
    node "$dir/xcheck.mjs" "$1" "$2" >/dev/null || exit 1
    exec node "$dir/bench.mjs" "$1" "$2" "${4:-2}"
fi
exec node "$dir/xcheck.mjs" "$1" "$2"
