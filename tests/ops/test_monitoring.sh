#!/usr/bin/env bash
# tests/ops: the Grafana dashboard and the Prometheus alert rules in
# deploy/monitoring against real daemons.
#   test_monitoring.sh SRC_ROOT PDCTL
# - promtool check rules + promtool test rules (pdserve-alerts.test.yml);
# - every dashboard expression parses (as recording rules, promtool);
# - a real 1P:1D deployment (pdctl up: /metrics on for every daemon) serves
#   disaggregated requests; its three /metrics are scraped; every metric and
#   label matcher named by the dashboard and the rules must be exported
#   (monitoring_check.py); a planted unknown metric / label value is caught.
set -uo pipefail
SRC=$1 PDCTL=$2
MON=$SRC/deploy/monitoring
command -v promtool >/dev/null 2>&1 || { echo "skip: no promtool (deploy/install-deps.sh)"; exit 77; }
T=$(mktemp -d /tmp/pd-mon-test.XXXXXX)
R=$T/run
cleanup() {
    [ -f "$R/deployment.json" ] && "$PDCTL" down --run-dir "$R" >/dev/null 2>&1
    [ -n "${KEEP:-}" ] || rm -rf "$T"
}
trap cleanup EXIT
fails=0
ok()   { echo "ok   - $*"; }
bad()  { echo "FAIL - $*"; fails=$((fails + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }

(cd "$MON" && promtool check rules pdserve-alerts.yml) >"$T/check.log" 2>&1 &&
    ok "promtool check rules: $(grep -o '[0-9]* rules found' "$T/check.log")" ||
    bad "promtool check rules: $(cat "$T/check.log")"
(cd "$MON" && promtool test rules pdserve-alerts.test.yml) >"$T/test.log" 2>&1 &&
    ok "promtool test rules: alerts fire (and stay quiet) as specified" ||
    bad "promtool test rules: $(cat "$T/test.log")"

python3 "$SRC/tests/ops/monitoring_check.py" names "$MON/pdserve-dashboard.json" \
    "$MON/pdserve-alerts.yml" >"$T/exprs.txt" || bad "reading the expressions"
check "dashboard and rules: $(wc -l <"$T/exprs.txt") expressions" test "$(wc -l <"$T/exprs.txt")" -gt 40
python3 - "$MON/pdserve-dashboard.json" >"$T/dash.yml" <<'PY' || bad "dashboard structure"
import json, sys
d = json.load(open(sys.argv[1]))
ids = [p["id"] for p in d["panels"]]
assert len(ids) == len(set(ids)), "duplicate panel ids"
assert d["uid"] and d["title"], "no uid/title"
vars_ = {v["name"] for v in d["templating"]["list"]}
assert {"datasource", "job"} <= vars_, vars_
n = 0
print("groups:\n  - name: dashboard\n    rules:")
for p in d["panels"]:
    if p["type"] == "row":
        continue
    assert p["datasource"]["uid"] == "${datasource}", p["title"]
    assert p["targets"], p["title"]
    for t in p["targets"]:
        e = t["expr"].replace("$__rate_interval", "5m").replace("$job", ".*")
        n += 1
        print(f"      - record: dashboard:expr{n}\n        expr: {json.dumps(e)}")
PY
promtool check rules "$T/dash.yml" >"$T/dash.log" 2>&1 &&
    ok "every dashboard expression is valid PromQL ($(grep -o '[0-9]* rules found' "$T/dash.log"))" ||
    bad "dashboard PromQL: $(cat "$T/dash.log")"

# a real deployment, metrics on by default
"$PDCTL" up "$SRC/deploy/local-1p1d.ini" --run-dir "$R" --set router.http=127.0.0.1:0 \
    --set router.control=127.0.0.1:0 >"$T/up.log" 2>&1 || { bad "pdctl up: $(cat "$T/up.log")"; exit 1; }
URL=$(cat "$R/url")
PROMPT='The quick brown fox jumps over the lazy dog while the five boxing wizards jump quickly and a long prompt goes on'
for i in 1 2 3; do
    curl -s -m 30 "$URL/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"prompt\":\"$PROMPT $i\",\"max_tokens\":8}" >/dev/null
done
mkdir -p "$T/scrapes"
curl -s -m 10 "$URL/metrics" >"$T/scrapes/router.txt"
for d in prefill-0 decode-0; do
    port=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["metrics"])' "$R/$d.ready")
    curl -s -m 10 "http://127.0.0.1:$port/metrics" >"$T/scrapes/$d.txt"
done
for f in "$T"/scrapes/*.txt; do
    promtool check metrics <"$f" >/dev/null 2>&1 || bad "$(basename "$f"): promtool check metrics"
done
check "scraped router, prefill-0 and decode-0 (metrics on by default in pdctl up)" \
    test -s "$T/scrapes/router.txt" -a -s "$T/scrapes/prefill-0.txt" -a -s "$T/scrapes/decode-0.txt"
python3 "$SRC/tests/ops/monitoring_check.py" check "$T/scrapes" "$T/exprs.txt" >"$T/names.log" 2>&1
rc=$?
if [ $rc = 0 ]; then ok "every metric and label the dashboard and rules name is exported: $(tail -1 "$T/names.log")"
else bad "dashboard/rules name what the daemons do not export: $(cat "$T/names.log")"; fi
# the checker catches what it should
printf '%s\n' 'rate(pd_no_such_metric_total[5m])' 'pd_router_requests_total{outcome="nope"}' \
    'pd_kv_pool_usage_ratio{colour=~"x"}' >"$T/planted.txt"
python3 "$SRC/tests/ops/monitoring_check.py" check "$T/scrapes" "$T/planted.txt" >"$T/planted.log" 2>&1
check "the check flags an unknown metric, label value and label key" \
    bash -c '[ $1 = 1 ] && grep -q "3 problem(s)" "$2"' _ $? "$T/planted.log"
"$PDCTL" down --run-dir "$R" >/dev/null 2>&1 || bad "pdctl down"
echo "monitoring: $fails failure(s)"
[ $fails = 0 ]
