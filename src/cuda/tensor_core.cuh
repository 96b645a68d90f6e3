// The tensor-core instructions a FlashAttention-2 kernel on sm_80+ is made of, for real CUDA (inline
// PTX) and for the host emulation (emu.hpp's warp exchange), from one set of fragment layouts:
//   mma_bf16_16x8x16   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: D = A B + C, A 16x16
//                      and B 16x8 bf16, C and D 16x8 float32, spread over the warp's 32 lanes
//   ldmatrix_x4(_trans) ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: four 8x8 b16 matrices
//                      from shared memory into those fragments, lane l giving the address of row
//                      l % 8 of matrix l / 8
// The layouts are the PTX ISA's tables, written once in fragments.hpp as functions of (lane,
// element), host and device code: the emulation assembles the warp's matrices with them, a kernel
// indexes its fragments with them, and tests hold both to the tables' own examples
// (tests/kernels/test_cuda.cpp: CudaEmulation.Mma*, Ldmatrix*; CudaDevice.TensorCores* on a GPU, through
// tensor_core_selftest.cuh). The emulation multiplies bf16 products
// exactly in float32 and adds them in k order onto C (the hardware's order and intermediate
// precision are unspecified: the kernels' tolerance is the bf16-products class, not bitwise).
#pragma once

#include <cstdint>
#include <string>

#include "attnlab/dtype.hpp"
#include "cuda/device.cuh"
#include "cuda/fragments.hpp"

namespace attnlab::ATTN_CUDA_NS {

// d = a b + c for one warp; a[4], b[2] hold two bf16 each (the lower index in the low 16 bits).
__device__ __forceinline__ void mma_bf16_16x8x16(float d[4], const uint32_t a[4], const uint32_t b[2],
                                                 const float c[4]) {
#if defined(ATTN_CUDA_EMU)
  namespace tc = ::attnlab::tensor_core;
  const uint32_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  const uint32_t* warp = current().exchange(mine, 6, "mma_bf16_16x8x16");
  constexpr int W = BlockScheduler::kExchangeWords;
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < 8; ++i) {
      const tc::Coord at = tc::mma_a(l, i);
      A[at.row][at.col] = to_float(bf16{static_cast<uint16_t>(warp[l * W + i / 2] >> (16 * (i % 2)))});
    }
    for (int i = 0; i < 4; ++i) {
      const tc::Coord at = tc::mma_b(l, i);
      B[at.row][at.col] = to_float(bf16{static_cast<uint16_t>(warp[l * W + 4 + i / 2] >> (16 * (i % 2)))});
    }
  }
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (int i = 0; i < 4; ++i) {
    const tc::Coord at = tc::mma_c(lane, i);
    float acc = c[i];
    for (int k = 0; k < 16; ++k) acc += A[at.row][k] * B[k][at.col];  // bf16 x bf16: exact in float32
    d[i] = acc;
  }
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
#endif
}

// d0 += a b[0..1] and d1 += a b[2..3]: the two 8-column n-tiles of B one ldmatrix_x4 gives (its
// matrices 0, 1 the first n-tile's k halves, 2, 3 the second's).
__device__ __forceinline__ void mma_bf16_16x16x16(float d0[4], float d1[4], const uint32_t a[4], const uint32_t b[4]) {
  mma_bf16_16x8x16(d0, a, b, d0);
  mma_bf16_16x8x16(d1, a, b + 2, d1);
}

// Four 8 x 8 b16 matrices from shared memory: this lane's `row` is row lane % 8 of matrix lane / 8
// (16 bytes, 16-byte aligned); r[j] gets this lane's two elements of matrix j (tensor_core::ldmatrix).
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* row) {
#if defined(ATTN_CUDA_EMU)
  namespace tc = ::attnlab::tensor_core;
  uintptr_t p = reinterpret_cast<uintptr_t>(row);
  const uintptr_t smem = reinterpret_cast<uintptr_t>(g_smem);
  if (p % 16 != 0 || p < smem || p + 16 > smem + g_smem_bytes) {  // the rule on a GPU (else undefined)
    current().report("ldmatrix_x4 at lane " + std::to_string(threadIdx.x % 32) +
                     ": a row address that is not 16 bytes of shared memory, 16-byte aligned");
    p = smem;  // (read something harmless until the block ends and the report is thrown)
  }
  const uint32_t mine[2] = {static_cast<uint32_t>(p), static_cast<uint32_t>(static_cast<uint64_t>(p) >> 32)};
  const uint32_t* warp = current().exchange(mine, 2, "ldmatrix_x4");
  constexpr int W = BlockScheduler::kExchangeWords;
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (int j = 0; j < 4; ++j) {
    uint32_t packed = 0;
    for (int h = 0; h < 2; ++h) {
      const tc::Coord at = tc::ldmatrix(lane, h, kTrans);
      const int src = 8 * j + at.row;  // the lane that gave that row's address
      const uint64_t addr = warp[src * W] | static_cast<uint64_t>(warp[src * W + 1]) << 32;
      const uint16_t v = reinterpret_cast<const uint16_t*>(static_cast<uintptr_t>(addr))[at.col];
      packed |= static_cast<uint32_t>(v) << (16 * h);
    }
    r[j] = packed;
  }
#else
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
  }
#endif
}

}  // namespace attnlab::ATTN_CUDA_NS
