#!/usr/bin/env bash
# The AVX-512 target on a machine without AVX-512: the default (dispatched) build's attnlab
# booted, with a Linux kernel, on Bochs 3.0's emulated CPU with AVX-512 F/CD/BW/DQ/VL - what
# QEMU cannot do (TCG has no EVEX), and no CI machine of this project reliably has. The CPU
# behind the lab's machines changes between sessions (an AVX2-only EPYC for weeks), so the
# avx512 target's code - the quantized caches' AVX-512 readers above all (kv_load.hpp), written
# on AVX2 machines - would otherwise run for the first time on a user's CPU.
#
# One boot of Bochs (Debian trixie's bochs 3.0, unpacked with debootstrap into build-bochs/, its
# binary run through trixie's own loader, no chroot; the model `ryzen` with the AVX-512
# features added - Bochs 3.0's Sapphire Rapids model has AMX without XFD, which Linux refuses
# (#GP at XSETBV), and with AMX masked it stalls Linux 6.1's and 6.12's early boot, as 2.7's Tiger
# Lake model did; docs/kernels.md), a
# Debian bookworm kernel, an initramfs of busybox, attnlab, attn_tests and their libraries, and
# an /init that runs the checks below and powers off; the results come back through the emulated
# serial port.
#
#   attnlab list                     the dispatch: avx512 available and the default target
#   verify --impl all                the qemu_check shapes (scripts/emulated.sh) and, per
#                                    cache type (q8_0 q4_0 u8 u4 fp8_e4m3 fp8_e5m2), a GQA decode
#                                    and a chunked prefill against the cache, contiguous and
#                                    paged (--kv-block 16), an MLA shared cache; bf16 and f16
#                                    inputs. Every run must agree with the float64 reference, and
#                                    every SIMD row must name avx512 (simd[avx512], decode[avx512]).
#   ATTN_ISA=avx2 verify             one shape: the other target still runs there
#   attn_tests                       the avx512 SIMD-math cases: each quantized cache type's
#                                    register reader bit for bit against the rule on random
#                                    bytes (NaN/Inf scales and codes included), partial loads,
#                                    reductions, exp2 bit for bit, special values per lane (the
#                                    exp/exp2 accuracy scans, 34 s of emulated time, are left out:
#                                    they passed here once, and on the AVX-512 machines before)
#                                    and the KV cache suites' quick cases (every target): the
#                                    special-value suite per cache type, the planted reader and
#                                    block-table bugs, byte layouts, bad input
#
# Usage: scripts/bochs_check.sh BUILD_DIR [--gtest]   (a build configured with ATTN_NATIVE=OFF)
#   --gtest: also the KV cache suites' three agreement grids (KvCache.KernelsThatReadACache...,
#            Paged.FlashAndDecodeGive..., KvShared.*; 1.6 s natively, more than 40 minutes under
#            Bochs: for a change to the cache code, not for CI).
# Set-up: scripts/setup.sh bochs (busybox-static, isolinux, xorriso, debootstrap; the trixie tree
# and the kernel in build-bochs/, ~45 s the first time). The boot and every check: ~105 s on a
# 2-core Zen 3. Exit 0 all checks passed, 1 a check failed, 2 usage / wrong build / set-up failed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GTEST=0
ARGS=()
for a in "$@"; do
  case "$a" in
    --gtest) GTEST=1 ;;
    *) ARGS+=("$a") ;;
  esac
done
if [[ ${#ARGS[@]} -ne 1 ]]; then
  echo "usage: scripts/bochs_check.sh BUILD_DIR [--gtest] (the default build, ATTN_NATIVE=OFF)" >&2
  exit 2
fi
# shellcheck source=scripts/emulated.sh
source "$ROOT/scripts/emulated.sh"
dispatched_x86_build bochs_check "${ARGS[0]}"
if [[ ! -x "$BUILD/attn_tests" ]]; then
  echo "bochs_check: $BUILD/attn_tests not found (cmake --build ${ARGS[0]} --target attn_tests)" >&2
  exit 2
fi
if [[ "$(uname -m)" != x86_64 ]]; then
  echo "bochs_check: Bochs here emulates x86-64 for an x86-64 build on an x86-64 host; this is $(uname -m)" >&2
  exit 2
fi
BOCHS_DIR="${ATTN_BOCHS_DIR:-$ROOT/build-bochs}"
"$ROOT/scripts/setup.sh" bochs "$BOCHS_DIR" || exit 2
T="$BOCHS_DIR/trixie"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
START=$SECONDS
FAILED=0
fail() { echo "bochs_check: FAIL: $*" >&2; FAILED=1; }

# ---- the checks, one per line: NAME ARGS... (ARGS to attnlab; NAME with ISA=... forces a target)
CHECKS="$TMP/checks"
{
  echo "list list"
  i=0
  for shape in "${SHAPES[@]}"; do
    i=$((i + 1))
    echo "shape$i verify --impl all --threads 1 --seed 7 $shape"
  done
  decode="--batch 2 --q-heads 8 --kv-heads 2 --q-len 1 --kv-len 300 --head-dim 64 --causal --kv-lens 300,171"
  prefill="--batch 1 --q-heads 4 --kv-heads 2 --q-len 37 --kv-len 230 --head-dim 96 --causal"
  for t in q8_0 q4_0 u8 u4 fp8_e4m3 fp8_e5m2; do
    echo "$t.decode verify --impl all --threads 1 --seed 3 --kv-dtype $t $decode"
    echo "$t.prefill verify --impl all --threads 1 --seed 4 --kv-dtype $t $prefill"
    echo "$t.paged verify --impl all --threads 1 --seed 5 --kv-dtype $t --kv-block 16 $decode"
  done
  echo "mla.shared verify --impl all --threads 1 --seed 6 --batch 1 --q-heads 8 --kv-heads 1 --q-len 2 --kv-len 150" \
       "--head-dim 96 --head-dim-v 64 --kv-shared true --causal --kv-dtype u8"
  echo "bf16 verify --impl all --threads 1 --seed 8 --dtype bf16 ${SHAPES[0]}"
  echo "bf16.decode verify --impl all --threads 1 --seed 10 --dtype bf16 $decode"
  echo "f16 verify --impl all --threads 1 --seed 9 --dtype f16 $decode"
  echo "ISA=avx2 forced_avx2 verify --impl all --threads 1 --seed 7 ${SHAPES[1]}"
} >"$CHECKS"

# The KV cache suites' agreement grids: 1.6 s natively, unfinished after 40 minutes emulated.
SLOW="KvCache.KernelsThatReadACacheAgreeOnEveryCacheType:Paged.FlashAndDecodeGiveTheContiguousResultBitForBit:KvShared.*"

# ---- the initramfs: busybox, attnlab (and attn_tests), their libraries, /init
R="$TMP/root"
mkdir -p "$R"/{bin,dev,proc,sys,tmp,t,lib64}
cp /bin/busybox "$R/bin/"
for a in sh mount poweroff cat echo grep env uname sleep; do ln -s busybox "$R/bin/$a"; done
strip -o "$R/t/attnlab" "$EXE"
strip -o "$R/t/attn_tests" "$BUILD/attn_tests"
bins=("$EXE" "$BUILD/attn_tests")
for lib in $(ldd "${bins[@]}" | awk '/=> \//{print $3}' | sort -u); do
  mkdir -p "$R$(dirname "$lib")"
  cp -L "$lib" "$R$lib"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$R/lib64/"
cp "$CHECKS" "$R/t/checks"
cat >"$R/init" <<EOF
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
cd /t
echo "=== FLAGS \$(grep -m1 '^flags' /proc/cpuinfo)"
while read -r name args; do
  isa=""
  case "\$name" in ISA=*) isa="\${name#ISA=}"; set -- \$args; name="\$1"; shift; args="\$*" ;; esac
  echo "=== BEGIN \$name"
  if [ -n "\$isa" ]; then ATTN_ISA="\$isa" ./attnlab \$args 2>&1; else ./attnlab \$args 2>&1; fi
  echo "=== END \$name rc=\$?"
done </t/checks
echo "=== BEGIN simd_math"
./attn_tests --gtest_color=no --gtest_filter='Targets/SimdMath.*/avx512:-Targets/SimdMath.Exp*Accuracy*' 2>&1
echo "=== END simd_math rc=\$?"
echo "=== BEGIN kv_suites"
./attn_tests --gtest_color=no --gtest_filter='KvQuant.*:KvCache.*:Paged.*:-$SLOW' 2>&1
echo "=== END kv_suites rc=\$?"
if [ $GTEST = 1 ]; then
  echo "=== BEGIN gtest"
  ./attn_tests --gtest_color=no --gtest_filter='$SLOW' 2>&1
  echo "=== END gtest rc=\$?"
fi
echo "=== ALL DONE"
sleep 2  # the serial port drains its buffer before the power goes
poweroff -f
EOF
chmod +x "$R/init"
ISO="$TMP/iso"
mkdir -p "$ISO/isolinux"
cp /usr/lib/ISOLINUX/isolinux.bin /usr/lib/syslinux/modules/bios/ldlinux.c32 "$ISO/isolinux/"
cp "$BOCHS_DIR/vmlinuz" "$ISO/vmlinuz"
(cd "$R" && find . | cpio -o -H newc 2>/dev/null | gzip -1 >"$ISO/initrd.gz")
# idle=nomwait: the idle loop halts instead of MWAIT; tsc=reliable and lpj skip calibrations
# that take minutes of emulated time.
cat >"$ISO/isolinux/isolinux.cfg" <<'EOF'
DEFAULT linux
PROMPT 0
TIMEOUT 0
LABEL linux
  KERNEL /vmlinuz
  APPEND initrd=/initrd.gz console=ttyS0,115200 loglevel=3 nokaslr mitigations=off tsc=reliable lpj=5000000 panic=-1 idle=nomwait
EOF
xorriso -as mkisofs -quiet -o "$TMP/boot.iso" -b isolinux/isolinux.bin -c isolinux/boot.cat -no-emul-boot \
  -boot-load-size 4 -boot-info-table "$ISO" 2>/dev/null

# ---- Bochs: `ryzen` plus AVX-512; the term display (in a pty from script(1)) as the package has
# no headless one; the serial port to a file; `c` answers the debugger's first prompt.
cat >"$TMP/bochsrc" <<EOF
display_library: term
megs: 2048
cpu: model=ryzen, count=1, ips=200000000, reset_on_triple_fault=0, add_features="avx512 avx512dq avx512bw avx512cd"
romimage: file=$T/usr/share/bochs/BIOS-bochs-latest
vgaromimage: file=$T/usr/share/bochs/VGABIOS-lgpl-latest.bin
ata0-master: type=cdrom, path=$TMP/boot.iso, status=inserted
boot: cdrom
com1: enabled=1, mode=file, dev=$TMP/serial.txt
clock: sync=none, time0=local
log: $TMP/bochs.log
panic: action=fatal
error: action=ignore
info: action=ignore
EOF
[[ -f "$T/usr/share/bochs/VGABIOS-lgpl-latest.bin" ]] || sed -i 's/VGABIOS-lgpl-latest.bin/VGABIOS-lgpl-latest/' "$TMP/bochsrc"
echo c >"$TMP/debugger.rc"
LIMIT="${ATTN_BOCHS_TIMEOUT:-$((GTEST ? 5400 : 1500))}"
echo "bochs_check: booting $(basename "$(readlink -f "$BOCHS_DIR/vmlinuz")") on Bochs $(cat "$BOCHS_DIR/bochs-version")" \
     "(ryzen + AVX-512), $(wc -l <"$CHECKS") attnlab runs, the avx512 SIMD-math cases, the KV cache suites$( ((GTEST)) && echo ' with their agreement grids'), at most $LIMIT s"
rc=0
LTDL_LIBRARY_PATH="$T/usr/lib/x86_64-linux-gnu/bochs/plugins" BXSHARE="$T/usr/share/bochs" TERM=xterm \
  timeout "$LIMIT" script -qfec "$T/lib64/ld-linux-x86-64.so.2 --library-path $T/lib/x86_64-linux-gnu:$T/usr/lib/x86_64-linux-gnu $T/usr/bin/bochs-bin -q -f $TMP/bochsrc -rc $TMP/debugger.rc" \
  /dev/null >"$TMP/bochs.out" 2>&1 </dev/null || rc=$?
S="$TMP/console.txt"  # the serial console's text without its carriage returns
touch "$TMP/serial.txt"
tr -d '\r' <"$TMP/serial.txt" >"$S"
if [[ -n "${ATTN_BOCHS_KEEP:-}" ]]; then cp "$S" "$ATTN_BOCHS_KEEP"; fi
if ! grep -q '^=== ALL DONE' "$S"; then
  fail "the emulated machine did not finish (exit $rc$( ((rc == 124)) && echo ": over $LIMIT s")); its console's last lines:"
  tail -n 15 "$S" >&2
  grep -a -E 'PANIC|FATAL' "$TMP/bochs.log" "$TMP/bochs.out" 2>/dev/null | head -n 5 >&2 || true
fi
flags="$(grep -m1 '^=== FLAGS' "$S" || true)"
for f in avx512f avx512bw avx512dq avx512vl; do
  grep -qw "$f" <<<"$flags" || fail "the emulated CPU lacks $f (/proc/cpuinfo: ${flags:-none})"
done

# section NAME: the output of check NAME
section() { awk -v n="$1" '$0 == "=== BEGIN " n {on = 1; next} on && index($0, "=== END " n " rc=") == 1 {exit} on' "$S"; }
rc_of() { { grep -m1 "^=== END $1 rc=" "$S" || true; } | sed 's/.*rc=//'; }
while read -r name rest; do
  [[ "$name" == ISA=* ]] && name="${rest%% *}"
  out="$(section "$name")"
  r="$(rc_of "$name")"
  if [[ "$r" != 0 ]]; then
    fail "$name: exit ${r:-(did not run)}"
    tail -n 12 <<<"$out" >&2
    continue
  fi
  [[ "$name" == list ]] && continue
  grep -q '^all kernels that ran agree' <<<"$out" || fail "$name: no 'all kernels that ran agree' line"
  want=avx512
  [[ "$name" == forced_avx2 ]] && want=avx2
  rows="$(grep -E '^  (simd|threaded|flash|decode)\[' <<<"$out" | grep -E ' PASS' || true)"
  if [[ -z "$rows" ]]; then
    fail "$name: no SIMD kernel PASSed"
  elif grep -vq "\[$want\]" <<<"$rows"; then
    fail "$name: a SIMD row does not name $want: $(grep -v "\[$want\]" <<<"$rows" | head -n 1 | tr -s ' ')"
  fi
  printf 'bochs_check: %-18s %s\n' "$name" "$(grep -m1 '^verified ' <<<"$out" | cut -d';' -f1): $(tr '\n' ' ' <<<"$rows" | grep -oE '(simd|threaded|flash|decode)\[[a-z0-9_]+\]' | sort -u | tr '\n' ' ')"
done <"$CHECKS"
list="$(section list)"
if ! grep -qw avx512 <<<"$list"; then
  fail "attnlab list names no avx512 target: $(head -n 5 <<<"$list" | tr -s ' ')"
fi
# gtest NAME WHAT: the gtest run of section NAME passed, and ran tests (a filter matching none
# passes vacuously).
gtest() {
  local out
  out="$(section "$1")"
  if [[ "$(rc_of "$1")" != 0 ]] || ! grep -qE '^\[  PASSED  \] [1-9]' <<<"$out"; then
    fail "$2 under Bochs: exit $(rc_of "$1")"
    grep -E '^\[  FAILED  \]|Failure|rule .*, read' <<<"$out" | head -n 20 >&2 || true
  else
    echo "bochs_check: $2: $(grep -m1 '^\[  PASSED  \]' <<<"$out")" \
         "$(grep -m1 '^\[==========\] .* ran' <<<"$out" | grep -oE '\([0-9]+ ms total\)' || true)"
    if grep -q '^\[  SKIPPED \]' <<<"$out"; then fail "$2: cases skipped: $(grep -m1 '^\[  SKIPPED \]' <<<"$out")"; fi
  fi
}
gtest simd_math "attn_tests Targets/SimdMath.*/avx512 (less the accuracy scans)"
gtest kv_suites "attn_tests KvQuant, KvCache, Paged (less the agreement grids)"
if ((GTEST)); then gtest gtest "attn_tests: the KV cache agreement grids"; fi

if ((FAILED)); then
  echo "bochs_check: FAILED ($((SECONDS - START)) s)" >&2
  exit 1
fi
echo "bochs_check: OK: the default build verifies on an emulated AVX-512 CPU (every SIMD row ran avx512;" \
     "ATTN_ISA=avx2 still runs avx2), $((SECONDS - START)) s"
