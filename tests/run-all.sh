#!/usr/bin/env bash
# The test command behind `make test`: builds and runs every suite twice —
# a normal build (warnings are errors) and an ASan+UBSan build — plus, when
# clang is present, the libFuzzer targets for a fixed time each. Prints the
# time of each phase, the slowest tests, and a final line
# "N passed, N failed[, N skipped]" counting tests across all runs.
#   tests/run-all.sh [--quick]     --quick: normal build only
# Which tests each build runs, and why, is in tests/README.md ("Where the
# time goes").
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
phases=()
t_start=$SECONDS

phase_done() { # $1 = label, $2 = start (SECONDS)
  phases+=("$(printf '%-26s %4d s' "$1" $((SECONDS - $2)))")
}

count() { # $1 = build dir, $2 = label
  local log="$1/meson-logs/testlog.json"
  if [ ! -f "$log" ]; then
    summary+=("$2: no test log (build failed?)"); total_fail=$((total_fail + 1)); return
  fi
  read -r p f s < <(python3 tests/durations.py "$1" --count)
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f)); total_skip=$((total_skip + s))
  summary+=("$2: $p passed, $f failed, $s skipped")
}

# configure a tree (once)
setup() { # $1 = dir, $2 = label, $3.. = meson setup args ; env CC may be set
  local dir=$1 label=$2; shift 2
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; summary+=("$label: configure failed"); total_fail=$((total_fail + 1)); return 1; }
  fi
}

build_all() { # $1 = dir, $2 = label
  local t0=$SECONDS
  echo "=== [$2] build ($1)"
  if ! ninja -C "$1" -j "$JOBS" >"$1.build.log" 2>&1; then
    tail -50 "$1.build.log"; summary+=("$2: build failed"); total_fail=$((total_fail + 1)); return 1
  fi
  phase_done "$2 build" $t0
}

run_suites() { # $1 = dir, $2 = label, $3.. = extra meson test args
  local dir=$1 label=$2 t0=$SECONDS; shift 2
  echo "=== [$label] meson test"
  rm -f "$dir/meson-logs/testlog.json"
  meson test -C "$dir" --num-processes "$JOBS" --print-errorlogs "$@" || true
  count "$dir" "$label"
  phase_done "$label tests" $t0
}

# How busy the machine is before we start anything (percent of one core,
# from /proc/stat over one second): decides the background builds' priority.
busy_pct() {
  local a b
  a=($(head -1 /proc/stat)); sleep 1; b=($(head -1 /proc/stat))
  local idle=$(( (b[4] + b[5]) - (a[4] + a[5]) )) all=0 i
  for i in 1 2 3 4 5 6 7 8; do all=$(( all + b[i] - a[i] )); done
  [ "$all" -gt 0 ] || { echo 0; return; }
  echo $(( (all - idle) * 100 * $(nproc) / all ))
}
other_load=$(busy_pct)

# The test-only npm packages download while the first tree compiles (the
# installs wait on the network, the build on the CPU); each test's own
# npm-install.sh call then finds its folder installed, or waits on the
# folder's lock for the install under way.
for pkg in $(find tests -name package.json -not -path '*/node_modules/*' -not -path '*/variants/*'); do
  sh tests/npm-install.sh "$(dirname "$pkg")" >/dev/null 2>&1 &
done

# The fuzz suite's targets of a configured tree (paths ninja takes).
fuzz_targets() { # $1 = dir
  python3 - "$1" <<'PY'
import json, os, sys
d = sys.argv[1]
info = lambda k: json.load(open(os.path.join(d, "meson-info", "intro-%s.json" % k)))
files = {t["id"]: t["filename"] for t in info("targets")}
out = {os.path.relpath(f, d) for t in info("tests") if "pdserve:fuzz" in t["suite"]
       for dep in t["depends"] for f in files[dep]}
print("\n".join(sorted(out)))
PY
}

# The sanitizer and libFuzzer trees compile while the normal build's tests
# run. On a quiet machine they do so at the lowest CPU priority: those tests
# leave a core idle much of the time (daemons waiting on each other, tests
# run alone), and at nice 19 the compiler only takes what the tests leave.
# On a machine already busy with other work (more than half a core in use
# before we started) nice 19 would starve them behind that work -- they got
# 3-8 % of a core beside `stress-ng --cpu 2` and the run then waited minutes
# for them -- so there they compile at the normal priority and take their
# share beside the tests. Each tree's tests start once it is built. Runs in
# a subshell that sets its own priority, so every compiler it starts
# inherits it (and the renice below reaches those not started yet).
# The ASan tree keeps line tables only (-g1): the stack traces of a report
# name file and line as before, and the tree compiles in 3/4 of the time
# (full -g with variable tracking made the instrumented ggml_qdot.c 76 s of
# one core, 37 s with -g1).
background_builds() {
  local t0=$SECONDS
  [ "$other_load" -gt 50 ] || renice -n 19 -p $BASHPID >/dev/null
  if setup build-asan asan+ubsan -Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false -Dc_args=-g1; then
    ninja -C build-asan -j "$JOBS" >build-asan.build.log 2>&1
    echo $? >build-asan.build.rc
  fi
  if command -v clang >/dev/null 2>&1 &&
     CC=clang setup build-fuzz libfuzzer -Dfuzz=true -Db_lundef=false -Djemalloc=false; then
    # only the fuzz targets and what they link
    ninja -C build-fuzz -j "$JOBS" $(fuzz_targets build-fuzz) >build-fuzz.build.log 2>&1
    echo $? >build-fuzz.build.rc
  fi
  echo $((SECONDS - t0)) >build-bg.seconds
}

descendants() { # $1 = pid: it and every process below it
  ps -e -o pid=,ppid= | awk -v root="$1" '{ up[$1] = $2 }
    END { for (p in up) { q = p; while ((q in up) && q != root && q > 1) q = up[q]; if (q == root) print p } }'
}

built() { # $1 = dir, $2 = label: did the background build of $1 succeed?
  if [ "$(cat "$1.build.rc" 2>/dev/null)" != 0 ]; then
    tail -50 "$1.build.log" 2>/dev/null || tail -50 "$1.setup.log" 2>/dev/null
    summary+=("$2: build failed"); total_fail=$((total_fail + 1))
    return 1
  fi
}

if setup build normal -Dwerror=true && build_all build normal; then
  bg=
  if [ $quick = 0 ]; then
    rm -f build-asan.build.rc build-fuzz.build.rc build-bg.seconds
    background_builds >/dev/null 2>&1 & bg=$!
  fi
  run_suites build normal --no-suite fuzz-long --no-suite ucx-known-bug
  if [ -n "$bg" ]; then
    t0=$SECONDS
    echo "=== waiting for the ASan and libFuzzer builds (machine busy before the run: ${other_load} % of a core)"
    # nothing of ours runs beside them now: back to the normal priority (a
    # machine busy with other work would starve a nice-19 build; raising a
    # priority again needs root, otherwise they go on at 19)
    renice -n 0 -p $(descendants $bg) >/dev/null 2>&1 || true
    wait $bg
    phases+=("$(printf '%-26s %4d s (%d s beside the tests)' "asan + fuzz builds" \
      $((SECONDS - t0)) "$(cat build-bg.seconds 2>/dev/null || echo 0)")")
  fi
fi
wait # the npm installs, if the tests did not already
if [ $quick = 0 ]; then
  if built build-asan asan+ubsan; then
    # see tests/README.md: the package test builds its own (non-sanitizer)
    # tree; bench smokes measure; normal-only tests repeat code paths the
    # ASan build already runs (llama.cpp comparisons: numerics, not memory)
    run_suites build-asan asan+ubsan --no-suite bench-smoke --no-suite fuzz-long --no-suite ucx-known-bug \
      --no-suite package --no-suite normal-only --timeout-multiplier 3
  fi
  if [ -f build-fuzz.build.rc ] && built build-fuzz libfuzzer; then
    run_suites build-fuzz libfuzzer --suite fuzz
  fi
fi

echo
echo "Time per phase (tests/README.md has the breakdown):"
for line in "${phases[@]}"; do echo "  $line"; done
printf '  %-26s %4d s\n' "total" $((SECONDS - t_start))
echo "Slowest tests:"
for d in build build-asan; do
  [ -f "$d/meson-logs/testlog.json" ] && python3 tests/durations.py "$d" --top 8 | sed 's/^/  /'
done
for line in "${summary[@]}"; do echo "  $line"; done
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
[ "$total_fail" -eq 0 ]
