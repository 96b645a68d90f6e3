#!/usr/bin/env bash
# Installs the Debian packages attnlab builds and runs with, when any is missing.
# Idempotent and quiet when everything is present. No downloads at build time.
set -euo pipefail

PKGS=(
  build-essential cmake
  libxsimd-dev libtbb-dev libbenchmark-dev libgtest-dev googletest
  libcli11-dev nlohmann-json3-dev
  python3-matplotlib python3-numpy
)

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
