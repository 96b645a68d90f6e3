#!/usr/bin/env bash
# scripts/lab gpu-bundle [DIR]: the GPU check as a self-contained folder, built on this CPU
# machine (nvcc is here), to be carried to a bare GPU machine (no package registry, none of our
# -dev packages) and run there as one command: DIR/run.sh OUTDIR (scripts/gpu/run.sh says what
# it does). Default DIR: build-gpu-bundle/ (ignored by git), and the same folder as DIR.tar.gz
# (ignored too; relocatable: unpack it anywhere), the smaller thing to carry.
#
#   DIR/bin/attnlab, DIR/bin/attn_tests  the CUDA-enabled build of $ATTN_BUILD_DIR (default
#       build/): the dispatched build (scalar/avx2/avx512 chosen at run time, baseline x86-64
#       elsewhere), so it runs on whatever CPU the GPU machine has; CUDA code as sm_80 and sm_90
#       SASS plus compute_90 PTX; the CUDA runtime linked statically; RPATH $ORIGIN/../lib.
#   DIR/lib/  the shared libraries a bare machine lacks (oneTBB, Google Benchmark), as ldd
#       resolves them here; lib/fallback/ this machine's libstdc++ and libgcc_s, used by run.sh
#       only when the GPU machine's own are too old to load the binaries.
#   DIR/run.sh, torch_compare.py, summarize.py, check.sh, fatbin_archs.py  (scripts/gpu/)
#   DIR/MANIFEST  commit, build flags, CUDA architectures, sizes
# Then DIR/check.sh proves it needs nothing outside itself beyond glibc, libstdc++/libgcc_s and
# the CUDA driver, and stays within 60 MiB.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${ATTN_BUILD_DIR:-$ROOT/build}"
DIR="${1:-$ROOT/build-gpu-bundle}"
JOBS="$(nproc 2>/dev/null || echo 2)"

"$ROOT/scripts/setup.sh"
"$ROOT/scripts/setup.sh" bundle
if [[ -f "$BUILD/CMakeCache.txt" ]] && grep -q '^ATTN_NATIVE:BOOL=ON' "$BUILD/CMakeCache.txt"; then
  echo "gpu-bundle: $BUILD is an ATTN_NATIVE build (this CPU's instructions only); the GPU machine's CPU is" \
       "another. allowed: a dispatched build (ATTN_NATIVE=OFF), e.g. ATTN_BUILD_DIR=build-bundle" >&2
  exit 2
fi
# ATTN_ENABLE_CUDA=ON fails loudly when nvcc is missing.
# shellcheck disable=SC2086
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DATTN_ENABLE_CUDA=ON ${ATTN_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD" -j "$JOBS" --target attnlab attn_tests -- --no-print-directory >/dev/null
grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' "$BUILD/CMakeCache.txt" || {
  echo "gpu-bundle: $BUILD is not a Release build" >&2
  exit 2
}

rm -rf "$DIR"
mkdir -p "$DIR/bin" "$DIR/lib/fallback"
for bin in attnlab attn_tests; do
  strip --strip-unneeded -o "$DIR/bin/$bin" "$BUILD/$bin"
  patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$DIR/bin/$bin"
done
# Every shared library ldd resolves here outside the base runtime goes into lib/.
source "$ROOT/scripts/gpu/base_libs.sh"
for bin in attnlab attn_tests; do
  ldd "$BUILD/$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    is_base_lib "$name" || [[ -e "$DIR/lib/$name" ]] || cp -L "$path" "$DIR/lib/$name"
  done
done
for lib in libstdc++.so.6 libgcc_s.so.1; do
  cp -L "$(ldd "$BUILD/attnlab" | awk -v n="$lib" '$1 == n {print $3}')" "$DIR/lib/fallback/$lib"
done
cp "$ROOT"/scripts/gpu/{run.sh,torch_compare.py,summarize.py,check.sh,base_libs.sh,fatbin_archs.py} "$DIR/"
chmod +x "$DIR/run.sh" "$DIR/check.sh"

archs="$(python3 "$ROOT/scripts/gpu/fatbin_archs.py" "$DIR/bin/attnlab" | tr '\n' ',' | sed 's/,$//; s/,/, /g')"
{
  echo "attnlab GPU bundle"
  echo "made: $(date -u +%FT%TZ) on $(hostname) ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1))"
  echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (uncommitted changes)')"
  echo "build: $BUILD, $(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$BUILD/CMakeCache.txt"), CUDA code $archs, nvcc $("$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt")" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  echo "SIMD targets: $("$DIR/bin/attnlab" list | sed -n 's/^targets built: \([^;]*\);.*/\1/p')"
  echo "files:"
  (cd "$DIR" && find . -type f | sort | xargs du -b | awk '{printf "  %10d  %s\n", $1, $2}')
} >"$DIR/MANIFEST"
"$DIR/check.sh"
# A device call carries the working tree and what it names, 64 MiB in all: the bundle also as
# DIR.tar.gz (a third of the folder; gzip, which every machine has), to carry instead.
archive="$DIR.tar.gz"
tar -C "$(dirname "$DIR")" -czf "$archive.tmp" "$(basename "$DIR")" && mv "$archive.tmp" "$archive"
tree="$(git -C "$ROOT" ls-files -z --cached --others --exclude-standard | (cd "$ROOT" && xargs -0 stat -c %s 2>/dev/null) |
        awk '{ s += $1 } END { printf "%d", s }')"
carry=$(( (tree + $(stat -c %s "$archive")) >> 20 ))
echo "gpu-bundle: $DIR ($(du -sh "$DIR" | cut -f1)) and $archive ($(du -sh "$archive" | cut -f1));" \
     "with the working tree a device call carrying the archive moves ${carry} MiB of its 64"
echo "gpu-bundle: on the GPU machine: tar -xzf $(basename "$archive") -C /tmp && /tmp/$(basename "$DIR")/run.sh OUTDIR"
((carry < 64)) || echo "gpu-bundle: WARNING: over the 64 MiB a device call may carry" >&2
