// The neon target's floor (AArch64 Advanced SIMD): 4 float lanes, 32 vector registers; the
// exponent steps, reductions and partial loads by the portable xsimd forms (portable.hpp), the
// 16-bit widening and bit selects by NEON intrinsics, and sdot (FEAT_DotProd) for decode_i8's
// integer K.Q where the CPU has it. No x86 vector vocabulary (absent.hpp). The vocabulary is isa.hpp's.
#pragma once

#include <arm_neon.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attnlab/dtype.hpp"
#include "attnlab/kv_quant.hpp"
#include "cpu/simd/isa/portable.hpp"
#include "cpu/simd/isa/xsimd_lanes.hpp"

namespace attnlab::ATTN_TARGET_NS::simd {

inline constexpr const char* kIsaName = "neon";
inline constexpr int kVectorRegisters = 32;
inline constexpr bool kCheapScale = false;
inline constexpr bool kRegisterTranspose = false;
inline constexpr bool kEvenOddBf16 = false;
inline constexpr bool kKvVector = false;
inline constexpr bool kI8Vector = false;
inline constexpr bool kI8Sdot = true;
inline constexpr const char* kI8Unit = "";  // no vpdpbusd path
inline constexpr const char* kI8ScoreUnit = "neon_dotprod";
inline constexpr int kI8Chunk = 64;

namespace detail {
using portable::clamp_hi;
using portable::scale_nonpositive_or_zero;
using portable::scale_or_zero;
}  // namespace detail
using portable::load_partial;
using portable::reduce_max;
using portable::store_partial;
using portable::transpose_sum;

inline Batch keep_bits(Batch x, uint32_t bits, float fill) {
  const uint32x4_t lane = {1u, 2u, 4u, 8u};
  return vbslq_f32(vtstq_u32(vdupq_n_u32(bits), lane), x, vdupq_n_f32(fill));
}
inline Batch load_unaligned(const bf16* p) {
  return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p)), 16));
}
inline Batch load_unaligned(const f16* p) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p))));
}
inline void keep_in_register(Batch&) {}

namespace i8_detail {
// acc + the sums of four s8 x s8 products per 32-bit lane (sdot, FEAT_DotProd). The target's flags
// are the AArch64 baseline: the functions that issue it carry the extension (ATTN_I8_SDOT) and run
// only where the CPU has it (Tiling::i8_vnni: i8_dot_unit_runs, tiles.cpp).
#define ATTN_I8_SDOT __attribute__((target("arch=armv8.2-a+dotprod")))  // arm_neon.h's vdotq_s32 target
ATTN_I8_SDOT inline int32x4_t sdot(int32x4_t acc, int8x16_t a, int8x16_t b) { return vdotq_s32(acc, a, b); }
// 16 bytes at p of which n (1..16) belong to the row: the rest read as zeros, never past the row.
inline uint8x16_t bytes16(const uint8_t* p, int64_t n) {
  if (n >= 16) return vld1q_u8(p);
  alignas(16) uint8_t b[16] = {};
  std::memcpy(b, p, static_cast<size_t>(n));
  return vld1q_u8(b);
}
// One key's integer dot products with one Q row (q: its codes in natural order, qsum: their sum,
// u: the key's row), block b for the block types, the whole row for u8 / u4 (int8_dot.hpp's
// score_from_dots combines them by the rule's own code).
template <KvDType T>
ATTN_I8_SDOT int32_t sdot_codes(const int8_t* q, int32_t qsum, const uint8_t* u, int64_t d, int64_t b) {
  int32x4_t acc = vdupq_n_s32(0);
  if constexpr (T == KvDType::U8) {  // c - 128 as s8 (one eor), 128 sum q added back
    for (int64_t i = 0; i < d; i += 16)
      acc = sdot(acc, vreinterpretq_s8_u8(veorq_u8(bytes16(u + 8 + i, d - i), vdupq_n_u8(0x80))), vld1q_s8(q + i));
    // the padding lanes read 0 ^ 0x80 = -128 against Q's zero padding: nothing
    return vaddvq_s32(acc) + 128 * qsum;
  } else if constexpr (T == KvDType::U4) {  // 16 bytes = 32 values: lows are the even ones
    for (int64_t i = 0; i < d; i += 32) {
      const uint8x16_t a = bytes16(u + 8 + i / 2, (d - i + 1) / 2);
      const uint8x16_t lo = vandq_u8(a, vdupq_n_u8(0x0f)), hi = vshrq_n_u8(a, 4);
      acc = sdot(acc, vreinterpretq_s8_u8(vzip1q_u8(lo, hi)), vld1q_s8(q + i));
      acc = sdot(acc, vreinterpretq_s8_u8(vzip2q_u8(lo, hi)), vld1q_s8(q + i + 16));
    }
    return vaddvq_s32(acc);
  } else if constexpr (T == KvDType::Q8_0) {
    const uint8_t* c = u + b * 34 + 2;
    acc = sdot(acc, vreinterpretq_s8_u8(vld1q_u8(c)), vld1q_s8(q + 32 * b));
    acc = sdot(acc, vreinterpretq_s8_u8(vld1q_u8(c + 16)), vld1q_s8(q + 32 * b + 16));
    return vaddvq_s32(acc);
  } else {  // q4_0: lows are values 0..15, highs 16..31, each minus 8
    const uint8x16_t a = vld1q_u8(u + b * 18 + 2);
    const int8x16_t eight = vdupq_n_s8(8);
    acc = sdot(acc, vsubq_s8(vreinterpretq_s8_u8(vandq_u8(a, vdupq_n_u8(0x0f))), eight), vld1q_s8(q + 32 * b));
    acc = sdot(acc, vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(a, 4)), eight), vld1q_s8(q + 32 * b + 16));
    return vaddvq_s32(acc);
  }
}
}  // namespace i8_detail

}  // namespace attnlab::ATTN_TARGET_NS::simd

#include "cpu/simd/isa/absent.hpp"
