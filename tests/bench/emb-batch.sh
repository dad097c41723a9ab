#!/bin/bash
# emb-batch.sh BUILD [GGUF] - issue 30: /v1/embeddings throughput with the
# prefill's batching off (embeddings.batch-tokens = 1) and on (2048), two
# 1P:1D deployments side by side on loopback, requests alternating between
# them (best of 3 each): inputs/s for 64 inputs of 1, 4 and 16 words.
# Default model: pd-mkmodel --preset bench-0.5b --layers 4 --type q8_0.
# Never run by a test. Result: docs/BENCHMARKS.md "Embeddings: batched".
set -euo pipefail
BUILD=$(realpath "${1:?usage: emb-batch.sh BUILD [GGUF]}")
PDCTL=$BUILD/tools/pdctl/pdctl
DIR=$(mktemp -d /tmp/pd-emb-batch.XXXXXX)
MODEL=${2:-$DIR/bench-q8_0.gguf}
cleanup() {
    for t in 1 2048; do "$PDCTL" down --run-dir "$DIR/run$t" >/dev/null 2>&1 || true; done
    rm -rf "$DIR"
}
trap cleanup EXIT
[ -f "$MODEL" ] || "$BUILD/engine/gguf/pd-mkmodel" --preset bench-0.5b --layers 4 --type q8_0 -o "$MODEL" >/dev/null
port=8190
for t in 1 2048; do
    cat > "$DIR/b$t.ini" <<INI
[deployment]
name = emb-batch-$t
model = $MODEL
prefill = 1
decode = 1
run-dir = $DIR/run$t
[router]
http = 127.0.0.1:$port
control = 127.0.0.1:$((port + 1))
[prefill]
threads = 1
kv-blocks = 4096
embeddings.pooling = mean
embeddings.batch-tokens = $t
[decode]
threads = 1
kv-blocks = 256
INI
    "$PDCTL" up "$DIR/b$t.ini" >/dev/null
    echo "http://127.0.0.1:$port" > "$DIR/url$t"
    port=$((port + 10))
done
for w in 1 4 16; do
    node "$(dirname "$0")/emb-batch.mjs" "$(cat "$DIR/url1")" "$(cat "$DIR/url2048")" 64 "$w" 3
done
for t in 1 2048; do
    echo "batch-tokens=$t: $("$PDCTL" admin prefill-0 requests --run-dir "$DIR/run$t" --json 2>/dev/null |
        python3 -c 'import json,sys; c=json.load(sys.stdin)["counters"]; print(c["embeddings"], "embeddings in", c["embed_batches"], "batches")' || echo '?')"
done
