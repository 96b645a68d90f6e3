# shellcheck shell=bash
# What the emulated-CPU checks (scripts/qemu_check.sh, scripts/bochs_check.sh) share: the build
# they accept, and the shapes they verify.

# dispatched_x86_build NAME DIR: sets BUILD (DIR, absolute) and EXE (its attnlab) when DIR holds
# the default dispatched x86-64 build (ATTN_NATIVE=OFF); else says why, prefixed NAME, and exits 2.
dispatched_x86_build() {
  local name="$1" dir="$2" machine
  BUILD="$(cd "$dir" && pwd)"
  EXE="$BUILD/attnlab"
  if [[ ! -x "$EXE" ]]; then
    echo "$name: $EXE not found; build it first (cmake --build $dir --target attnlab)" >&2
    exit 2
  fi
  if grep -q '^ATTN_NATIVE:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null; then
    echo "$name: $BUILD is an ATTN_NATIVE=ON build (one target, -march=native): the check is for the" \
         "default dispatched build; configure one with -DATTN_NATIVE=OFF" >&2
    exit 2
  fi
  # ELF e_machine (bytes 18-19, little endian) 0x3e = x86-64; od is coreutils (file may be absent).
  machine="$(od -An -t x1 -j 18 -N 2 "$EXE" | tr -d ' \n')"
  if [[ "$machine" != 3e00 ]]; then
    echo "$name: $EXE is not an x86-64 binary (ELF e_machine bytes: ${machine:-none})" >&2
    exit 2
  fi
}

# One shape per entry: small, so the float64 reference and naive stay quick under emulation, and
# together they reach every SIMD kernel (simd, threaded, flash; decode at q_len 1 and 16) with
# vector tails, GQA, windows, per-batch kv lengths (0 included), both layouts and fully masked rows.
# shellcheck disable=SC2034  # used by the scripts that source this file
SHAPES=(
  "--batch 1 --q-heads 4 --kv-heads 2 --q-len 37 --kv-len 45 --head-dim 36 --causal"
  "--batch 2 --q-heads 8 --kv-heads 2 --q-len 1 --kv-len 300 --head-dim 64 --causal"
  "--batch 3 --q-heads 6 --kv-heads 2 --q-len 16 --kv-len 64 --head-dim 24 --window 8,0 --kv-lens 0,64,33 --layout bshd"
  "--batch 1 --q-heads 2 --kv-heads 1 --q-len 70 --kv-len 200 --head-dim 128 --causal-top-left"
  "--batch 1 --q-heads 3 --kv-heads 3 --q-len 40 --kv-len 17 --head-dim 8 --causal"
)
