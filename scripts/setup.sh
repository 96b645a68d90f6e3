#!/usr/bin/env bash
# Installs the Debian packages attnlab builds and runs with, when any is missing.
# Idempotent and quiet when everything is present. No downloads at build time.
# Usage: scripts/setup.sh [clang]   (clang: also clang 14 with libFuzzer and the sanitizer
# runtimes, for scripts/lab fuzz and tsan-test)
#        scripts/setup.sh bundle   (also patchelf: scripts/lab gpu-bundle sets the bundle's RPATH)
#        scripts/setup.sh bochs [DIR]   (also busybox-static, isolinux, xorriso and debootstrap;
# into DIR, default build-bochs/: Debian trixie's Bochs 3.0 unpacked by debootstrap, and a
# bookworm kernel's vmlinuz: scripts/bochs_check.sh)
#        scripts/setup.sh cross-aarch64 [SYSROOT]   (also the aarch64 cross compiler, qemu-user and
# Debian's arm64 builds of the libraries, unpacked into SYSROOT, default build-aarch64-sysroot/:
# scripts/lab cross-test aarch64, cmake/aarch64-linux-gnu.cmake)
set -euo pipefail

case "${1:-}" in
  ""|clang|qemu|bochs|cross-aarch64|slurm|bundle) ;;
  *) echo "setup: unknown mode '$1'; allowed: (none), clang, qemu, bochs, cross-aarch64, slurm, bundle" >&2; exit 2 ;;
esac

PKGS=(
  build-essential cmake
  libxsimd-dev libtbb-dev libbenchmark-dev libgtest-dev googletest
  libcli11-dev nlohmann-json3-dev
  python3-matplotlib python3-numpy python3-dev python3-pybind11 python3-pytest
  libbenchmark-tools python3-scipy python3-venv ccache clang-format
)
# libclang-rt-14-dev holds libFuzzer and clang's sanitizer runtimes; llvm-14 the symbolizer
# that turns sanitizer stack traces into file:line.
if [[ "${1:-}" == clang ]]; then
  PKGS+=(clang-14 libclang-rt-14-dev llvm-14)
fi
# scripts/setup.sh qemu: also Debian's qemu-user (qemu-x86_64 -cpu Haswell: scripts/qemu_check.sh).
if [[ "${1:-}" == qemu ]]; then
  PKGS+=(qemu-user)
fi
if [[ "${1:-}" == cross-aarch64 ]]; then
  PKGS+=(g++-aarch64-linux-gnu qemu-user)
fi
if [[ "${1:-}" == bochs ]]; then
  PKGS+=(busybox-static isolinux syslinux-common xorriso cpio debootstrap bsdutils binutils)
fi
if [[ "${1:-}" == bundle ]]; then
  PKGS+=(patchelf)
fi
# scripts/setup.sh slurm: Slurm and munge (scripts/lab slurm-test, scripts/slurm/).
if [[ "${1:-}" == slurm ]]; then
  PKGS+=(slurm-wlm munge)
fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
updated=0
apt_update() {  # at most once a run
  if ((updated == 0)); then
    $SUDO apt-get update -qq >/dev/null
    updated=1
  fi
}
# cross-aarch64 downloads arm64 packages: apt needs the architecture (and its package lists).
if [[ "${1:-}" == cross-aarch64 ]] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "setup: dpkg --add-architecture arm64" >&2
  $SUDO dpkg --add-architecture arm64
  apt_update
fi

if ((${#missing[@]} > 0)); then
  echo "setup: installing ${missing[*]}" >&2
  apt_update
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "setup: done" >&2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Bochs 3.0 (Debian trixie; bookworm's 2.7 reports an XSAVE size for AVX-512 that Linux refuses,
# so the kernel turns XSAVE off): a minimal trixie tree by debootstrap with bochs installed in it
# (chroot apt, as root), run later through that tree's own loader; and a bookworm kernel image.
if [[ "${1:-}" == bochs ]]; then
  dir="${2:-$ROOT/build-bochs}"
  if [[ -f "$dir/.attnlab-bochs" && -x "$dir/trixie/usr/bin/bochs-bin" && -f "$dir/vmlinuz" ]]; then
    exit 0
  fi
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: bochs: debootstrap and chroot need root (run as root, or with sudo)" >&2
    exit 2
  fi
  echo "setup: Debian trixie's bochs into $dir/trixie (debootstrap, ~40 s) and a bookworm kernel" >&2
  rm -rf "$dir/trixie"
  mkdir -p "$dir"
  debootstrap --variant=minbase trixie "$dir/trixie" http://deb.debian.org/debian >"$dir/debootstrap.log" 2>&1 || {
    tail -n 20 "$dir/debootstrap.log" >&2
    exit 1
  }
  chroot "$dir/trixie" apt-get update -qq >"$dir/apt.log" 2>&1 &&
    DEBIAN_FRONTEND=noninteractive chroot "$dir/trixie" apt-get install -y -qq --no-install-recommends \
      bochs bochs-term bochsbios vgabios >>"$dir/apt.log" 2>&1 || {
    tail -n 20 "$dir/apt.log" >&2
    exit 1
  }
  chroot "$dir/trixie" dpkg-query -W -f='${Version}' bochs >"$dir/bochs-version"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  kpkg() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'; }
  pkg="$(kpkg)"
  if [[ -z "$pkg" ]] || ! (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "$pkg") >/dev/null 2>&1; then
    apt_update
    pkg="$(kpkg)"
    (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "$pkg") >/dev/null
  fi
  dpkg-deb --fsys-tarfile "$tmp"/*.deb | tar -x -C "$tmp" --wildcards './boot/vmlinuz-*'
  cp "$tmp"/boot/vmlinuz-* "$dir/"
  ln -sf "$(basename "$tmp"/boot/vmlinuz-*)" "$dir/vmlinuz"
  echo "$pkg" >"$dir/.attnlab-bochs"
  echo "setup: done (bochs $(cat "$dir/bochs-version"), $pkg)" >&2
  exit 0
fi
[[ "${1:-}" == cross-aarch64 ]] || exit 0

# The arm64 libraries for the cross build. Installing them as :arm64 packages would tie the
# installed amd64 packages to their versions (Multi-Arch: same; libtbb12:arm64 pulls
# libudev1:arm64, which must match the amd64 libudev1 and so upgrades systemd), so they are
# downloaded and unpacked (no maintainer scripts) into a folder of their own instead; the
# compiler's own runtime (libc, libstdc++) is the cross packages' /usr/aarch64-linux-gnu.
ARM64_PKGS=(libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5 libgtest-dev libbenchmark-dev
            libbenchmark1debian libxsimd-dev)
ALL_PKGS=(libcli11-dev nlohmann-json3-dev)  # Architecture: all (header-only)
sysroot="${2:-$ROOT/build-aarch64-sysroot}"
want="${ARM64_PKGS[*]} ${ALL_PKGS[*]}"
stamp="$sysroot/.attnlab-packages"  # first line: the package list it was made from
if [[ -f "$stamp" && "$(head -n1 "$stamp")" == "$want" ]]; then
  exit 0
fi
echo "setup: unpacking Debian's arm64 ${ARM64_PKGS[*]} and ${ALL_PKGS[*]} into $sysroot" >&2
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
download() {  # as root, apt would hand the download to its _apt user, who cannot write $tmp
  (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "${ARM64_PKGS[@]/%/:arm64}" "${ALL_PKGS[@]}")
}
if ! download >/dev/null 2>"$tmp/err"; then
  if ((updated)); then cat "$tmp/err" >&2; exit 1; fi
  apt_update  # stale package lists: the versions they name are gone from the archive
  download >/dev/null
fi
rm -rf "$sysroot.new"
mkdir -p "$sysroot.new"
for deb in "$tmp"/*.deb; do
  dpkg-deb -x "$deb" "$sysroot.new"
done
{ echo "$want"; (cd "$tmp" && ls -1 ./*.deb | sed 's|^\./||'); } >"$sysroot.new/.attnlab-packages"
rm -rf "$sysroot"
mv "$sysroot.new" "$sysroot"
echo "setup: done" >&2
