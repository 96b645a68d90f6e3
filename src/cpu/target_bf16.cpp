// The avx512_bf16 object's table (src/cpu/target.hpp: Bf16Table): flash_bf16, flash_amx and the
// vdpbf16ps and TDPBF16PS throughput loops `attnlab peak` times for them. Compiled only into
// that object (CMakeLists.txt), with x86-64-v4 + AVX512_BF16 + AMX-BF16.
#include <immintrin.h>

#include <bit>
#include <cstdint>
#include <type_traits>

#include "cpu/simd/isa/amx.hpp"
#include "cpu/target.hpp"

#if !defined(__AVX512BF16__) || !defined(ATTN_HAVE_AMX) || !defined(ATTN_HAVE_AMX_INT8)
#error "src/cpu/target_bf16.cpp belongs to the avx512_bf16 object (-mavx512bf16 -mamx-tile -mamx-bf16 -mamx-int8)"
#endif

namespace attnlab::ATTN_TARGET_NS {

namespace cpu {
const Kernel& flash_bf16();
const Kernel& flash_amx();
const Kernel& flash_int8_amx();
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

// Four accumulator tiles, each TDPBF16PS independent of the last three, so the loop measures the
// tile unit's throughput, not its latency (here ~1-1.6 TFLOP/s per core, results/2026-12-01-precision).
constexpr int kAmxTiles = 4;

// Int8: the same rounds with TDPBSSD on bytes of 1 (flash_int8_amx's scores). One 16 x 64-byte
// operand tile either way: bf16 pairs of g_dot_x, or int8 ones.
template <bool Int8>
__attribute__((noinline)) float amx_tile_rounds(int64_t iters) {
  using Elem = std::conditional_t<Int8, int8_t, uint16_t>;
  alignas(64) Elem a[64 / sizeof(Elem) * 16];
  alignas(64) uint32_t out[16 * 16];
  const auto x = Int8 ? Elem{1} : static_cast<Elem>(std::bit_cast<uint32_t>(static_cast<float>(g_dot_x)) >> 16);
  for (Elem& e : a) e = x;
  simd::amx_configure();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  ATTN_TILE_LOAD(4, a, 64);
  ATTN_TILE_LOAD(5, a, 64);
  ATTN_TILE_LOAD(6, a, 64);
  ATTN_TILE_LOAD(7, a, 64);
  for (int64_t it = 0; it < iters; ++it) {
    if constexpr (Int8) {
      _tile_dpbssd(0, 4, 5);
      _tile_dpbssd(1, 4, 6);
      _tile_dpbssd(2, 4, 7);
      _tile_dpbssd(3, 5, 6);
    } else {
      _tile_dpbf16ps(0, 4, 5);
      _tile_dpbf16ps(1, 4, 6);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 5, 6);
    }
  }
  _tile_stored(0, out, 64);
  simd::amx_release();
  return static_cast<float>(out[0]);  // (a value the compiler must compute; its type does not matter)
}

}  // namespace

const Bf16Table& bf16_table() {
  static const Bf16Table t{&cpu::flash_bf16(), &cpu::flash_amx(), &cpu::flash_int8_amx(), kDotChains,
                           dot_chains,         kAmxTiles,         amx_tile_rounds<false>, amx_tile_rounds<true>};
  return t;
}

}  // namespace attnlab::ATTN_TARGET_NS
