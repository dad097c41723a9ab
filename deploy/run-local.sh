#!/usr/bin/env bash
# `make run`: a local deployment (1 prefill : 1 decode) of the built-in model,
# i.e. `pdctl up deploy/local-1p1d.ini --foreground` with this build.
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
# Everything listens on 127.0.0.1 only: HTTP, control, /metrics, and the KV
# plane (kv-listen = 127.0.0.1: the daemons' UCX tcp listeners; without it
# UCX listens on every interface). tests/serving/test_listen.sh checks it. The daemons authenticate each other
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
PDCTL=$BUILD/tools/pdctl/pdctl
if [ ! -x "$PDCTL" ] || [ ! -f "$BUILD/engine/gguf/builtin.gguf" ]; then
    echo "run-local: building $BUILD" >&2
    [ -f "$BUILD/build.ninja" ] || meson setup "$BUILD"
    ninja -C "$BUILD"
fi
# The deployment itself is deploy/local-1p1d.ini, run by pdctl in the
# foreground: it generates the secret (0600), starts router + prefill-0 +
# decode-0 with their own logs, pid files and admin sockets under $RUN,
# waits for /ready, prints the URL and examples; Ctrl-C (or SIGTERM) stops
# everything, and if a daemon dies the rest are stopped too.
SETS=(--set "router.http=127.0.0.1:${PD_HTTP_PORT:-8000}"
      --set "router.control=127.0.0.1:${PD_CONTROL_PORT:-7000}"
      --set "prefill.kv-listen=127.0.0.1" --set "decode.kv-listen=127.0.0.1")
[ -n "${PD_LOCAL_MODEL:-}" ] && SETS+=(--set "deployment.model=$PD_LOCAL_MODEL")
[ -n "${PD_LOCAL_THREADS:-}" ] && SETS+=(--set "prefill.threads=$PD_LOCAL_THREADS"
                                        --set "decode.threads=$PD_LOCAL_THREADS")
exec "$PDCTL" up "$ROOT/deploy/local-1p1d.ini" --run-dir "$RUN" "${SETS[@]}" --foreground
