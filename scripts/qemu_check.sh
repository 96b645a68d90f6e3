#!/usr/bin/env bash
# The dispatch on CPUs this machine is not (issue 9): runs the default (dispatched) build's
# `attnlab verify --impl all` under Debian's qemu-user, on small shapes that reach every SIMD
# kernel (simd, threaded, flash; decode at q_len 1 and 16) with vector tails, GQA, windows,
# per-batch kv lengths (0 included), both layouts and fully masked rows.
#
#   qemu-x86_64 -cpu Haswell   AVX2 + FMA + BMI, no AVX-512 (QEMU 7.2 has no AVX-512: any
#                              EVEX instruction reached is a SIGILL). Every kernel verifies;
#                              the run picked avx2: every SIMD row names avx2 (verify prints
#                              simd[avx2]), and its rows equal those of ATTN_ISA=avx2 and
#                              differ from ATTN_ISA=scalar (the errors, names aside);
#                              ATTN_ISA=avx512 is refused (exit 2, naming what the CPU runs);
#                              ATTN_ISA=avx2 and ATTN_ISA=scalar verify; decode_i8[avx2]
#                              verifies on q8_0, q4_0, u8, u4 caches (no AVX-VNNI in this CPU's
#                              CPUID: its vpmaddubsw path).
#   qemu-x86_64 -cpu qemu64    no AVX at all: the default run verifies with scalar (the rows
#                              of ATTN_ISA=scalar on Haswell); ATTN_ISA=avx2 is refused (exit 2).
#
# Usage: scripts/qemu_check.sh BUILD_DIR   (a build configured with ATTN_NATIVE=OFF, x86-64)
# Installs qemu-user when missing (scripts/setup.sh qemu). Prints each step's time; about
# 11 s on 2 cores (30 emulated runs of 0-3 s). Exit 0 all checks passed, 1 a check failed, 2 usage / wrong build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ $# -ne 1 ]]; then
  echo "usage: scripts/qemu_check.sh BUILD_DIR (the default build, ATTN_NATIVE=OFF)" >&2
  exit 2
fi
# shellcheck source=scripts/emulated.sh
source "$ROOT/scripts/emulated.sh"
dispatched_x86_build qemu_check "$1"
"$ROOT/scripts/setup.sh" qemu
QEMU="$(command -v qemu-x86_64 || true)"
if [[ -z "$QEMU" ]]; then
  echo "qemu_check: qemu-x86_64 not found after scripts/setup.sh qemu (Debian package qemu-user)" >&2
  exit 2
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
START=$SECONDS
FAILED=0
fail() { echo "qemu_check: FAIL: $*" >&2; FAILED=1; }

# run CPU NAME ISA ARGS...: attnlab ARGS under qemu with that CPU model; ISA "" = unset.
# Output (without QEMU's warnings about host features TCG lacks) in $TMP/NAME.out; the exit
# code in $TMP/NAME.rc.
run() {
  local cpu="$1" name="$2" isa="$3" rc=0 t0=$SECONDS
  shift 3
  # No GPU for the emulated process: the check is about the CPU targets, and the CUDA driver's
  # ioctls are not something qemu-user is known to pass through (cuda_* skip: no device).
  if [[ -z "$isa" ]]; then
    CUDA_VISIBLE_DEVICES="" env -u ATTN_ISA "$QEMU" -cpu "$cpu" "$EXE" "$@" >"$TMP/$name.raw" 2>&1 || rc=$?
  else
    CUDA_VISIBLE_DEVICES="" ATTN_ISA="$isa" "$QEMU" -cpu "$cpu" "$EXE" "$@" >"$TMP/$name.raw" 2>&1 || rc=$?
  fi
  grep -v "TCG doesn't support requested feature" "$TMP/$name.raw" >"$TMP/$name.out" || true
  echo "$rc" >"$TMP/$name.rc"
  local what="exit $rc"
  ((rc == 132)) && what="SIGILL (exit 132): an instruction this CPU lacks"
  printf 'qemu_check: %-7s %-22s %3d s  %s\n' "$cpu" "$name" $((SECONDS - t0)) "$what"
}
rc_of() { cat "$TMP/$1.rc"; }

# verify_all CPU ISA LABEL: verify --impl all on every shape; rows of the SIMD kernels go to
# $TMP/LABEL.rows (shape by shape).
verify_all() {
  local cpu="$1" isa="$2" label="$3" i=0
  : >"$TMP/$label.rows"
  for shape in "${SHAPES[@]}"; do
    i=$((i + 1))
    # shellcheck disable=SC2086
    run "$cpu" "$label.$i" "$isa" verify --impl all --threads 2 --seed 7 $shape
    local rc
    rc="$(rc_of "$label.$i")"
    if [[ "$rc" != 0 ]]; then
      fail "$cpu ATTN_ISA=${isa:-(unset)} verify --impl all $shape: exit $rc"
      tail -n 20 "$TMP/$label.$i.out" >&2
    fi
    if ! grep -q '^all kernels that ran agree' "$TMP/$label.$i.out"; then
      [[ "$rc" == 0 ]] && fail "$cpu ATTN_ISA=${isa:-(unset)} $shape: no 'all kernels that ran agree' line"
    fi
    grep -E '^  (simd|threaded|flash|decode)\b' "$TMP/$label.$i.out" >>"$TMP/$label.rows" || true
  done
  # The same rows without the target's name (simd[avx2] -> simd): the numbers alone.
  sed -E 's/\[[a-z0-9_]+\]/ /' "$TMP/$label.rows" >"$TMP/$label.nums"
}

echo "qemu_check: $EXE under $("$QEMU" --version | head -n 1)"

# ---- Haswell: AVX2, no AVX-512 ----
run Haswell list "" list
if [[ "$(rc_of list)" != 0 ]]; then
  fail "Haswell: attnlab list exit $(rc_of list)"
fi
sed 's/^/    /' "$TMP/list.out"

verify_all Haswell "" default
verify_all Haswell avx2 forced_avx2
verify_all Haswell scalar forced_scalar
# Every SIMD kernel ran (PASS) on some shape, decode included.
for k in simd threaded flash decode; do
  if ! grep -qE "^  $k\b.* PASS" "$TMP/default.rows"; then
    fail "Haswell default: $k never PASSed (rows: $(grep -E "^  $k\b" "$TMP/default.rows" | head -n 2 | tr -s ' '))"
  fi
done
# picked_by_name LABEL ISA: when verify names the target of each SIMD row (e.g. simd[avx2]),
# every row of LABEL names ISA. Returns 1 when the rows name no target (older output).
picked_by_name() {
  local label="$1" isa="$2"
  grep -qwE 'scalar|avx2|avx512|neon' "$TMP/$label.rows" || return 1
  local other
  other="$(grep -vw "$isa" "$TMP/$label.rows" | head -n 1 || true)"
  if [[ -n "$other" ]]; then
    fail "$label: a SIMD row does not name $isa: $(tr -s ' ' <<<"$other")"
  else
    echo "qemu_check: $label: every SIMD row ($(wc -l <"$TMP/$label.rows")) names $isa: $(head -n 1 "$TMP/$label.rows" | tr -s ' ')"
  fi
}
picked_by_name default avx2 || true
# The default picked avx2: the same rows as ATTN_ISA=avx2, not those of ATTN_ISA=scalar
# (the numbers differ between targets; evidence that holds without the target's name too).
if ! cmp -s "$TMP/default.nums" "$TMP/forced_avx2.nums"; then
  fail "Haswell: the default run's SIMD rows differ from ATTN_ISA=avx2's: the default is not avx2"
  diff "$TMP/default.rows" "$TMP/forced_avx2.rows" | head -n 20 >&2 || true
elif cmp -s "$TMP/default.nums" "$TMP/forced_scalar.nums"; then
  fail "Haswell: the default run's SIMD errors equal ATTN_ISA=scalar's: cannot tell avx2 from scalar"
elif grep -qw avx512 "$TMP/default.rows"; then
  fail "Haswell: a default verify row names avx512: $(grep -w avx512 "$TMP/default.rows" | head -n 1)"
else
  echo "qemu_check: Haswell: the default run picked avx2 (the errors of its $(wc -l <"$TMP/default.rows") SIMD rows" \
       "equal ATTN_ISA=avx2's and differ from ATTN_ISA=scalar's)"
fi

# Asking for AVX-512 on this CPU: a clear error naming what it runs, exit 2, no SIGILL.
run Haswell avx512_refused avx512 verify --impl simd --threads 2 --batch 1 --q-heads 2 --kv-heads 2 \
  --q-len 9 --kv-len 9 --head-dim 16
msg="$(grep -m1 'avx512' "$TMP/avx512_refused.out" || true)"
if [[ "$(rc_of avx512_refused)" != 2 ]] || ! grep -q 'cannot run avx512' <<<"$msg" || ! grep -q 'avx2' <<<"$msg"; then
  fail "Haswell ATTN_ISA=avx512: want exit 2 and an error naming avx2 as what the CPU runs; got exit" \
       "$(rc_of avx512_refused): $(head -n 3 "$TMP/avx512_refused.out")"
else
  echo "qemu_check: Haswell ATTN_ISA=avx512 refused: $msg"
fi

# decode_i8 on a CPU without AVX-VNNI: its avx2 variant sums with vpmaddubsw + vpmaddwd (a vpdpbusd
# here would be SIGILL), on every cache type with integer codes.
for t in q8_0 q4_0 u8 u4; do
  run Haswell "i8_$t" "" verify --impl decode,decode_i8 --threads 2 --seed 7 --batch 1 --q-heads 8 --kv-heads 2 \
    --q-len 2 --kv-len 300 --head-dim 64 --causal --kv-dtype "$t"
  if [[ "$(rc_of "i8_$t")" != 0 ]] || ! grep -qE '^  decode_i8\[avx2\] .* PASS' "$TMP/i8_$t.out"; then
    fail "Haswell decode_i8 $t: want decode_i8[avx2] PASS; got exit $(rc_of "i8_$t"):" \
         "$(grep -m1 -E 'decode_i8|error' "$TMP/i8_$t.out" || true)"
  fi
done

# ---- qemu64: x86-64 without AVX ----
verify_all qemu64 "" qemu64_default
picked_by_name qemu64_default scalar || true
if ! cmp -s "$TMP/qemu64_default.nums" "$TMP/forced_scalar.nums"; then
  fail "qemu64: the default run's SIMD errors differ from Haswell's ATTN_ISA=scalar rows: the default is not scalar"
else
  echo "qemu_check: qemu64: the default run picked scalar (its SIMD errors equal ATTN_ISA=scalar's on Haswell)"
fi
run qemu64 qemu64_avx2_refused avx2 verify --impl simd --threads 2 --batch 1 --q-heads 2 --kv-heads 2 \
  --q-len 9 --kv-len 9 --head-dim 16
if [[ "$(rc_of qemu64_avx2_refused)" != 2 ]] || ! grep -q 'cannot run avx2' "$TMP/qemu64_avx2_refused.out"; then
  fail "qemu64 ATTN_ISA=avx2: want exit 2 'cannot run avx2'; got exit $(rc_of qemu64_avx2_refused):" \
       "$(head -n 3 "$TMP/qemu64_avx2_refused.out")"
fi

if ((FAILED)); then
  echo "qemu_check: FAILED ($((SECONDS - START)) s)" >&2
  exit 1
fi
echo "qemu_check: OK: the default build verifies under qemu-x86_64 -cpu Haswell (avx2 picked, avx512 refused)" \
     "and -cpu qemu64 (scalar), $((SECONDS - START)) s"
