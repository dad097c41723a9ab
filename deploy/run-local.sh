#!/usr/bin/env bash
# `make run`: a local deployment serving the built-in default model.
# Until the serving daemons land (issue "Serving"), this builds everything,
# generates the built-in model and prints what it would start.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
MODEL_DIR=${PD_MODEL_DIR:-$PWD/run/models}
mkdir -p "$MODEL_DIR"
MODEL=$MODEL_DIR/pdserve-builtin.gguf
if [ -x "$BUILD/engine/gguf/pd-mkmodel" ] && [ ! -f "$MODEL" ]; then
  "$BUILD/engine/gguf/pd-mkmodel" --preset builtin --out "$MODEL"
fi
echo "pdserve local deployment (1 prefill : 1 decode) would start:"
echo "  pd-router  --http=127.0.0.1:8000 --control=127.0.0.1:7000 --admin-socket=run/router.sock"
echo "  pd-prefill --model=$MODEL --router=127.0.0.1:7000 --admin-socket=run/prefill-0.sock"
echo "  pd-decode  --model=$MODEL --router=127.0.0.1:7000 --admin-socket=run/decode-0.sock"
echo "The daemons are not built yet (see the open Serving issue); the model is at $MODEL"
