#!/bin/sh
# run-fuzzer.sh TARGET SECONDS CORPUS_DIR: a bounded libFuzzer run that never
# writes into the committed corpus (new inputs go to a scratch directory).
set -e
target=$1; secs=$2; corpus=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/pdfuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
# libFuzzer exits 77 on a finding by default, which meson reports as SKIP
"$target" -error_exitcode=1 -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "$work" "$corpus"
