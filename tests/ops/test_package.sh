#!/usr/bin/env bash
# tests/ops: the Debian package, end to end, as an operator of two hosts uses it.
#   test_package.sh SRC_ROOT BUILD_DIR
# 1. dpkg-buildpackage -us -uc -b on a copy of the tree; lintian without errors.
# 2. Two "hosts" = two scratch roots, each installed with the real dpkg
#    (dpkg --root, maintainer scripts chrootless with DPKG_ROOT): the pdserve
#    user, /etc/pdserve and the secret 0640 root:pdserve; files as listed;
#    `meson install` installs the same set.
# 3. Host A enables the router + prefill-0 roles, host B the decode-0 role
#    (systemctl --root enable); `systemd-analyze verify --root` on the units.
# 4. pdctl render (each host's own pdctl) writes the configs; host B gets host
#    A's secret copied, as an operator does. The ExecStart line of every unit
#    its targets pull in runs as a real process, as User=pdserve, with the
#    unit's EnvironmentFile and UMask, paths under the host's root: a request
#    long enough to be disaggregated moves KV from A's prefill to B's decode,
#    every daemon's /metrics answers (promtool check metrics).
# 5. SIGTERM drains every daemon (exit 0); purge removes /etc/pdserve.
# Root only (dpkg --root, chown to pdserve, setpriv); SKIP (77) otherwise.
set -uo pipefail
SRC=$1 BUILD=$2
[ "$(id -u)" = 0 ] || { echo "skip: needs root (dpkg --root, chown, setpriv)"; exit 77; }
for c in dpkg-buildpackage dh lintian help2man systemd-analyze systemctl systemd-sysusers setpriv curl git promtool; do
    command -v "$c" >/dev/null 2>&1 || { echo "skip: no $c (deploy/install-deps.sh)"; exit 77; }
done
T=$(mktemp -d /tmp/pd-pkg-test.XXXXXX)
chmod 755 "$T"
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    [ -n "${KEEP:-}" ] || rm -rf "$T"
}
trap cleanup EXIT
fails=0
ok()   { echo "ok   - $*"; }
bad()  { echo "FAIL - $*"; fails=$((fails + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
poll() {     # poll SECONDS CMD...: until CMD succeeds
    local limit=$1; shift
    local end=$((SECONDS + limit))
    until "$@"; do
        [ $SECONDS -lt $end ] || return 1
        sleep 0.1
    done
}
finish() { echo "package: $fails failure(s)"; [ $fails = 0 ]; exit $?; }

# ---- 1. build + lint -------------------------------------------------------------------
ver=$(cd "$SRC" && dpkg-parsechangelog -S Version)
mkdir -p "$T/src/pdserve-$ver"
(cd "$SRC" && git ls-files -co --exclude-standard | tar -cf - -T -) | tar -xf - -C "$T/src/pdserve-$ver"
(cd "$T/src/pdserve-$ver" && DEB_BUILD_OPTIONS="parallel=2 nocheck" dpkg-buildpackage -us -uc -b) \
    >"$T/build.log" 2>&1
rc=$?
DEB=$(ls "$T"/src/pdserve_"$ver"_*.deb 2>/dev/null | head -1)
if [ $rc = 0 ] && [ -n "$DEB" ]; then ok "dpkg-buildpackage -us -uc -b: $(basename "$DEB")"
else bad "dpkg-buildpackage (rc=$rc): $(tail -15 "$T/build.log")"; finish; fi
lintian --fail-on error "$DEB" >"$T/lintian.log" 2>&1
rc=$?
if [ $rc = 0 ] && ! grep -q "^E: " "$T/lintian.log"; then
    ok "lintian: no errors ($(grep -c "^W: " "$T/lintian.log") warnings)"
else bad "lintian (rc=$rc): $(grep "^E: " "$T/lintian.log")"; fi

# ---- 2. install on two hosts -------------------------------------------------------------
install_root() {  # install_root DIR
    local r=$1
    mkdir -p "$r/var/lib/dpkg/info" "$r/var/lib/dpkg/updates" "$r/etc"
    chmod 755 "$r" "$r/etc"
    touch "$r/var/lib/dpkg/status"
    dpkg --root="$r" --force-script-chrootless --force-depends -i "$DEB" >"$r.dpkg.log" 2>&1
}
A=$T/hostA B=$T/hostB
for h in "$A" "$B"; do
    install_root "$h"; rc=$?
    if [ $rc = 0 ]; then ok "dpkg --root $(basename "$h") -i: installed, postinst ran"
    else bad "dpkg -i into $h (rc=$rc): $(tail -5 "$h.dpkg.log")"; finish; fi
done
GID=$(awk -F: '$1 == "pdserve" { print $3 }' "$A/etc/group")
UID_=$(awk -F: '$1 == "pdserve" { print $3 }' "$A/etc/passwd")
check "postinst: system user and group pdserve (uid $UID_, gid $GID, nologin)" \
    grep -qE "^pdserve:x:$UID_:$GID:.*:/usr/sbin/nologin$" "$A/etc/passwd"
check "postinst: /etc/pdserve is 0750 root:pdserve" test "$(stat -c '%a %u %g' "$A/etc/pdserve")" = "750 0 $GID"
check "postinst: /etc/pdserve/secret is 0640 root:pdserve" \
    test "$(stat -c '%a %u %g' "$A/etc/pdserve/secret")" = "640 0 $GID"
check "postinst: the secret is 32 random bytes in hex" grep -qxE '[0-9a-f]{64}' "$A/etc/pdserve/secret"
check "each host made its own secret" bash -c '! cmp -s "$1" "$2"' _ "$A/etc/pdserve/secret" "$B/etc/pdserve/secret"
sec=$(cat "$A/etc/pdserve/secret")
dpkg --root="$A" --force-script-chrootless --force-depends -i "$DEB" >>"$A.dpkg.log" 2>&1
check "reinstall keeps the secret" test "$(cat "$A/etc/pdserve/secret")" = "$sec"
for f in usr/bin/pd-router usr/bin/pd-prefill usr/bin/pd-decode usr/bin/pdctl usr/bin/pd-bench \
         usr/share/pdserve/models/builtin.gguf \
         lib/systemd/system/pd-router.service lib/systemd/system/pd-prefill@.service \
         lib/systemd/system/pd-decode@.service lib/systemd/system/pdserve.target \
         lib/systemd/system/pdserve-router.target lib/systemd/system/pdserve-prefill.target \
         lib/systemd/system/pdserve-decode.target usr/lib/sysusers.d/pdserve.conf \
         usr/lib/tmpfiles.d/pdserve.conf usr/libexec/pdserve/pdserve-secret \
         usr/share/man/man1/pd-router.1.gz usr/share/man/man1/pd-prefill.1.gz \
         usr/share/man/man1/pd-decode.1.gz usr/share/man/man1/pdctl.1.gz \
         usr/share/doc/pdserve/README.md.gz usr/share/doc/pdserve/ARCHITECTURE.md.gz \
         usr/share/doc/pdserve/examples/local-1p1d.ini \
         usr/share/pdserve/monitoring/pdserve-dashboard.json \
         usr/share/pdserve/monitoring/pdserve-alerts.yml; do
    [ -e "$A/$f" ] || bad "package lacks /$f"
done
ok "package holds binaries, model, units, sysusers/tmpfiles, man pages, docs, monitoring"
# every program the package puts on PATH is named pd* and has a man page
for b in "$A"/usr/bin/*; do
    n=$(basename "$b")
    case $n in pd*) ;; *) bad "/usr/bin/$n: not a pd* name" ;; esac
    [ -e "$A/usr/share/man/man1/$n.1.gz" ] || bad "/usr/bin/$n has no man page"
done
check "man page generated from --help (pd-router: --max-concurrent)" \
    bash -c 'zcat "$1" | grep -q "max\\\\-concurrent\|max-concurrent"' _ "$A/usr/share/man/man1/pd-router.1.gz"

# meson install: the same set (modulo prefix, compression, Debian's changelog/copyright)
meson install -C "$BUILD" --no-rebuild --destdir "$T/mi" >"$T/mi.log" 2>&1 || bad "meson install: $(tail -3 "$T/mi.log")"
prefix=$(meson introspect "$BUILD" --buildoptions | python3 -c \
    'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"][0])')
(cd "$A" && dpkg-deb -c "$DEB" | awk '$1 !~ /^d/ { print $6 }' | sed -e 's#^\./##' -e 's#^usr/##' -e 's#\.gz$##' |
    grep -vE '^share/doc/pdserve/(changelog|copyright)$' | sort) >"$T/deb.list"
(cd "$T/mi" && find . -type f | sed -e 's#^\./##' -e "s#^${prefix#/}/##" | sort) >"$T/mi.list"
if diff "$T/deb.list" "$T/mi.list" >"$T/list.diff"; then ok "meson install installs the package's set ($(wc -l <"$T/mi.list") files)"
else bad "meson install differs from the package: $(tr '\n' ' ' <"$T/list.diff")"; fi

# ---- 3. roles per host + systemd-analyze verify ---------------------------------------------
systemctl --root="$A" enable pd-router.service pd-prefill@prefill-0.service pdserve-router.target \
    pdserve-prefill.target pdserve.target >"$T/enable.log" 2>&1 || bad "enable on host A: $(cat "$T/enable.log")"
systemctl --root="$B" enable pd-decode@decode-0.service pdserve-decode.target pdserve.target \
    >>"$T/enable.log" 2>&1 || bad "enable on host B: $(cat "$T/enable.log")"
units_of() {  # units_of ROOT: the services pdserve.target pulls in on that host
    local r=$1 t u
    for t in "$r"/etc/systemd/system/pdserve.target.wants/*.target; do
        [ -L "$t" ] || continue
        for u in "$r/etc/systemd/system/$(basename "$t").wants"/*.service; do
            [ -L "$u" ] && basename "$u"
        done
    done | sort
}
UA=$(units_of "$A" | tr '\n' ' ') UB=$(units_of "$B" | tr '\n' ' ')
check "host A: pdserve.target starts the router and prefill-0 ($UA)" \
    test "$UA" = "pd-prefill@prefill-0.service pd-router.service "
check "host B: pdserve.target starts decode-0 only, no router ($UB)" test "$UB" = "pd-decode@decode-0.service "
vroot=$T/verify-root
mkdir -p "$vroot/lib/systemd/system"
cp -rn /lib/systemd/system/. "$vroot/lib/systemd/system/" 2>/dev/null
cp -a "$A"/lib/systemd/system/pd* "$vroot/lib/systemd/system/"
cp -a "$A/usr" "$vroot/"
(cd "$vroot/lib/systemd/system" && ln -s pd-prefill@.service pd-prefill@prefill-0.service &&
    ln -s pd-decode@.service pd-decode@decode-0.service)
systemd-analyze verify --root="$vroot" --man=no pd-router.service pd-prefill@prefill-0.service \
    pd-decode@decode-0.service pdserve.target pdserve-router.target pdserve-prefill.target \
    pdserve-decode.target >"$T/verify.log" 2>&1
rc=$?
if [ $rc = 0 ] && [ ! -s "$T/verify.log" ]; then ok "systemd-analyze verify: the installed units are clean"
else bad "systemd-analyze verify (rc=$rc): $(cat "$T/verify.log")"; fi

# ---- 4. render on each host, run the units' ExecStart lines -----------------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
HP=$(free_port) CP=$(free_port)
EX=/usr/share/doc/pdserve/examples/local-1p1d.ini
render() {  # render ROOT: that host's pdctl renders into its /etc/pdserve
    local r=$1
    "$r/usr/bin/pdctl" render "$r$EX" "$r/etc/pdserve" --run-dir "$r/run/pdserve" --group "$GID" \
        --set router.http=127.0.0.1:$HP --set router.control=127.0.0.1:$CP \
        --set env.UCX_TLS=tcp,self --set env.UCX_WARN_UNUSED_ENV_VARS=n >"$r.render.log" 2>&1
}
cp -p "$A/etc/pdserve/secret" "$B/etc/pdserve/secret"   # the operator copies it
for h in "$A" "$B"; do
    render "$h" || bad "render on $(basename "$h"): $(cat "$h.render.log")"
done
check "render keeps the installed secret (no new one)" bash -c '! grep -q "new secret" "$1" "$2"' _ "$A.render.log" "$B.render.log"
for f in router.ini prefill-0.ini decode-0.ini env; do
    [ "$(stat -c '%a %u %g' "$B/etc/pdserve/$f")" = "640 0 $GID" ] || bad "render: $f is not 0640 root:pdserve"
done
ok "render: configs and env are 0640 root:pdserve"
check "render: model is the installed one, not the build tree" \
    grep -qx "model = $B/usr/share/pdserve/models/builtin.gguf" "$B/etc/pdserve/decode-0.ini"
check "render: secret-file is the persistent /etc/pdserve/secret" \
    grep -qx "secret-file = $B/etc/pdserve/secret" "$B/etc/pdserve/decode-0.ini"
check "render: /metrics on by default at fixed ports" \
    grep -qx "metrics.listen = 127.0.0.1:9300" "$B/etc/pdserve/decode-0.ini"
check "render: [env] as an EnvironmentFile" grep -qx 'UCX_TLS="tcp,self"' "$B/etc/pdserve/env"

start_unit() {  # start_unit ROOT UNIT: the unit's ExecStart as its User, paths under ROOT
    local r=$1 unit=$2 inst= file exec env umask_ log
    file=$unit
    if [[ $unit == *@*.service ]]; then inst=${unit#*@}; inst=${inst%.service}; file=${unit%%@*}@.service; fi
    file=$r/lib/systemd/system/$file
    exec=$(sed -n 's/^ExecStart=//p' "$file")
    env=$(sed -n 's/^EnvironmentFile=-\?//p' "$file")
    umask_=$(sed -n 's/^UMask=//p' "$file")
    [ "$(sed -n 's/^User=//p' "$file")" = pdserve ] || bad "$unit: not User=pdserve"
    grep -qx "RuntimeDirectory=pdserve" "$file" || bad "$unit: no RuntimeDirectory=pdserve"
    exec=${exec//%i/$inst}
    exec=$(sed -e "s#/usr/bin/#$r/usr/bin/#g" -e "s#/etc/pdserve/#$r/etc/pdserve/#g" \
               -e "s#/run/pdserve/#$r/run/pdserve/#g" <<<"$exec")
    # RuntimeDirectory=pdserve, RuntimeDirectoryMode=0750, owned by the unit's user
    install -d -m 0750 -o "$UID_" -g "$GID" "$r/run" "$r/run/pdserve"
    chmod 755 "$r/run"
    log=$r/${unit%.service}.log
    ( set -a; . "$r${env}"; set +a; umask "$umask_"
      exec setpriv --reuid="$UID_" --regid="$GID" --clear-groups $exec ) >"$log" 2>&1 &
    PIDS+=($!)
    echo "# $(basename "$r") $unit: $exec"
}
for u in $UA; do start_unit "$A" "$u"; done
for u in $UB; do start_unit "$B" "$u"; done
ready() { [ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$HP/ready")" = 200 ]; }
if poll 60 ready; then ok "the units' processes came up: router /ready is 200"
else
    bad "not ready: $(curl -s -m 2 "http://127.0.0.1:$HP/ready"; tail -n 3 "$A"/*.log "$B"/*.log)"
    finish
fi
running_as() {  # every started process runs with the given uid
    local p
    for p in "${PIDS[@]}"; do
        [ "$(awk '/^Uid:/ { print $2 }' "/proc/$p/status")" = "$1" ] || return 1
    done
}
check "every daemon runs as the pdserve user (uid $UID_), not root" running_as "$UID_"
# /ready says the router can serve (a decode is up); the disaggregated path
# needs the prefill registered too: wait for both before the request
both_ready() {
    "$A/usr/bin/pdctl" admin "$A/run/pdserve/router.sock" backends --json 2>/dev/null |
        python3 -c 'import json,sys; b=json.load(sys.stdin)["backends"]; sys.exit(0 if sum(1 for x in b if x.get("state")=="ready")>=2 else 1)'
}
check "the router has the prefill and the decode ready" poll 60 both_ready
# pdctl against the installed deployment: render's deployment.json (no pdctl up)
st_out=$("$A/usr/bin/pdctl" status --run-dir "$A/etc/pdserve" 2>&1)
check "pdctl status --run-dir /etc/pdserve: the installed router and prefill-0 are up, host B's decode-0 ready as the router sees it" \
    bash -c 'grep -q "^router .* up" <<<"$1" && grep -q "^prefill-0 .*ready" <<<"$1" && grep -q "^decode-0 .*ready" <<<"$1"' _ "$st_out"
PROMPT='The quick brown fox jumps over the lazy dog while the five boxing wizards jump quickly and a long prompt goes on and on'
body=$(curl -s -m 60 "http://127.0.0.1:$HP/v1/completions" -H 'Content-Type: application/json' \
       -d "{\"prompt\":\"$PROMPT\",\"max_tokens\":8}")
check "completion through the units: 200 with text" \
    test "$(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print(j["choices"][0]["finish_reason"] in ("length","stop"))' "$body" 2>/dev/null)" = True
x=$("$B/usr/bin/pdctl" admin "$B/run/pdserve/decode-0.sock" xfer --json)
check "KV moved from host A's prefill to host B's decode" \
    test "$(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print(sum(p["bytes_pulled"] for p in j["xfer"]["peers"]) > 0)' "$x")" = True
for m in 9200 9300; do
    curl -s -m 5 "http://127.0.0.1:$m/metrics" >"$T/m$m.txt"
    check "/metrics on 127.0.0.1:$m passes promtool check metrics" \
        bash -c 'grep -q "^pd_" "$1" && promtool check metrics <"$1" >/dev/null 2>&1' _ "$T/m$m.txt"
done

# ---- 5. stop, purge ------------------------------------------------------------------------
for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
st=0
for p in "${PIDS[@]}"; do wait "$p" || st=$?; done
PIDS=()
check "SIGTERM (the units' KillSignal) stops every daemon cleanly" test $st = 0
dpkg --root="$A" --force-script-chrootless --force-depends --purge pdserve >>"$A.dpkg.log" 2>&1
check "purge: binaries and /etc/pdserve removed" test ! -e "$A/usr/bin/pd-router" -a ! -e "$A/etc/pdserve"
left=$(cd "$A/etc/systemd/system" 2>/dev/null && find . -name 'pd*' | tr '\n' ' ')
check "purge: no enable links left in /etc/systemd/system (${left:-none})" test -z "$left"
finish
