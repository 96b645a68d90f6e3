// The avx512_bf16 object's table (src/cpu/target.hpp: Bf16Table): flash_bf16 and the
// vdpbf16ps throughput loop `attnlab peak` times for it. Compiled only into that object
// (CMakeLists.txt), with x86-64-v4 + AVX512_BF16.
#include <immintrin.h>

#include "cpu/target.hpp"

#if !defined(__AVX512BF16__)
#error "src/cpu/target_bf16.cpp belongs to the avx512_bf16 object (-mavx512bf16)"
#endif

namespace attnlab::ATTN_TARGET_NS {

namespace cpu {
const Kernel& flash_bf16();
}  // namespace cpu

namespace {

// vdpbf16ps has the FMA's latency class (~5-6 cycles) and up to 2 per cycle: 16 chains with
// 32 registers keep both pipes busy without spills (as the float32 loop, src/cpu/target.cpp).
constexpr int kDotChains = 16;

// Values the compiler cannot see (see target.cpp); 2^-10 products keep the sums finite and
// normal for any run length the calibration picks.
volatile float g_dot_start = 1.0f, g_dot_x = 0.03125f;

__attribute__((noinline)) float dot_chains(int64_t iters) {
  __m512 acc[kDotChains];
  const float start = g_dot_start;
  for (int j = 0; j < kDotChains; ++j) acc[j] = _mm512_set1_ps(start + 0.001f * static_cast<float>(j));
  const __m512 x = _mm512_set1_ps(g_dot_x);
  const __m512bh a = _mm512_cvtne2ps_pbh(x, x);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int j = 0; j < kDotChains; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, a);
  }
  __m512 s = acc[0];
  for (int j = 1; j < kDotChains; ++j) s = _mm512_add_ps(s, acc[j]);
  alignas(64) float lanes[16];  // not _mm512_reduce_add_ps: gcc 12 warns inside it (-Wuninitialized)
  _mm512_store_ps(lanes, s);
  float sum = 0;
  for (float v : lanes) sum += v;
  return sum;
}

}  // namespace

const Bf16Table& bf16_table() {
  static const Bf16Table t{&cpu::flash_bf16(), kDotChains, dot_chains};
  return t;
}

}  // namespace attnlab::ATTN_TARGET_NS
