// Tensor-core self-test kernels: one warp each, small fixed inputs, checked on the host against
// the PTX ISA's tables (tests/kernels/test_cuda.cpp: CudaEmulation.* under the host emulation, where
// tests/kernels/cuda_emu_kernels.cpp includes this; CudaDevice.* on a GPU, where tensor_core_check.cu
// compiles the same kernels with nvcc). What the emulation's model of mma / ldmatrix claims, the
// hardware is then held to by the same test.
#pragma once

#include <cstdint>

#include "cuda/tensor_core.cuh"

namespace attnlab::ATTN_CUDA_NS::tc_selftest {

// One m16n8k16 product: each lane's A, B, C fragments gathered from row-major A (16 x 16), B
// (16 x 8: k down), C (16 x 8) by the PTX ISA's tables as written out here (not through
// tensor_core::, so the test reads the tables on its own), D stored per lane: D[lane * 4 + i].
__global__ void mma_one(const uint16_t* A, const uint16_t* B, const float* C, float* D, int leave_lane) {
  const int lane = static_cast<int>(threadIdx.x), g = lane / 4, t = lane % 4;
  if (lane == leave_lane) return;
  const auto pair = [](uint16_t lo, uint16_t hi) {
    return static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
  };
  const uint32_t a[4] = {pair(A[g * 16 + 2 * t], A[g * 16 + 2 * t + 1]),
                         pair(A[(g + 8) * 16 + 2 * t], A[(g + 8) * 16 + 2 * t + 1]),
                         pair(A[g * 16 + 2 * t + 8], A[g * 16 + 2 * t + 9]),
                         pair(A[(g + 8) * 16 + 2 * t + 8], A[(g + 8) * 16 + 2 * t + 9])};
  const uint32_t b[2] = {pair(B[(2 * t) * 8 + g], B[(2 * t + 1) * 8 + g]),
                         pair(B[(2 * t + 8) * 8 + g], B[(2 * t + 9) * 8 + g])};
  const float c[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
  float d[4];
  mma_bf16_16x8x16(d, a, b, c);
  for (int i = 0; i < 4; ++i) D[lane * 4 + i] = d[i];
}

// ldmatrix_x4 of four 8 x 8 b16 matrices M (matrix j's row r at M[j * 64 + r * 8]) put in shared
// memory: out[lane * 4 + j] = the register lane receives of matrix j.
template <bool kTrans>
__global__ void ldmatrix_one(const uint16_t* M, uint32_t* out) {
  uint16_t* s = dynamic_smem<uint16_t>();
  for (int e = static_cast<int>(threadIdx.x); e < 256; e += 32) s[e] = M[e];
  __syncthreads();
  uint32_t r[4];
  ldmatrix_x4<kTrans>(r, s + (threadIdx.x / 8) * 64 + (threadIdx.x % 8) * 8);
  for (int j = 0; j < 4; ++j) out[threadIdx.x * 4 + j] = r[j];
}

// The two together as a FlashAttention-2 kernel uses them: A (16 x 16) row-major and B (16 x 16,
// k down: V's layout) row-major in shared memory, A's fragments by ldmatrix_x4, B's by
// ldmatrix_x4.trans (two n-tiles of 8), two mma: D (16 x 16) = A B, stored row-major.
__global__ void ldmatrix_mma(const uint16_t* A, const uint16_t* B, float* D) {
  uint16_t* s = dynamic_smem<uint16_t>();  // A at 0, B at 256, rows of 16 elements
  for (int e = static_cast<int>(threadIdx.x); e < 512; e += 32) s[e] = e < 256 ? A[e] : B[e - 256];
  __syncthreads();
  const int lane = static_cast<int>(threadIdx.x), m = lane / 8, r = lane % 8;
  // matrix m of A: rows 8 (m % 2) .., columns 8 (m / 2) .. - the order of a[0..3]; of B: k rows
  // 8 (m % 2) .., n columns 8 (m / 2) .. - b of n-tile 0 is {r0, r1}, of n-tile 1 {r2, r3}.
  uint32_t a[4], b[4];
  ldmatrix_x4<false>(a, s + (8 * (m % 2) + r) * 16 + 8 * (m / 2));
  ldmatrix_x4<true>(b, s + 256 + (8 * (m % 2) + r) * 16 + 8 * (m / 2));
  const float zero[4] = {0, 0, 0, 0};
  for (int n = 0; n < 2; ++n) {
    float d[4];
    mma_bf16_16x8x16(d, a, b + 2 * n, zero);
    for (int i = 0; i < 4; ++i) {
      const auto at = ::attnlab::tensor_core::mma_c(lane, i);
      D[at.row * 16 + 8 * n + at.col] = d[i];
    }
  }
}

// Launchers on pointers the kernels can read (host memory under the emulation, device memory on
// a GPU; tensor_core_check.cu copies): one warp, dynamic shared memory as each kernel needs.
inline void mma(const uint16_t* A, const uint16_t* B, const float* C, float* D, int leave_lane) {
  launch_kernel(mma_one, dim3(1), dim3(32), 0, nullptr, A, B, C, D, leave_lane);
}
inline void ldmatrix(const uint16_t* M, uint32_t* out, bool trans) {
  if (trans)
    launch_kernel(ldmatrix_one<true>, dim3(1), dim3(32), 512, nullptr, M, out);
  else
    launch_kernel(ldmatrix_one<false>, dim3(1), dim3(32), 512, nullptr, M, out);
}
inline void ldmatrix_then_mma(const uint16_t* A, const uint16_t* B, float* D) {
  launch_kernel(ldmatrix_mma, dim3(1), dim3(32), 1024, nullptr, A, B, D);
}

}  // namespace attnlab::ATTN_CUDA_NS::tc_selftest
