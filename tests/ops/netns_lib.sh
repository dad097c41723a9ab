# netns_lib.sh - sourced by the tests that emulate hosts with network
# namespaces (netns_e2e.sh, netns_ep.sh): a "switch" namespace with a
# bridge, host namespaces whose eth0 is $NET.1, $NET.2, ... on it, and a
# veth from the root namespace ($NET.254) so pdctl can reach the router.
#
#   netns_hosts PREFIX NAME...  -> namespaces PREFIX<name>-$ID (in NS[name]),
#                                  NET (198.18.N), HOSTIF; exit 77 (SKIP) if
#                                  namespaces cannot be made (not root)
#   netns_teardown               kill what runs in them, delete them
# The caller keeps its own cleanup trap and calls netns_teardown from it.

declare -A NS=()
NS_CREATED=()
ID=$(printf '%04x%02x' $(( $$ & 0xffff )) $(( RANDOM & 0xff )))
NET=198.18.$(( ( $$ + RANDOM ) % 250 + 1 ))
HOSTIF=

netns_teardown() {
    local ns p
    for ns in "${NS_CREATED[@]}"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    done
    [ -n "$HOSTIF" ] && ip link del "$HOSTIF" 2>/dev/null
    for ns in "${NS_CREATED[@]}"; do ip netns del "$ns" 2>/dev/null; done
    NS_CREATED=()
}

netns_hosts() {
    local prefix=$1 sw i name err
    shift
    command -v ip >/dev/null || { echo "SKIP: iproute2 (ip) not installed" >&2; exit 77; }
    sw=${prefix}s-$ID
    if ! err=$(ip netns add "$sw" 2>&1); then
        echo "SKIP: cannot create network namespaces ($err): run as root / with CAP_SYS_ADMIN" >&2
        exit 77
    fi
    NS_CREATED+=("$sw")
    for name in "$@"; do
        NS[$name]=$prefix$name-$ID
        ip netns add "${NS[$name]}" || { echo "FAIL: ip netns add ${NS[$name]}" >&2; exit 1; }
        NS_CREATED+=("${NS[$name]}")
    done
    set -e
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 up
    i=1
    for name in "$@"; do
        ip link add name eth0 netns "${NS[$name]}" type veth peer name "p$i" netns "$sw"
        ip -n "$sw" link set "p$i" master br0 up
        ip -n "${NS[$name]}" link set lo up
        ip -n "${NS[$name]}" addr add "$NET.$i/24" dev eth0
        ip -n "${NS[$name]}" link set eth0 up
        i=$((i + 1))
    done
    HOSTIF=${prefix}h$ID
    ip link add name "$HOSTIF" type veth peer name p9 netns "$sw"
    ip -n "$sw" link set p9 master br0 up
    ip addr add "$NET.254/24" dev "$HOSTIF"
    ip link set "$HOSTIF" up
    set +e
}
