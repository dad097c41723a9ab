#!/usr/bin/env bash
# `make run`: a local deployment (1 prefill : 1 decode) of the built-in model.
#
#   deploy/run-local.sh [BUILD_DIR]          start, stay in the foreground, Ctrl-C stops
#   deploy/run-local.sh admin NAME CMD...    one admin command (NAME: router,
#                                            prefill-0, decode-0), JSON reply
# Environment:
#   PD_HTTP_PORT     HTTP port of pd-router (default 8000; 0 = any free port)
#   PD_CONTROL_PORT  control-plane port (default 7000; 0 = any free port)
#   PD_RUN_DIR       state dir: secret, logs, pid files, admin sockets (default ./run)
#   PD_LOCAL_MODEL   GGUF path or sim:<preset> (default BUILD/engine/gguf/builtin.gguf)
#   PD_LOCAL_THREADS engine threads per daemon (default 1)
# Everything listens on 127.0.0.1 only. The daemons authenticate each other
# with the secret in $PD_RUN_DIR/secret (32 random bytes, hex, mode 0600),
# generated on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUN=${PD_RUN_DIR:-$ROOT/run}

admin() {
    local name=$1; shift
    local sock=$RUN/$name.sock
    [ -S "$sock" ] || { echo "no admin socket $sock (is the deployment running?)" >&2; exit 1; }
    if command -v socat >/dev/null 2>&1; then
        printf '%s\n' "$*" | socat -t 5 - UNIX-CONNECT:"$sock"
    elif command -v python3 >/dev/null 2>&1; then
        python3 - "$sock" "$*" <<'EOF'
import socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1])
s.sendall((sys.argv[2] + "\n").encode()); b = b""
while not b.endswith(b"\n"):
    x = s.recv(65536)
    if not x: break
    b += x
sys.stdout.write(b.decode())
EOF
    else
        echo "need socat or python3 to talk to $sock" >&2; exit 1
    fi
}

if [ "${1:-}" = admin ]; then
    shift
    [ $# -ge 2 ] || { echo "usage: $0 admin NAME CMD..." >&2; exit 2; }
    admin "$@"
    exit 0
fi

BUILD=${1:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
HTTP_PORT=${PD_HTTP_PORT:-8000}
CONTROL_PORT=${PD_CONTROL_PORT:-7000}
THREADS=${PD_LOCAL_THREADS:-1}
ROUTER=$BUILD/router/pd-router
PREFILL=$BUILD/prefill/pd-prefill
DECODE=$BUILD/decode/pd-decode
MODEL=${PD_LOCAL_MODEL:-$BUILD/engine/gguf/builtin.gguf}

for b in "$ROUTER" "$PREFILL" "$DECODE"; do
    if [ ! -x "$b" ]; then
        echo "run-local: $b missing; building $BUILD" >&2
        [ -f "$BUILD/build.ninja" ] || meson setup "$BUILD"
        ninja -C "$BUILD"
        break
    fi
done
case $MODEL in
sim:*) ;;
*)  if [ ! -f "$MODEL" ]; then
        echo "run-local: generating the built-in model $MODEL" >&2
        ninja -C "$BUILD" engine/gguf/builtin.gguf >/dev/null 2>&1 ||
            "$BUILD/engine/gguf/pd-mkmodel" --preset builtin -o "$MODEL"
    fi ;;
esac

mkdir -p "$RUN"
chmod 700 "$RUN"
# Refuse to start twice on the same run dir.
for name in router prefill-0 decode-0; do
    if [ -f "$RUN/$name.pid" ] && kill -0 "$(cat "$RUN/$name.pid")" 2>/dev/null; then
        echo "run-local: $name already running (pid $(cat "$RUN/$name.pid"), $RUN); stop it first" >&2
        exit 1
    fi
done
SECRET=$RUN/secret
if [ ! -s "$SECRET" ]; then
    (umask 077; od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$SECRET.tmp" && mv "$SECRET.tmp" "$SECRET")
fi
chmod 600 "$SECRET"

PIDS=()
NAMES=()
stopping=0
stop_all() {
    [ $stopping = 1 ] && return
    stopping=1
    trap '' INT TERM
    echo
    echo "run-local: stopping..."
    # daemons first (SIGTERM drains), then the router
    local i
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        kill -TERM "${PIDS[$i]}" 2>/dev/null || true
        wait_exit "${PIDS[$i]}" "${NAMES[$i]}"
    done
    rm -f "$RUN"/*.pid "$RUN"/*.ready "$RUN/url"
    echo "run-local: stopped"
}
wait_exit() {   # pid name: wait up to 15 s, then SIGKILL
    local pid=$1 name=$2 n=0
    while kill -0 "$pid" 2>/dev/null && [ $n -lt 300 ]; do
        sleep 0.05; n=$((n + 1))
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "run-local: $name did not stop in 15 s: SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}
fail() {
    echo "run-local: $*" >&2
    for f in "$RUN"/*.log; do echo "--- $f"; tail -n 15 "$f"; done >&2
    stop_all
    exit 1
}
trap 'stop_all; exit 0' INT TERM
trap 'stop_all' EXIT

start() {   # name binary args...
    local name=$1 bin=$2; shift 2
    rm -f "$RUN/$name.ready" "$RUN/$name.sock"
    echo "### $(date -u +%FT%TZ) $bin $*" >> "$RUN/$name.log"
    "$bin" "$@" --admin.socket="$RUN/$name.sock" --ready-file="$RUN/$name.ready" \
        </dev/null >> "$RUN/$name.log" 2>&1 &
    local pid=$!
    echo "$pid" > "$RUN/$name.pid"
    PIDS+=("$pid")
    NAMES+=("$name")
}
wait_ready_file() {   # name: poll its ready file (30 s bound)
    local name=$1 n=0 pid
    pid=$(cat "$RUN/$name.pid")
    until [ -s "$RUN/$name.ready" ]; do
        kill -0 "$pid" 2>/dev/null || fail "$name exited during start-up (see $RUN/$name.log)"
        [ $n -lt 600 ] || fail "$name not ready after 30 s"
        sleep 0.05; n=$((n + 1))
    done
}
json_int() { sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" "$2"; }

start router "$ROUTER" --model="$MODEL" --http=127.0.0.1:"$HTTP_PORT" \
    --control=127.0.0.1:"$CONTROL_PORT" --secret-file="$SECRET"
wait_ready_file router
HTTP_PORT=$(json_int http "$RUN/router.ready")
CONTROL_PORT=$(json_int control "$RUN/router.ready")
[ -n "$HTTP_PORT" ] && [ -n "$CONTROL_PORT" ] || fail "cannot read ports from $RUN/router.ready"

for role in prefill decode; do
    bin=$PREFILL; [ $role = decode ] && bin=$DECODE
    start $role-0 "$bin" --id=$role-0 --model="$MODEL" --router=127.0.0.1:"$CONTROL_PORT" \
        --secret-file="$SECRET" --threads="$THREADS"
done
wait_ready_file prefill-0
wait_ready_file decode-0

URL=http://127.0.0.1:$HTTP_PORT
n=0
until [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/ready" 2>/dev/null)" = 200 ]; do
    for i in "${!PIDS[@]}"; do
        kill -0 "${PIDS[$i]}" 2>/dev/null || fail "${NAMES[$i]} exited (see $RUN/${NAMES[$i]}.log)"
    done
    [ $n -lt 600 ] || fail "$URL/ready not 200 after 30 s"
    sleep 0.05; n=$((n + 1))
done
echo "$URL" > "$RUN/url"

ADM="deploy/run-local.sh admin"
[ "$RUN" = "$ROOT/run" ] || ADM="PD_RUN_DIR=$RUN $ADM"
MODEL_ID=$(curl -s "$URL/v1/models" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')
cat <<EOF
pdserve is ready: $URL  (model "$MODEL_ID"; 1 prefill : 1 decode; state in $RUN)

  curl -sN $URL/v1/chat/completions -H 'Content-Type: application/json' -d '{
    "model": "$MODEL_ID", "stream": true, "max_tokens": 32,
    "messages": [{"role": "user", "content": "Hello!"}]}'

  Admin sockets: $RUN/{router,prefill-0,decode-0}.sock, e.g.
    $ADM decode-0 kv        # or: echo kv | socat - UNIX-CONNECT:$RUN/decode-0.sock
    $ADM router backends    # also: requests, stats, help
  Logs: $RUN/*.log    Stop: Ctrl-C
EOF

# Foreground: return when any process exits (then stop the rest) or on Ctrl-C.
set +e
wait -n "${PIDS[@]}"
rc=$?
if [ $stopping = 0 ]; then
    for i in "${!PIDS[@]}"; do
        kill -0 "${PIDS[$i]}" 2>/dev/null || echo "run-local: ${NAMES[$i]} exited (status $rc); see $RUN/${NAMES[$i]}.log" >&2
    done
    stop_all
    exit 1
fi
