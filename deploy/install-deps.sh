#!/usr/bin/env bash
# Install everything pdserve's build, tests and tools need on Debian 12.
# Idempotent: installs only what is missing. `--check` only reports (exit 1
# if something is missing). Needs root (or sudo) to install.
set -euo pipefail

PKGS=(
  # build
  build-essential meson ninja-build pkg-config
  # libraries (see README "Build dependencies")
  libucx-dev ucx-utils libevent-dev libjemalloc-dev libcjson-dev libinih-dev
  libsodium-dev libxxhash-dev libpcre2-dev libsystemd-dev
  # tests: unit framework, fuzzing + sanitizer runtimes, metrics lint
  libcmocka-dev clang libclang-rt-14-dev prometheus
  # tools: network namespaces, plots, JSON on the command line
  iproute2 gnuplot-nox jq python3 curl socat systemd
  # membership of several routers (optional per deployment): etcd v3, whose
  # JSON gateway the daemons speak; e2e-etcd starts it on loopback
  etcd-server etcd-client
  # the Debian package (debian/): build, man pages from --help, lint
  debhelper help2man lintian fakeroot
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# Node.js + npm run the test-only reference clients (openai, @huggingface/*).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi

if [ "${1:-}" = "--check" ]; then
  if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
  echo "missing: ${missing[*]}"; exit 1
fi

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
