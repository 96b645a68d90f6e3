// The avx512_bf16 object's table (src/cpu/dispatch/target.hpp: Bf16Table): flash_bf16, flash_amx and the
// vdpbf16ps and TDPBF16PS throughput loops `attnlab peak` times for them. Compiled only into
// that object (CMakeLists.txt), with x86-64-v4 + AVX512_BF16 + AMX-BF16.
#include <cstdint>

#include "cpu/simd/isa/amx.hpp"
#include "cpu/simd/isa/avx512_bf16.hpp"
#include "cpu/dispatch/target.hpp"

static_assert(attnlab::ATTN_TARGET_NS::simd::kPairsBuilt && attnlab::ATTN_TARGET_NS::simd::kAmxBuilt &&
                  attnlab::ATTN_TARGET_NS::simd::kAmxInt8Built,
              "src/cpu/dispatch/target_bf16.cpp belongs to the avx512_bf16 object (-mavx512bf16 -mamx-tile -mamx-bf16 "
              "-mamx-int8)");

namespace attnlab::ATTN_TARGET_NS {

namespace cpu {
const Kernel& flash_bf16();
const Kernel& flash_amx();
const Kernel& flash_int8_amx();
}  // namespace cpu

namespace {

// The loops are the floor's (avx512_bf16.hpp, amx.hpp); 16 chains for vdpbf16ps as for the FMA.
constexpr int kDotChains = 16;

// Values the compiler cannot see (see target.cpp); 2^-10 products keep the sums finite and
// normal for any run length the calibration picks.
volatile float g_dot_start = 1.0f, g_dot_x = 0.03125f;

float dot_chains(int64_t iters) { return simd::bf16_dot_chains<kDotChains>(iters, g_dot_start, g_dot_x); }
template <bool Int8>
float amx_tile_rounds(int64_t iters) {
  return simd::amx_tile_rounds<Int8>(iters, g_dot_x);
}

}  // namespace

const Bf16Table& bf16_table() {
  static const Bf16Table t{&cpu::flash_bf16(), &cpu::flash_amx(),   &cpu::flash_int8_amx(), kDotChains,
                           dot_chains,         simd::kAmxPeakTiles, amx_tile_rounds<false>, amx_tile_rounds<true>};
  return t;
}

}  // namespace attnlab::ATTN_TARGET_NS
