#!/usr/bin/env bash
# The test command behind `make test`: builds and runs every suite twice —
# a normal build (warnings are errors) and an ASan+UBSan build — plus, when
# clang is present, the libFuzzer targets for a short bounded run. Prints a
# final line "N passed, N failed[, N skipped]" counting tests across all runs.
#   tests/run-all.sh [--quick]     --quick: normal build only
set -uo pipefail
cd "$(dirname "$0")/.."
TOP=$PWD
JOBS=${JOBS:-2}
quick=0; [ "${1:-}" = "--quick" ] && quick=1

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$TOP/tests/lsan.supp:print_suppressions=0}"
# UCX prints warnings about memlock limits etc.; keep test logs readable.
export UCX_WARN_UNUSED_ENV_VARS=n

total_pass=0; total_fail=0; total_skip=0
summary=()

count() { # $1 = build dir, $2 = label
  local log="$1/meson-logs/testlog.json"
  if [ ! -f "$log" ]; then
    summary+=("$2: no test log (build failed?)"); total_fail=$((total_fail + 1)); return
  fi
  read -r p f s < <(python3 - "$log" <<'PY'
import json, sys
p = f = s = 0
for line in open(sys.argv[1]):
    line = line.strip()
    if not line:
        continue
    r = json.loads(line).get("result", "")
    if r in ("OK", "EXPECTEDFAIL"): p += 1
    elif r == "SKIP": s += 1
    else: f += 1
print(p, f, s)
PY
)
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f)); total_skip=$((total_skip + s))
  summary+=("$2: $p passed, $f failed, $s skipped")
}

run_build() { # $1 = dir, $2 = label, $3.. = meson setup args ; env CC may be set
  local dir=$1 label=$2; shift 2
  echo "=== [$label] configure + build ($dir)"
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; summary+=("$label: configure failed"); total_fail=$((total_fail + 1)); return 1; }
  fi
  if ! ninja -C "$dir" -j "$JOBS" >"$dir.build.log" 2>&1; then
    tail -50 "$dir.build.log"; summary+=("$label: build failed"); total_fail=$((total_fail + 1)); return 1
  fi
  return 0
}

run_suites() { # $1 = dir, $2 = label, $3.. = extra meson test args
  local dir=$1 label=$2; shift 2
  echo "=== [$label] meson test"
  rm -f "$dir/meson-logs/testlog.json"
  meson test -C "$dir" --num-processes "$JOBS" --print-errorlogs "$@" || true
  count "$dir" "$label"
}

if run_build build normal -Dwerror=true; then
  run_suites build normal --no-suite fuzz-long
fi
if [ $quick = 0 ]; then
  if run_build build-asan asan+ubsan -Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false; then
    # the package test builds its own (non-sanitizer) tree: once, in the normal build
    run_suites build-asan asan+ubsan --no-suite bench-smoke --no-suite fuzz-long --no-suite package --timeout-multiplier 3
  fi
  if command -v clang >/dev/null 2>&1; then
    if CC=clang run_build build-fuzz libfuzzer -Dfuzz=true -Db_lundef=false -Djemalloc=false; then
      run_suites build-fuzz libfuzzer --suite fuzz
    fi
  fi
fi

echo
for line in "${summary[@]}"; do echo "  $line"; done
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
[ "$total_fail" -eq 0 ]
