// The CUDA kernels' device code run by the host emulation (src/cuda/emu.hpp) on host memory,
// as test-only kernels (not in the registry): tests on machines without a GPU use them like
// any other Kernel. Defined in tests/kernels/cuda_emu_kernels.cpp.
#pragma once

#include <string>

#include "attnlab/kernel.hpp"

namespace attnlab::test {

// which: an id of src/cuda/kernel_list.hpp ("naive", "flash", "flash_bf16", "decode"); the kernel is
// named "emu_cuda_<which>" and declares the registry kernel's capabilities.
const Kernel& emulated_cuda(const std::string& which);

}  // namespace attnlab::test
