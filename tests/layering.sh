#!/usr/bin/env bash
# layering.sh SRCDIR [--self-test] - the layering rules of ARCHITECTURE.md
# §7, enforced from there: the two tables between the `layering:` markers
# are read here, so a rule is stated once. Every folder with C sources
# (outside tests/) needs a row; a file may include only headers of the
# folders (or the single headers) its row allows; the library headers of
# the second table only in the files it lists. Prints every violation;
# exit 1 if there is one.
# --self-test: on a scratch copy of the tree, the check passes, then fails
# once for each folder with a planted include its row forbids (and for a
# planted UCX / evhttp include): the rules catch what they claim to.
set -uo pipefail
top=$(cd "${1:-$(dirname "$0")/..}" && pwd) || exit 2

# rows "folder|allowed..." of the table after marker $1 in ARCHITECTURE.md
table() {
    awk -v m="<!-- layering:$1 -->" '
        $0 == m { on = 1; next }
        on && /^<!--/ { exit }
        on && /^\| *`/ {
            n = split($0, c, "|"); a = c[2]; b = c[3]
            gsub(/[` ]+/, " ", a); gsub(/[`]/, "", b); gsub(/^ +| +$/, "", a); gsub(/^ +| +$/, "", b)
            print a "|" b
        }' "$2/ARCHITECTURE.md"
}

check() { # tree root
    local root=$1 bad=0 rows libs
    fail() { echo "layering: $*"; bad=1; }
    rows=$(table includes "$root")
    libs=$(table libs "$root")
    [ -n "$rows" ] && [ -n "$libs" ] || { echo "layering: no tables in ARCHITECTURE.md §7"; return 1; }
    cd "$root" || return 2
    # where each header lives (folder of the first match)
    declare -A home
    while read -r p; do
        local h=${p##*/} d=${p%/*}
        [ -n "${home[$h]:-}" ] || home[$h]=$d
    done < <(find . -path ./tests -prune -o -path './build*' -prune -o -name '*.h' -print | sed 's#^\./##' | sort)
    # every C folder has a row
    local folders
    folders=$(find . -path ./tests -prune -o -path './build*' -prune -o -path ./node_modules -prune -o \
                  \( -name '*.c' -o -name '*.h' \) -print | sed 's#^\./##; s#/[^/]*$##' | sort -u)
    for d in $folders; do
        grep -q "^$d|" <<<"$rows" || fail "$d has C sources but no row in ARCHITECTURE.md §7"
    done
    local row folder allowed f inc hd ok a
    while IFS= read -r row; do
        folder=${row%%|*}
        allowed=${row#*|}
        for f in "$folder"/*.[ch]; do
            [ -e "$f" ] || continue
            while read -r inc; do
                [ "$inc" = pd_build_config.h ] && continue
                hd=${home[$inc]:-}
                [ -n "$hd" ] || { fail "$f includes \"$inc\", a header found nowhere in the tree"; continue; }
                ok=0
                for a in $allowed; do
                    [ "$a" = "$hd" ] || [ "$a" = "$hd/$inc" ] && { ok=1; break; }
                done
                [ $ok = 1 ] || fail "$f includes \"$inc\" ($hd), not allowed for $folder (may: $allowed)"
            done < <(grep -hoE '^#include "[^"]+"' "$f" | sed 's/.*"\(.*\)"/\1/')
        done
    done <<<"$rows"
    # library headers only where the second table lets them be
    local pats files hit
    while IFS= read -r row; do
        pats=${row%%|*}
        files=" ${row#*|} "
        for p in $pats; do
            while read -r hit; do
                [[ "$files" == *" ${hit#./} "* ]] || fail "${hit#./} includes $p (only: ${row#*|})"
            done < <(grep -rlF --include=*.c --include=*.h "#include $p" . | grep -vE '^\./build' | sort)
        done
    done <<<"$libs"
    # rules that are not include edges
    grep -qE 'kvxfer_dep|engine_dep|engine_runner_dep|node_dep' router/meson.build &&
        fail "router/meson.build links kvxfer, engine math or node"
    local x
    for x in router/rtr_flow.c router/rtr_ctl.c router/rtr_flow.h router/rtr_int.h; do
        grep -qE '^#include *<event2/http' "$x" && fail "$x includes evhttp"
    done
    grep -qE 'rtr_http_|rtr_flow_' router/rtr_ctl.c && fail "rtr_ctl.c calls rtr_http_* / rtr_flow_* by name"
    grep -qE 'rtr_http_' router/rtr_flow.c && fail "rtr_flow.c calls rtr_http_* by name"
    return $bad
}

if [ "${2:-}" != --self-test ]; then
    check "$top" && echo "layering: ok"
    exit $?
fi

# ---- self-test ----
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
(cd "$top" && find . -path './build*' -prune -o -path ./node_modules -prune -o -path ./tests -prune -o \
     \( -name '*.[ch]' -o -name meson.build -o -name ARCHITECTURE.md \) -print0 |
     tar --null -T - -cf - | tar -xf - -C "$tmp") || exit 2
check "$tmp" >/dev/null || { echo "layering self-test: the clean copy fails"; check "$tmp"; exit 1; }
# one forbidden include planted in every folder at once, one check run:
# each planted file must be named
planted=()
plant() { # file, line
    printf '%s\n' "$2" >>"$tmp/$1"
    planted+=("$1|$2")
}
rows=$(table includes "$tmp")
all=$(cut -d'|' -f1 <<<"$rows")
while IFS= read -r row; do
    folder=${row%%|*}
    allowed=" ${row#*|} "
    f=$(cd "$tmp" && ls "$folder"/*.c 2>/dev/null | head -1)
    [ -n "$f" ] || f=$(cd "$tmp" && ls "$folder"/*.h | head -1)
    for other in $all; do # the first folder this one may not use
        [[ "$allowed" == *" $other "* ]] && continue
        h=$(cd "$tmp" && ls "$other"/*.h 2>/dev/null | head -1)
        [ -n "$h" ] || continue
        plant "$f" "#include \"${h##*/}\""
        break
    done
done <<<"$rows"
plant router/rtr_policy.c '#include <ucp/api/ucp.h>'
plant node/node_kve.c '#include <event2/http.h>'
out=$(check "$tmp")
st=0
for p in "${planted[@]}"; do
    grep -qF "${p%%|*} includes" <<<"$out" || { echo "layering self-test: not caught: ${p%%|*}: ${p#*|}"; st=1; }
done
[ $st = 0 ] && echo "layering self-test: all ${#planted[@]} planted violations caught, one per folder"
exit $st
