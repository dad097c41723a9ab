#!/bin/sh
# run_chat_xcheck.sh CHAT_CLI WORKDIR - our chat templates with tools
# against the models' own Jinja templates (Qwen2.5's, Llama 3.1's) as
# llama.cpp ships them (models/templates in node-llama-cpp's llama.cpp
# source bundle), rendered by @huggingface/jinja. Test-only npm packages are
# installed on first use; exits 77 (skip) without node/npm or the registry.
set -u
cli=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
npmdir=$here/npm
sh "$here/../../npm-install.sh" "$npmdir" || exit $?
dir=$here/../llama/node
( . "$dir/install.sh" ) || exit $?
bundle=$dir/node_modules/node-llama-cpp/llama/gitRelease.bundle
[ -f "$bundle" ] || { echo "SKIP: no llama.cpp source bundle in node-llama-cpp"; exit 77; }
mkdir -p "$work"
(
    flock 9
    [ -f "$work/src/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja" ] && exit 0
    rm -rf "$work/src" && git clone -q --no-checkout "$bundle" "$work/src" &&
        git -C "$work/src" -c advice.detachedHead=false checkout -q FETCH_HEAD -- models/templates 2>/dev/null ||
        git -C "$work/src" -c advice.detachedHead=false checkout -q HEAD -- models/templates
) 9>"$work/.clone.lock" || { echo "cannot read llama.cpp's templates from $bundle"; exit 1; }
exec node "$npmdir/chat_xcheck.mjs" "$cli" "$work/src/models/templates"
