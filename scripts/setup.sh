#!/usr/bin/env bash
# Installs the Debian packages attnlab builds and runs with, when any is missing.
# Idempotent and quiet when everything is present. No downloads at build time.
# Usage: scripts/setup.sh [clang]   (clang: also clang 14 with libFuzzer and the sanitizer
# runtimes, for scripts/lab fuzz and tsan-test)
set -euo pipefail

PKGS=(
  build-essential cmake
  libxsimd-dev libtbb-dev libbenchmark-dev libgtest-dev googletest
  libcli11-dev nlohmann-json3-dev
  python3-matplotlib python3-numpy
)
# libclang-rt-14-dev holds libFuzzer and clang's sanitizer runtimes; llvm-14 the symbolizer
# that turns sanitizer stack traces into file:line.
if [[ "${1:-}" == clang ]]; then
  PKGS+=(clang-14 libclang-rt-14-dev llvm-14)
fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "setup: installing ${missing[*]}" >&2
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done" >&2
