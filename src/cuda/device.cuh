// Device-side building blocks shared by the CUDA kernels, and the switch between real CUDA
// (nvcc) and the host emulation (ATTN_CUDA_EMU, see emu.hpp) so the same kernel source is
// both compiled for the GPU and tested on machines without one.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(ATTN_CUDA_EMU)
#include "cuda/emu.hpp"
#define ATTN_CUDA_NS cuda_emu
#else
#include <cuda_runtime.h>

#include <mutex>
#include <unordered_map>
#define ATTN_CUDA_NS cuda_dev
#endif

#include "attnlab/blocks/online_softmax.hpp"
#include "cuda/args.hpp"

// `#pragma unroll` for nvcc; nothing for the host compiler (which would warn).
#if defined(ATTN_CUDA_EMU)
#define ATTN_UNROLL
#define ATTN_NO_UNROLL
#else
#define ATTN_UNROLL _Pragma("unroll")
#define ATTN_NO_UNROLL _Pragma("unroll 1")  // a cold loop kept rolled: code size (the GPU bundle's limit)
#endif

namespace attnlab::ATTN_CUDA_NS {

using cuda_impl::DeviceArgs;
using cuda_impl::LaunchEnv;

constexpr unsigned kFullMask = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;  // the kernels whose softmax runs on exp2 scale scores by it

// Max / sum over groups of kWidth consecutive lanes (kWidth a power of two <= 32); every lane
// of the group gets the result.
template <int kWidth>
__device__ __forceinline__ float group_max(float v) {
  ATTN_UNROLL
  for (int m = kWidth / 2; m > 0; m /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, m));
  return v;
}
template <int kWidth>
__device__ __forceinline__ float group_sum(float v) {
  ATTN_UNROLL
  for (int m = kWidth / 2; m > 0; m /= 2) v += __shfl_xor_sync(kFullMask, v, m);
  return v;
}

// a * b and a + b each rounded on its own, never contracted into a fused multiply-add (nvcc
// fuses by default): the textbook's arithmetic (textbook.hpp), which the tolerance baseline
// makes. With scores ~1e4 an ulp of a score is ~1e-3 and exp() amplifies it, so two roundings
// of the same dot product can differ by more than 4x the baseline's realized error.
__device__ __forceinline__ float mul_rn(float a, float b) {
#if defined(ATTN_CUDA_EMU)
  return a * b;
#else
  return __fmul_rn(a, b);
#endif
}
__device__ __forceinline__ float add_rn(float a, float b) {
#if defined(ATTN_CUDA_EMU)
  return a + b;
#else
  return __fadd_rn(a, b);
#endif
}

// The block's dynamic shared memory (sized by the launch).
template <class T>
__device__ __forceinline__ T* dynamic_smem() {
#if defined(ATTN_CUDA_EMU)
  return reinterpret_cast<T*>(cuda_emu::g_smem);
#else
  extern __shared__ float4 attn_dynamic_smem[];
  return reinterpret_cast<T*>(attn_dynamic_smem);
#endif
}

// cp.async (sm_80+): kBytes (4, 8 or 16) from global `src` to shared `dst` without passing through
// registers, the first src_bytes read and the rest zero-filled (src_bytes 0: a zero row, src any
// valid address); both addresses aligned to kBytes. Copies are grouped by cp_async_commit and
// waited for by cp_async_wait<n> (all groups but the newest n have landed - for this thread's
// copies only: a __syncthreads after it makes the block's visible). 16-byte copies bypass L1 (.cg).
template <int kBytes>
__device__ __forceinline__ void cp_async(void* dst, const void* src, int src_bytes) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
#if defined(ATTN_CUDA_EMU)
  current().cp_async(dst, src, kBytes, src_bytes);
#else
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(d), "l"(src), "n"(kBytes), "r"(src_bytes)
                 : "memory");
  }
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(ATTN_CUDA_EMU)
  current().cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if defined(ATTN_CUDA_EMU)
  current().cp_async_wait(kPending);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

#if !defined(ATTN_CUDA_EMU)
// Above 48 KiB of dynamic shared memory a kernel must opt in (cudaFuncSetAttribute). Done once
// per kernel and size, not per launch: the call costs microseconds of host time, which back-to-back
// launches would otherwise put between kernels. A refusal surfaces at the launch (cudaGetLastError).
inline void opt_in_smem(const void* kernel, size_t bytes) {
  static std::mutex mutex;
  static std::unordered_map<const void*, size_t> granted;
  std::lock_guard<std::mutex> lock(mutex);
  size_t& have = granted[kernel];
  if (bytes <= have) return;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) == cudaSuccess) {
    have = bytes;
  }
}
#endif

// kernel<<<grid, block, smem, stream>>>(args...), or its emulation.
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                   void* stream, Args... args) {
#if defined(ATTN_CUDA_EMU)
  (void)stream;
  cuda_emu::emulate_launch(grid, block, smem_bytes, [&] { kernel(args...); });
#else
  if (smem_bytes > 48 * 1024) opt_in_smem(reinterpret_cast<const void*>(kernel), smem_bytes);
  kernel<<<grid, block, smem_bytes, static_cast<cudaStream_t>(stream)>>>(args...);
#endif
}

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Score s of key j modified by mod (score_mod.hpp's rule: softcap's tanh, then ALiBi), out of line:
// inlined into every unrolled score of every tile shape and dtype, the flash kernels' fat binary grew
// by 3.1 MB (flash.cu 9.1 -> 12.2 MB), past the GPU bundle's 60 MiB. A call only where the scores are
// modified (DeviceArgs::modifies_scores).
__device__ __noinline__ inline float modified_score(const ScoreMod& mod, float s, int64_t j) { return mod(s, j); }

// A row's finish (online_softmax::finish: O's factor and the natural-log LSE) from its max m and sum l in
// units U, with the head's sink logit (in U; -inf: none). The sink's branch out of line: inlined into
// every row of every tile shape it took 1.4 MB of flash.cu's fat binary; without a sink the finish is
// the two inlined rules it always was.
template <online_softmax::Units U, class T>
__device__ __noinline__ online_softmax::Finish finish_with_sink(bool empty, float m, T l, float sink) {
  return online_softmax::finish<U>(empty, m, l, sink);
}
template <online_softmax::Units U, class T>
__device__ __forceinline__ online_softmax::Finish row_finish(bool empty, float m, T l, float sink) {
  if (sink != -INFINITY) return finish_with_sink<U>(empty, m, l, sink);
  return {static_cast<float>(online_softmax::out_scale(empty, l)), online_softmax::out_lse<U>(empty, m, l)};
}

}  // namespace attnlab::ATTN_CUDA_NS
