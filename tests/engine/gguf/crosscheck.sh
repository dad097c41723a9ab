#!/bin/sh
# crosscheck.sh PD_MKMODEL PD_GGUF_DUMP: parse pd-mkmodel's files (every
# weight type, both archs, the builtin preset, the seed corpus) with the
# independent npm reader @huggingface/gguf and compare with pd-gguf-dump.
# Installs the package into tests/engine/gguf/node if missing; exits 77
# (skip) with a reason when node/npm or the registry is unavailable.
set -eu
mkmodel=$1; dump=$2
here=$(cd "$(dirname "$0")" && pwd)
nodedir=$here/node
command -v node >/dev/null 2>&1 || { echo "SKIP: node not installed"; exit 77; }
sh "$here/../../npm-install.sh" "$nodedir" || exit $?
work=$(mktemp -d "${TMPDIR:-/tmp}/pd-gguf-xcheck.XXXXXX")
trap 'rm -rf "$work"' EXIT

"$dump" --types >"$work/types.json"
node "$nodedir/crosscheck.mjs" --types "$work/types.json"

n=0
gen() { # name, pd-mkmodel args...
    name=$1; shift
    "$mkmodel" "$@" -o "$work/$name.gguf" >/dev/null
}
small="--preset tiny --dim 64 --ffn 128"
for t in f32 f16 bf16 q8_0 q4_0; do
    gen "llama-$t" $small --type "$t" --untied
    gen "qwen2-$t" $small --arch qwen2 --type "$t" --tied --alignment 64
done
gen builtin --preset builtin
gen vocab-from --preset tiny --vocab-from "$work/builtin.gguf" --arch qwen2
for f in "$work"/*.gguf "$here"/corpus/*.gguf; do
    "$dump" "$f" >"$work/dump.json"
    node "$nodedir/crosscheck.mjs" "$f" "$work/dump.json"
    n=$((n + 1))
done
echo "OK: $n files agree with @huggingface/gguf"
