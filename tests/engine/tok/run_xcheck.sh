#!/bin/sh
# run_xcheck.sh TOK_CLI WORKDIR - cross-check against npm reference tokenizers.
# Installs the test-only npm packages (npm/package-lock.json) on first use;
# exits 77 (meson: skipped) when node/npm are missing or the install fails.
dir=$(cd "$(dirname "$0")/npm" && pwd)
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "SKIP: node/npm not installed (apt-get install nodejs npm)"
    exit 77
fi
# One install for every test using npm/ (tok_xcheck_npm, tok_bench_smoke,
# tok_chat_xcheck run in parallel): only a finished install leaves the
# marker, and the check is made under the lock, so nobody runs against a
# half-extracted node_modules.
(
    flock 9
    [ -f "$dir/node_modules/.pdserve-install-ok" ] && exit 0
    cd "$dir" && timeout 300 npm ci --no-audit --no-fund --loglevel=error &&
        touch "$dir/node_modules/.pdserve-install-ok"
) 9>"$dir/.install.lock" || { echo "SKIP: npm install failed (registry unreachable?)"; exit 77; }
if [ "$3" = bench ]; then
    node "$dir/xcheck.mjs" "$1" "$2" >/dev/null || exit 1
    exec node "$dir/bench.mjs" "$1" "$2" "${4:-2}"
fi
exec node "$dir/xcheck.mjs" "$1" "$2"
