#!/usr/bin/env bash
# test_run_local.sh SRC_ROOT BUILD_ROOT: `make run`'s script (pdctl up
# deploy/local-1p1d.ini --foreground) for real.
# Starts deploy/run-local.sh on OS-chosen ports with a private run dir, polls
# until it prints its URL, streams one chat completion with curl, queries an
# admin socket through the script, then SIGINTs it (as Ctrl-C would) and
# checks that every daemon exited and no socket / pid file is left.
set -u
src=$1 build=$2
command -v curl >/dev/null 2>&1 || { echo "curl not installed: skip"; exit 77; }
run=$(mktemp -d /tmp/pd-runlocal-XXXXXX)
set -m   # job control: the background script keeps SIGINT (not ignored)
PD_RUN_DIR=$run PD_HTTP_PORT=0 PD_CONTROL_PORT=0 "$src/deploy/run-local.sh" "$build" \
    > "$run/out.txt" 2>&1 &
script=$!
cleanup() {
    kill -TERM "$script" 2>/dev/null
    for f in "$run"/*.pid; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done
}
trap cleanup EXIT
die() { echo "FAIL: $*"; echo "--- script output"; cat "$run/out.txt"; tail -n 20 "$run"/*.log; exit 1; }

n=0
until grep -q '^pdserve deployment ".*" is ready: ' "$run/out.txt" 2>/dev/null; do
    kill -0 "$script" 2>/dev/null || die "run-local.sh exited before ready"
    [ $n -lt 600 ] || die "not ready after 60 s"
    sleep 0.1; n=$((n + 1))
done
url=$(sed -n 's/^pdserve deployment ".*" is ready: \(http[^ ]*\).*/\1/p' "$run/out.txt")
[ "$url" = "$(cat "$run/url")" ] || die "printed URL $url != $run/url"
grep -q 'curl -sN' "$run/out.txt" || die "no curl example printed"
stat -c %a "$run/secret" | grep -qx 600 || die "secret file mode is not 0600"
pids=$(cat "$run"/router.pid "$run"/prefill-0.pid "$run"/decode-0.pid) || die "pid files missing"
[ "$(echo $pids | wc -w)" = 3 ] || die "expected 3 pids, got: $pids"

body=$(curl -sN --max-time 30 "$url/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"stream":true,"max_tokens":8,"stream_options":{"include_usage":true},
         "messages":[{"role":"user","content":"Hello!"}]}')
echo "$body" | grep -q '"finish_reason":"\(length\|stop\)"' || die "no finish_reason: $body"
echo "$body" | tail -n 2 | grep -q '^data: \[DONE\]' || die "no [DONE]: $body"
kv=$(PD_RUN_DIR=$run "$src/deploy/run-local.sh" admin decode-0 kv) || die "admin kv failed"
echo "$kv" | grep -q '"blocks_total"' || die "admin kv reply: $kv"

kill -INT -- "-$script"   # the whole process group, as a terminal's Ctrl-C
n=0
while kill -0 "$script" 2>/dev/null; do
    [ $n -lt 400 ] || die "run-local.sh still running 20 s after SIGINT"
    sleep 0.05; n=$((n + 1))
done
wait "$script"; rc=$?
[ $rc = 0 ] || die "run-local.sh exit status $rc after SIGINT"
for p in $pids; do kill -0 "$p" 2>/dev/null && die "daemon pid $p still alive"; done
ls "$run"/*.sock "$run"/*.pid 2>/dev/null && die "sockets / pid files left behind"
grep -q 'pdctl: stopped' "$run/out.txt" || die "no orderly stop"
trap - EXIT
rm -rf "$run"
echo "ok: run-local.sh served $url and stopped cleanly"
