#!/usr/bin/env bash
# layering.sh SRCDIR - the layering rules of ARCHITECTURE.md §7, checked by
# grepping the tree: who may include what. Prints every violation; exit 1
# if there is one.
set -uo pipefail
cd "${1:-$(dirname "$0")/..}" || exit 2
bad=0
fail() { echo "layering: $*"; bad=1; }

# the quoted includes of the C files under the given folders
incs() { grep -rhoE '^#include "[^"]+"' --include=*.c --include=*.h "$@" | sed 's/.*"\(.*\)"/\1/' | sort -u; }
# header names that live under the given folders
hdrs() { find "$@" -name '*.h' -printf '%f\n' | sort -u; }
# includes of $1.. (folders) that are not headers of the allowed folders
check_only() { # name, "folders checked", "folders allowed", extra allowed names...
    local name=$1 checked=$2 allowed=$3; shift 3
    local ok; ok=$( (hdrs $allowed; printf '%s\n' pd_build_config.h "$@") | sort -u)
    local extra; extra=$(comm -23 <(incs $checked) <(echo "$ok"))
    [ -z "$extra" ] || fail "$name includes $(echo $extra)"
}

# UCX only in kvxfer/kvx.c
ucx=$(grep -rlE '^#include *<uc[pst]/' --include=*.c --include=*.h . | grep -v '^\./build' | sort)
[ "$ucx" = "./kvxfer/kvx.c" ] || fail "UCX included outside kvxfer/kvx.c: $(echo $ucx)"
# evhttp only in the router's front end (and pd-bench's fake server test)
http=$(grep -rlE '^#include *<event2/http' --include=*.c --include=*.h . | grep -v '^\./build' | sort)
for f in $http; do
    case $f in ./router/rtr_http.c|./tests/tools/test_pb_run.c) ;; *) fail "evhttp in $f" ;; esac
done
check_only common common common pd_build_config.h
check_only proto proto "proto common"
check_only kvxfer kvxfer "kvxfer common"
check_only engine engine "engine common"
check_only node node "node proto kvxfer engine common"
check_only prefill prefill "prefill common" node.h
check_only decode decode "decode common" node.h
# the router: tokenizer part of the engine only, never kvxfer, node or the runner
r=$(incs router | grep -E '^(kvx|node|eng_runner|eng_sample|eng_llama|eng_sim)' || true)
[ -z "$r" ] || fail "router includes $(echo $r)"
grep -qE 'kvxfer_dep|engine_dep|engine_runner_dep|node_dep' router/meson.build &&
    fail "router/meson.build links kvxfer, engine math or node"
# the router's request flow and control plane work without evhttp
for f in router/rtr_flow.c router/rtr_ctl.c router/rtr_flow.h router/rtr_int.h; do
    grep -qE '^#include *<event2/http' "$f" && fail "$f includes evhttp"
done
# the control plane does not call the front end or the flow by name
grep -qE 'rtr_http_|rtr_flow_' router/rtr_ctl.c && fail "rtr_ctl.c calls rtr_http_* / rtr_flow_* by name"
grep -qE 'rtr_http_' router/rtr_flow.c && fail "rtr_flow.c calls rtr_http_* by name"

[ $bad = 0 ] && echo "layering: ok"
exit $bad
