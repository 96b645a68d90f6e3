#!/usr/bin/env bash
# ctest Package.consumer: `cmake --install BUILD` into a temporary prefix, then the consumer
# project (find_package(attnlab), attnlab::attnlab) configured, built and run against it.
# Usage: tests/consumer/check.sh BUILD_DIR
set -euo pipefail
build="$1"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
test -f "$tmp/prefix/lib/cmake/attnlab/attnlabConfig.cmake"
test -f "$tmp/prefix/include/attnlab/kernel.hpp"
cmake -S "$here" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/build" -j 2 >/dev/null
"$tmp/build/consumer"
