#!/bin/sh
# run_llamacpp.sh PD_BENCH MODEL NODE_DIR: pd-bench against llama.cpp
# (node-llama-cpp's prebuilt CPU binary behind llama_server.mjs, test-only;
# node_modules is git-ignored and installed on first run). Exit 77 (skip)
# without node/npm or the packages. Checks: a multi-turn run completes with
# cached_tokens reported from turn 2 on, and a Poisson run against a server
# closing idle kept-alive connections after 40 ms has no failed request.
set -u
bench=$1 model=$2 dir=$3
command -v node >/dev/null 2>&1 || { echo "node not installed: skip"; exit 77; }
sh "$(dirname "$0")/../../npm-install.sh" "$dir" || exit $?
tmp=$(mktemp -d /tmp/pb-llamacpp.XXXXXX) || exit 1
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
node "$dir/llama_server.mjs" "$model" --threads 1 --parallel 4 --keep-alive-ms 40 \
    --max-seconds 120 >"$tmp/url" 2>"$tmp/server.log" &
pid=$!
i=0
while [ ! -s "$tmp/url" ]; do        # poll (bounded) until the URL is printed
    i=$((i + 1))
    if [ $i -gt 600 ] || ! kill -0 "$pid" 2>/dev/null; then
        echo "llama_server.mjs did not start:"; cat "$tmp/server.log"; exit 1
    fi
    sleep 0.1
done
url=$(head -n 1 "$tmp/url")
echo "llama.cpp server: $url"
"$bench" --url "$url" --workload multi-turn --conversations 3 --turns 3 --concurrency 3 \
    --input-len 8 --output-len 6 --ignore-eos --seed 2 --out "$tmp/mt.json" || exit 1
"$bench" --url "$url" --rate 10 --num-requests 15 --concurrency 2 --input-len 8 \
    --output-len 4 --ignore-eos --seed 3 --quiet --out "$tmp/idle.json" || exit 1
node --input-type=module - "$tmp/mt.json" "$tmp/idle.json" <<'JS'
import fs from "node:fs";
const [mt, idle] = process.argv.slice(2).map((f) => JSON.parse(fs.readFileSync(f, "utf8")));
const fail = (m) => { console.error("FAIL:", m); process.exit(1); };
const r = mt.results;
if (r.completed !== 9 || r.failed !== 0) fail(`multi-turn: ${r.completed} completed, ${r.failed} failed`);
if (r.per_turn.length !== 3) fail("multi-turn: per_turn should have 3 turns");
for (const t of r.per_turn) {
    if (t.completed !== 3) fail(`turn ${t.turn}: ${t.completed} completed`);
    if (typeof t.mean_cached_tokens !== "number") fail(`turn ${t.turn}: cached_tokens not shown`);
    // turn 2+ reuse the conversation's earlier turns (llama.cpp prefix cache)
    if (t.turn > 1 && t.mean_cached_tokens < 20) fail(`turn ${t.turn}: ${t.mean_cached_tokens} cached`);
}
const i = idle.results;
console.log(`idle-close run: ${i.completed} ok, ${i.failed} failed, ` +
            `${i.connections_closed_idle} closed while idle, ${i.reconnects} resent`);
if (i.completed !== 15 || i.failed !== 0) fail(`idle-close run: ${i.completed} completed, ${i.failed} failed`);
if (i.connections_closed_idle + i.reconnects === 0) fail("the server never closed an idle connection");
console.log("ok");
JS
