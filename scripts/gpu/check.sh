#!/usr/bin/env bash
# The GPU bundle's self-containment check (scripts/gpu/bundle.sh runs it; CI runs it through
# scripts/lab gpu-bundle). Exit 0 when, for the bundle this script lies in:
#   - each binary in bin/ has the RPATH $ORIGIN/../lib, and ldd resolves every library it needs
#     either into the bundle's lib/ or to the base C/C++ runtime (scripts/gpu/base_libs.sh);
#     nothing is "not found", and no CUDA runtime or driver library is linked (the runtime is
#     static; it opens the driver at the first CUDA call);
#   - every library in lib/ needs only base libraries or others in lib/;
#   - the CUDA code holds sm_90 machine code and compute_90 PTX;
#   - the whole folder is at most 60 MiB.
# Prints the newest glibc and libstdc++ symbol versions the binaries ask for: the GPU machine's
# own must be at least those (run.sh falls back to lib/fallback/ for libstdc++).
set -uo pipefail
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$DIR/base_libs.sh"
fail=0
bad() { echo "check: FAIL: $*" >&2; fail=1; }

needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }

for bin in "$DIR"/bin/*; do
  name="$(basename "$bin")"
  rpath="$(readelf -d "$bin" | sed -n 's/.*(RPATH).*\[\(.*\)\]/\1/p')"
  [[ "$rpath" == '$ORIGIN/../lib' ]] || bad "$name: RPATH is '$rpath', not \$ORIGIN/../lib"
  while read -r lib; do
    case "$lib" in libcuda.so* | libcudart.so*) bad "$name links $lib (the CUDA runtime must be static, the driver opened at run time)" ;; esac
  done < <(needed "$bin")
  resolved=0
  while read -r line; do
    lib="$(awk '{print $1}' <<<"$line")"
    path="$(awk '$2 == "=>" {print $3}' <<<"$line")"
    [[ -n "$path" && -e "$path" ]] && path="$(readlink -f "$path")"
    [[ "$line" == *"not found"* ]] && { bad "$name: $lib not found"; continue; }
    if [[ "$path" == "$DIR/lib/"* ]]; then
      resolved=$((resolved + 1))
    elif ! is_base_lib "$lib"; then
      bad "$name: $lib resolves to $path, outside the bundle and not part of the base runtime"
    fi
  done < <(ldd "$bin")
  echo "check: $name: RPATH \$ORIGIN/../lib, $resolved libraries from the bundle, the rest base runtime"
done
for lib in "$DIR"/lib/*.so*; do
  [[ -e "$lib" ]] || continue
  while read -r dep; do
    is_base_lib "$dep" || [[ -e "$DIR/lib/$dep" ]] || bad "lib/$(basename "$lib") needs $dep, which is neither base nor in lib/"
  done < <(needed "$lib")
done

# The CUDA code each binary carries (scripts/gpu/fatbin_archs.py reads the .nv_fatbin section:
# the toolkit here has no cuobjdump).
for bin in "$DIR"/bin/*; do
  if ! code="$(python3 "$DIR/fatbin_archs.py" "$bin")"; then
    bad "$(basename "$bin"): its CUDA code cannot be read"
    continue
  fi
  grep -qx 'ELF sm_90' <<<"$code" || bad "$(basename "$bin"): no sm_90 machine code"
  grep -qx 'PTX sm_90' <<<"$code" || bad "$(basename "$bin"): no compute_90 PTX"
  echo "check: $(basename "$bin"): CUDA code $(tr '\n' ',' <<<"$code" | sed 's/,$//; s/,/, /g')"
done

bytes="$(du -sb "$DIR" | cut -f1)"
((bytes <= 60 * 1024 * 1024)) || bad "the bundle is $((bytes >> 20)) MiB; allowed: at most 60 MiB"
versions() { objdump -T "$DIR"/bin/* 2>/dev/null | grep -o "$1"'_[0-9.]*' | sort -uV | tail -1; }
echo "check: $((bytes >> 20)) MiB; the binaries need at least $(versions GLIBC) and $(versions GLIBCXX)"
if ((fail)); then
  echo "check: the bundle is NOT self-contained" >&2
  exit 1
fi
echo "check: self-contained"
