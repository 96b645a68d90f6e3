// Host side of the CUDA kernels (src/cuda/runtime.cu, compiled by nvcc): device discovery,
// the cached device buffers, the copies, the launch and its event timing. Plain C++ interface,
// used by src/cuda/kernels.cpp only in builds with ATTN_HAS_CUDA.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "attnlab/cuda.hpp"
#include "cuda/args.hpp"

namespace attnlab::cuda_dev {

// Elements each host view spans from its first element to its last (the contiguous range a
// copy must move; Q, K, V elements are of host.dtype's size), and whether O is dense (its span holds only O: one copy
// back suffices).
struct Extents {
  int64_t q = 0, k = 0, v = 0, o = 0, lse = 0;
  bool o_dense = true;
};

// Empty when device 0 is usable, else the reason ("no CUDA device (...)"). Probed once.
const std::string& unavailable_reason();
std::optional<cuda::DeviceInfo> info();

// Copies the inputs named by `host` (host pointers) to the device, runs `ops`, copies O and
// LSE back into `host`'s output pointers and returns when they are there. With timed_launches
// > 0, that many more launches run back to back after the first, between two events, and
// timing.kernel_ms is their mean. Throws std::runtime_error naming the CUDA call and error on
// any failure (after draining the stream).
void run(const cuda_impl::KernelOps& ops, const cuda_impl::DeviceArgs& host, const Extents& ext, cuda::Timing& timing,
         int timed_launches = 0);

void release();

cuda::Bandwidth measure_bandwidth(double bytes, int reps);

}  // namespace attnlab::cuda_dev
