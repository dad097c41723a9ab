#!/bin/sh
# run_embed_check.sh NODE_DIR PD_RUN MODEL...: install node-llama-cpp as
# run_llamacpp.sh does (exit 77 = skip without node/npm/registry/binary),
# then embed_check.mjs: llama.cpp's embeddings vs pd-run --embed.
set -u
dir=$1
shift
. "$dir/install.sh"
exec node "$dir/embed_check.mjs" "$@"
