#!/bin/sh
# netns.sh <test_kvx_procs> <kvx-peer>: run the kvxfer pull and lease tests
# with exporter and importer in two network namespaces joined by a veth
# pair (UCX over tcp, addresses in 10.213.77.0/30 inside the namespaces).
# Exit 77 (meson: skipped) with a message when namespaces are not
# permitted; namespaces are always removed again.
set -u
procs=$1
peer=$2
tag="kvx$$"
nse="${tag}e"
nsi="${tag}i"
cleanup() {
    ip netns del "$nse" 2>/dev/null
    ip netns del "$nsi" 2>/dev/null
}
trap cleanup EXIT INT TERM
if ! command -v ip >/dev/null 2>&1; then
    echo "SKIP: iproute2 'ip' not found" >&2
    exit 77
fi
if ! ip netns add "$nse" 2>/dev/null || ! ip netns add "$nsi" 2>/dev/null; then
    echo "SKIP: cannot create network namespaces (need root/CAP_SYS_ADMIN)" >&2
    exit 77
fi
set -e
ip link add "${tag}a" type veth peer name "${tag}b"
ip link set "${tag}a" netns "$nse"
ip link set "${tag}b" netns "$nsi"
ip -n "$nse" addr add 10.213.77.1/30 dev "${tag}a"
ip -n "$nsi" addr add 10.213.77.2/30 dev "${tag}b"
ip -n "$nse" link set "${tag}a" up
ip -n "$nsi" link set "${tag}b" up
set +e
# UCX only lists interfaces with carrier: poll until both ends are up
n=0
until ip -n "$nse" link show "${tag}a" | grep -q LOWER_UP &&
      ip -n "$nsi" link show "${tag}b" | grep -q LOWER_UP; do
    n=$((n + 1))
    if [ $n -gt 500 ]; then
        echo "FAIL: veth pair never came up" >&2
        exit 1
    fi
    sleep 0.01
done
# tcp over the veth only (lo stays down): nothing shared between the sides
UCX_TLS=tcp UCX_WARN_UNUSED_ENV_VARS=n \
    KVX_NS_E="$nse" KVX_NS_I="$nsi" "$procs" "$peer" netns
