#!/usr/bin/env bash
# tests/ops: README.md's "A tour" block, verbatim, against `make run`.
#   test_readme_tour.sh SRC_ROOT BUILD_ROOT
# `make run` is deploy/run-local.sh (what the Makefile runs after the build)
# on a free HTTP port given by PD_HTTP_PORT, as the README documents; every
# other line of the block runs as written, from a directory where `build` is
# this build and `run` the run dir, with "localhost:8000" pointed at that
# port. Checks: each command exits 0; the chat prompt is disaggregated
# (`pdctl xfer all` shows pulls from prefill-0); the scale, drain, admin and
# socat lines do what their comments say. Also the pd-run path of "Other
# models". Ctrl-C (SIGINT to the group) stops everything.
set -u
SRC=$1 BUILD=$2
command -v curl >/dev/null 2>&1 && command -v socat >/dev/null 2>&1 || { echo "skip: curl/socat"; exit 77; }
T=$(mktemp -d /tmp/pd-tour.XXXXXX)
ln -s "$BUILD" "$T/build"
cd "$T" || exit 1
fails=0
ok()   { echo "ok   - $*"; }
bad()  { echo "FAIL - $*"; fails=$((fails + 1)); }
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
set -m
PD_HTTP_PORT=$PORT PD_CONTROL_PORT=0 PD_RUN_DIR=$T/run "$SRC/deploy/run-local.sh" build >"$T/make-run.txt" 2>&1 &
script=$!
cleanup() {
    kill -INT -- "-$script" 2>/dev/null
    local n=0
    while kill -0 "$script" 2>/dev/null && [ $n -lt 400 ]; do sleep 0.05; n=$((n + 1)); done
    for f in "$T"/run/*.pid; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done
    [ -n "${KEEP:-}" ] || rm -rf "$T"
}
trap cleanup EXIT
n=0
until grep -q 'is ready: ' "$T/make-run.txt" 2>/dev/null; do
    kill -0 "$script" 2>/dev/null || { bad "make run exited: $(cat "$T/make-run.txt")"; exit 1; }
    [ $n -lt 600 ] || { bad "make run: not ready after 60 s"; exit 1; }
    sleep 0.1; n=$((n + 1))
done
grep -q "http://127.0.0.1:$PORT" "$T/make-run.txt" && ok "make run (PD_HTTP_PORT=$PORT) is ready" ||
    bad "make run did not use PD_HTTP_PORT: $(cat "$T/make-run.txt")"

# the block: the first ```sh after "## A tour", continuation lines joined
python3 - "$SRC/README.md" >"$T/tour.txt" <<'PY'
import sys
text = open(sys.argv[1]).read()
block = text.split("## A tour", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
cmd = ""
for line in block.splitlines():
    cmd += line[:-1] + " " if line.endswith("\\") else line
    if not line.endswith("\\"):
        print(cmd)
        cmd = ""
PY
check_out() {  # check_out WHAT REGEX: the last command's output matches
    if grep -qE -- "$2" "$T/out"; then ok "$1"; else bad "$1: $(head -c 600 "$T/out")"; fi
}
while IFS= read -r line; do
    cmd=${line%%#*}                          # the comment is not part of it
    cmd=${cmd%"${cmd##*[![:space:]]}"}
    [ -n "$cmd" ] || continue
    [ "$cmd" = "make run" ] && continue      # started above
    cmd=${cmd//localhost:8000/localhost:$PORT}
    bash -c "$cmd" </dev/null >"$T/out" 2>&1
    rc=$?
    if [ $rc = 0 ]; then ok "tour: $cmd"; else bad "tour (rc=$rc): $cmd: $(tail -5 "$T/out")"; continue; fi
    case $cmd in
    curl*) check_out "tour: the chat streams to a finish_reason" '"finish_reason":"(length|stop)"' ;;
    *"pdctl top"*) check_out "tour: top renders" "TTFT p50" ;;
    *"scale decode 3"*) check_out "tour: scale" "decode: 3 daemons" ;;
    *"xfer all"*) check_out "tour: the chat prompt was disaggregated (KV pulled from prefill-0)" \
                      "^decode-[0-9] +prefill-0 +\S+ +[1-9]" ;;
    *"kv all"*) check_out "tour: kv all lists the pools" "decode-2" ;;
    *"drain decode-1"*) check_out "tour: drain" "decode-1: drain" ;;
    *"admin decode-0 help"*) check_out "tour: admin" '"name":[[:space:]]*"xfer"' ;;
    *socat*) check_out "tour: socat on the admin socket" '^\{"ok":true,"xfer":' ;;
    esac
done <"$T/tour.txt"
[ "$(grep -c . "$T/tour.txt")" -ge 8 ] || bad "tour block not found or too short: $(cat "$T/tour.txt")"
# "Other models": the single-process reference path
cmd=$(grep -o 'build/engine/pd-run --model M --prompt "[^"]*"' "$SRC/README.md")
cmd=${cmd/--model M/--model build/engine/gguf/builtin.gguf}
cmd=${cmd/…/Hello}
if [ -n "$cmd" ] && bash -c "$cmd --max-tokens 4" >"$T/out" 2>&1; then ok "README's pd-run path: $cmd"
else bad "README's pd-run line: $cmd: $(tail -3 "$T/out")"; fi
echo "tour: $fails failure(s)"
[ $fails = 0 ]
