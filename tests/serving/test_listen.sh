#!/usr/bin/env bash
# test_listen.sh SRC_ROOT BUILD_ROOT: a local deployment listens on loopback
# only (issue 28 finding 2). Starts deploy/run-local.sh (pdctl up
# deploy/local-1p1d.ini) on OS-chosen ports, serves one request so the KV
# plane has been used, then reads every daemon's listening sockets from the
# kernel: the LISTEN rows of /proc/<pid>/net/tcp and tcp6 whose inode is one
# of /proc/<pid>/fd's sockets (HTTP, control, /metrics, and the UCX tcp
# listeners of the KV plane). Any of them on an address other than 127/8,
# ::1 or ::ffff:127/104 fails the test. Before kv-listen each pd-prefill and
# pd-decode had a UCX tcp listener on every interface (eth0 too). Also
# checks that `pdctl status` and the admin `kv` reply show the KV address.
set -u
src=$1 build=$2
command -v curl >/dev/null 2>&1 || { echo "curl not installed: skip"; exit 77; }
run=$(mktemp -d /tmp/pd-listen-XXXXXX)
set -m
PD_RUN_DIR=$run PD_HTTP_PORT=0 PD_CONTROL_PORT=0 "$src/deploy/run-local.sh" "$build" \
    > "$run/out.txt" 2>&1 &
script=$!
cleanup() {
    kill -INT -- "-$script" 2>/dev/null
    for f in "$run"/*.pid; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done
}
trap cleanup EXIT
die() { echo "FAIL: $*"; echo "--- script output"; cat "$run/out.txt"; exit 1; }

n=0
until grep -q '^pdserve deployment ".*" is ready: ' "$run/out.txt" 2>/dev/null; do
    kill -0 "$script" 2>/dev/null || die "run-local.sh exited before ready"
    [ $n -lt 600 ] || die "not ready after 60 s"
    sleep 0.1; n=$((n + 1))
done
url=$(cat "$run/url")
# a prompt long enough to be disaggregated (disagg-threshold 32): a KV pull
body=$(curl -s --max-time 30 "$url/v1/completions" -H 'Content-Type: application/json' \
    -d '{"max_tokens":4,"prompt":"The KV plane of a local deployment must stay on the loopback interface, for whoever reaches it can read the arena of a prefill daemon."}')
echo "$body" | grep -q '"finish_reason"' || die "no answer: $body"

# listen_rows PID: "file addr:port" for each LISTEN socket the process holds
listen_rows() {
    local pid=$1 inodes
    inodes=$(ls -l "/proc/$pid/fd" 2>/dev/null | sed -n 's/.*socket:\[\([0-9]*\)\]$/\1/p' | tr '\n' ' ')
    for f in tcp tcp6; do
        awk -v ino="$inodes" -v f="$f" 'BEGIN { n = split(ino, a, " "); for (i = 1; i <= n; i++) m[a[i]] = 1 }
            NR > 1 && $4 == "0A" && ($10 in m) { print f, $2 }' "/proc/$pid/net/$f"
    done
}
# loopback in /proc's hex (host byte order per 32-bit word, little-endian here)
is_loopback() {
    local file=$1 addr=${2%:*}
    if [ "$file" = tcp ]; then
        [ "${addr:6:2}" = 7F ]                                           # 127.x.y.z
    else
        [ "$addr" = 00000000000000000000000001000000 ] ||               # ::1
            [[ $addr == 0000000000000000FFFF0000??????7F ]]              # ::ffff:127.x
    fi
}
total=0
for name in router prefill-0 decode-0; do
    pid=$(cat "$run/$name.pid") || die "no pid file for $name"
    rows=$(listen_rows "$pid")
    [ -n "$rows" ] || die "$name (pid $pid): no listening socket found (cannot read /proc?)"
    while read -r file addr; do
        total=$((total + 1))
        is_loopback "$file" "$addr" ||
            die "$name (pid $pid) listens on a non-loopback address: /proc/$pid/net/$file $addr"
    done <<<"$rows"
    echo "$name: $(echo "$rows" | wc -l) listening sockets, all on loopback"
done
# router: HTTP + control; each node: /metrics + at least one UCX tcp listener
[ $total -ge 6 ] || die "only $total listening sockets seen (expected >= 6)"

kv=$(PD_RUN_DIR=$run "$src/deploy/run-local.sh" admin prefill-0 kv) || die "admin kv failed"
echo "$kv" | grep -q '"kv_listen":"127.0.0.1"' || die "admin kv: no kv_listen 127.0.0.1: $kv"
echo "$kv" | grep -q '"kv_device":"lo"' || die "admin kv: no kv_device lo: $kv"
st=$("$build/tools/pdctl/pdctl" status --run-dir "$run") || die "pdctl status failed"
echo "$st" | grep -q 'KV-LISTEN' || die "pdctl status: no KV-LISTEN column: $st"
[ "$(echo "$st" | grep -c '127.0.0.1(lo)')" = 2 ] || die "pdctl status: KV address: $st"

kill -INT -- "-$script"
n=0
while kill -0 "$script" 2>/dev/null; do
    [ $n -lt 400 ] || die "run-local.sh still running 20 s after SIGINT"
    sleep 0.05; n=$((n + 1))
done
trap - EXIT
rm -rf "$run"
echo "ok: $total listening sockets of router, prefill-0, decode-0, all on loopback"
