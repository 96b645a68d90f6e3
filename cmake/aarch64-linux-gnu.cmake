# Cross-compiling attnlab for aarch64 Linux with Debian's g++-aarch64-linux-gnu (scripts/lab
# cross-test aarch64; scripts/setup.sh cross-aarch64 installs what it needs).
#
# The compiler brings the C and C++ runtimes (/usr/aarch64-linux-gnu, the *-arm64-cross
# packages). The arm64 builds of the libraries (TBB, GoogleTest, Google Benchmark, xsimd, and
# the header-only CLI11 and nlohmann-json) are Debian's arm64 packages unpacked into a sysroot
# folder, ATTN_AARCH64_SYSROOT (default build-aarch64-sysroot/ in the source tree), rather than
# installed as :arm64 packages, which would tie the installed amd64 packages' versions to theirs.
#
# Binaries run under qemu-aarch64 (CMAKE_CROSSCOMPILING_EMULATOR: gtest discovery and ctest use
# it); they find the sysroot's shared libraries through the build RPATH.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# Read from the environment or the default each time (try_compile re-reads this file).
if(DEFINED ENV{ATTN_AARCH64_SYSROOT})
  set(ATTN_AARCH64_SYSROOT "$ENV{ATTN_AARCH64_SYSROOT}")
else()
  get_filename_component(ATTN_AARCH64_SYSROOT "${CMAKE_CURRENT_LIST_DIR}/../build-aarch64-sysroot" ABSOLUTE)
endif()
if(NOT EXISTS "${ATTN_AARCH64_SYSROOT}/usr/lib/aarch64-linux-gnu/cmake/TBB")
  message(FATAL_ERROR "aarch64 toolchain: no arm64 libraries in ATTN_AARCH64_SYSROOT='${ATTN_AARCH64_SYSROOT}'; "
                      "run scripts/setup.sh cross-aarch64 '${ATTN_AARCH64_SYSROOT}' first")
endif()

# Libraries, headers and CMake packages only from the sysroot and the cross runtime;
# programs (the build tools) from the host.
set(CMAKE_FIND_ROOT_PATH "${ATTN_AARCH64_SYSROOT}" /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

find_program(ATTN_QEMU_AARCH64 qemu-aarch64)
if(ATTN_QEMU_AARCH64)
  # -L: the aarch64 dynamic loader, libc and libstdc++ of the cross runtime.
  set(CMAKE_CROSSCOMPILING_EMULATOR "${ATTN_QEMU_AARCH64};-L;/usr/aarch64-linux-gnu")
endif()
