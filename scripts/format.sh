#!/usr/bin/env bash
# Formats the C++ and CUDA sources (src, include, tests, tools; not .cuh, which clang-format 14
# would read as C++ and break <<<...>>>) with clang-format and the repository's
# .clang-format. Usage: scripts/format.sh [--check]   (--check: change nothing, exit 1 naming
# the files that are not formatted; ctest Format.clean)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
cf="$(command -v clang-format-14 || command -v clang-format || true)"
if [[ -z "$cf" ]]; then
  echo "format: clang-format not found (Debian: apt-get install clang-format)" >&2
  exit 2
fi
mapfile -t files < <(find src include tests tools \( -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' \) \
  -not -path 'tests/fixtures/*' | sort)
case "${1:-}" in
  "") "$cf" -i "${files[@]}" ;;
  --check)
    bad=()
    for f in "${files[@]}"; do
      "$cf" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
    done
    if ((${#bad[@]} > 0)); then
      printf 'format: not formatted (run scripts/format.sh): %s\n' "${bad[@]}" >&2
      exit 1
    fi
    echo "format: ${#files[@]} files formatted"
    ;;
  *) echo "format: unknown argument '$1'; allowed: --check" >&2; exit 2 ;;
esac
