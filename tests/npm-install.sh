#!/bin/sh
# npm-install.sh DIR [NPM_ARGS...]: install DIR's test-only npm packages
# (DIR/package.json, DIR/package-lock.json; node_modules is git-ignored)
# once. Every test that uses npm packages calls this first. Tests running in
# parallel share one install: the check and the install both happen under
# DIR/.install.lock, and only a finished install leaves the marker, so no
# test runs against a half-extracted package (two tests once ran
# `npm install` into the same folder at the same time in a fresh clone, and
# a third imported zod while it was being rewritten).
# Exit 0 when installed, 77 (meson: skip) without node/npm or the registry.
dir=$(cd "${1:?usage: npm-install.sh DIR [NPM_ARGS...]}" && pwd) || exit 1
shift
command -v node >/dev/null 2>&1 || { echo "SKIP: node not installed (apt-get install nodejs npm)"; exit 77; }
(
    flock 9
    # the marker holds the lock file's hash: a changed package-lock.json
    # (a package added) installs again in an existing checkout
    want=$(cat "$dir/package-lock.json" "$dir/package.json" 2>/dev/null | sha256sum | cut -c1-64)
    [ "$(cat "$dir/node_modules/.pdserve-install-ok" 2>/dev/null)" = "$want" ] && exit 0
    command -v npm >/dev/null 2>&1 || { echo "npm not installed"; exit 1; }
    cd "$dir" && timeout 600 npm install --no-audit --no-fund --loglevel=error "$@" >&2 &&
        echo "$want" >"$dir/node_modules/.pdserve-install-ok"
) 9>"$dir/.install.lock" || { echo "SKIP: npm install in $dir failed (registry unreachable?)"; exit 77; }
exit 0
