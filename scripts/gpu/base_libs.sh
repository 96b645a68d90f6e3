# Sourced by the GPU bundle's scripts: the shared libraries every Linux machine with a C++
# runtime has, which the bundle takes from the machine it runs on (glibc's, libstdc++,
# libgcc_s). The CUDA driver (libcuda.so.1) is not linked: the static CUDA runtime opens it when
# the first CUDA call is made. Anything else a binary needs must come from the bundle's lib/.
is_base_lib() {
  case "$1" in
    linux-vdso.so.1 | ld-linux-x86-64.so.2 | /lib64/ld-linux-x86-64.so.2 | libc.so.6 | libm.so.6 | \
      libpthread.so.0 | libdl.so.2 | librt.so.1 | libstdc++.so.6 | libgcc_s.so.1) return 0 ;;
    *) return 1 ;;
  esac
}
