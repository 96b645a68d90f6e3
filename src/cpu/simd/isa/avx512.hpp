// The avx512 target's floor (x86-64-v4: AVX-512 F, BW, DQ, VL, CD): 16 float lanes, 32 vector
// registers, mask registers for partial loads and stores, scalef for 2^n, vpdpbusd (VNNI) by
// inline assembly where the CPU has it. The vocabulary is isa.hpp's; avx2.hpp spells the same
// names for 8 lanes.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attnlab/dtype.hpp"
#include "attnlab/kv_quant.hpp"
#include "cpu/simd/isa/xsimd_lanes.hpp"

namespace attnlab::ATTN_TARGET_NS::simd {

inline constexpr const char* kIsaName = "avx512";
inline constexpr int kVectorRegisters = 32;
inline constexpr bool kCheapScale = true;  // scalef: exp2's 2^n step is one instruction, any n
inline constexpr bool kRegisterTranspose = true;
inline constexpr bool kEvenOddBf16 = true;
inline constexpr bool kKvVector = true;
inline constexpr bool kI8Vector = true;
inline constexpr bool kI8Sdot = false;
// The VNNI unit (the ISA name the CPU must run for vpdpbusd, isa.cpp) and Q/K values per vector step.
inline constexpr const char* kI8Unit = "avx512_vnni";
inline constexpr const char* kI8ScoreUnit = kI8Unit;
inline constexpr int kI8Chunk = 64;

namespace detail {
// p * 2^n for the lanes where x is not below `lo` (NaN counts as "not below"), +0 in the
// others. n is integral; scalef saturates to +inf / 0 itself.
inline Batch scale_or_zero(Batch p, Batch n, Batch x, float lo) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(lo), _CMP_NLT_UQ);
  return _mm512_maskz_scalef_ps(keep, p, n);
}
inline Batch scale_nonpositive_or_zero(Batch p, Batch n, Batch x) { return scale_or_zero(p, n, x, -126.f); }
// min(x, hi) that keeps NaN (vminps returns its second operand when one is NaN).
inline Batch clamp_hi(Batch x, float hi) { return _mm512_min_ps(_mm512_set1_ps(hi), x); }
}  // namespace detail

// Lane i of the result = the sum of rows[i], for 16 rows (about 3 shuffle/add instructions per row).
// Not xsimd::haddp: xsimd 8.1's AVX-512 haddp returns the sums in the wrong lanes (lanes 2,3 and
// 4,5 of each half swapped - measured).
inline Batch transpose_sum(const Batch* rows) {
  // 16 -> 8: within each 128-bit lane, [a0+a2, b0+b2, a1+a3, b1+b3] for rows a, b.
  __m512 s8[8];
  for (int i = 0; i < 8; ++i) {
    const __m512 a = rows[2 * i], b = rows[2 * i + 1];
    s8[i] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  }
  // 8 -> 4: within each 128-bit lane, [a, b, c, d] partial sums of rows 4k..4k+3.
  __m512 s4[4];
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(s8[2 * i]), y = _mm512_castps_pd(s8[2 * i + 1]);
    s4[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // Across 128-bit lanes: 4 -> 2 -> 1.
  const auto fold = [](__m512 x, __m512 y) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
  };
  return fold(fold(s4[0], s4[1]), fold(s4[2], s4[3]));
}

inline float reduce_max(Batch v) { return _mm512_reduce_max_ps(v); }

// Lanes [0, n) from p, `fill` in the others; masked-off lanes are never read.
inline Batch load_partial(const float* p, int n, float fill = 0.f) {
  const __mmask16 m = static_cast<__mmask16>((1u << n) - 1u);
  return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), m, p);
}
inline Batch keep_bits(Batch x, uint32_t bits, float fill) {
  return _mm512_mask_mov_ps(_mm512_set1_ps(fill), static_cast<__mmask16>(bits), x);
}
inline void store_partial(float* p, Batch v, int n) {
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1u), v);
}
// 16 bf16 / f16 values widened exactly (bf16: a 16-bit shift; f16: vcvtph2ps).
inline Batch load_unaligned(const bf16* p) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
inline Batch load_unaligned(const f16* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// Keeps v in a register: GCC otherwise folds a load into every FMA that uses it.
inline void keep_in_register(Batch& v) { asm("" : "+v"(v.data)); }
// y rounded toward zero (|y| < 2^31).
inline Batch trunc_float(Batch y) { return _mm512_cvtepi32_ps(_mm512_cvttps_epi32(y)); }

// In-register transpose of a 16 x 16 float block: r[i] lane j <- r[j] lane i.
// Four stages of 16 shuffles (unpack ps, unpack pd, two 128-bit lane shuffles).
using FloatReg = Batch::register_type;
inline void transpose_block(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // u[4i + c], 128-bit lane L: rows 4i..4i+3 of column 4L + c.
  __m512 u[16];
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 1]), d = _mm512_castps_pd(t[4 * i + 3]);
    u[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
    u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
    u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
  }
  // Column 4L + c = lane L of u[c], u[4+c], u[8+c], u[12+c].
  for (int c = 0; c < 4; ++c) {
    const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);  // lanes 0,1 | 0,1
    const __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);  // lanes 2,3 | 2,3
    const __m512 w0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
    const __m512 w1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_shuffle_f32x4(v0, w0, 0x88);       // lane 0 of each
    r[4 + c] = _mm512_shuffle_f32x4(v0, w0, 0xDD);   // lane 1
    r[8 + c] = _mm512_shuffle_f32x4(v1, w1, 0x88);   // lane 2
    r[12 + c] = _mm512_shuffle_f32x4(v1, w1, 0xDD);  // lane 3
  }
}

// 32 bf16 values at p: the even-indexed ones (a 32-bit shift left by 16) and the odd-indexed
// ones (the high halves, masked) - one ALU op per 16 values instead of a widening shuffle.
inline void load_even_odd(const bf16* p, Batch& even, Batch& odd) {
  const __m512i x = _mm512_loadu_si512(p);
  even = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// The 16 binary16 values at p[c] + off (c < 16; 4 bytes readable there) as float32: two gathers by
// address, not 16 scalar loads stored to memory and loaded back as a vector (a store-forwarding stall):
// decode_i8 at GQA 4 and 8, paired, q4_0 1.05-1.07x, q8_0 1.02x (the AMX Xeon, avx512).
inline Batch f16_at(const std::byte* const* p, int64_t off) {
  const __m512i o = _mm512_set1_epi64(off);
  const __m512i a = _mm512_add_epi64(_mm512_loadu_si512(p), o), b = _mm512_add_epi64(_mm512_loadu_si512(p + 8), o);
  const __m256i lo = _mm512_i64gather_epi32(a, nullptr, 1), hi = _mm512_i64gather_epi32(b, nullptr, 1);
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)));
}
// Per-key values (4 keys per vector x 4 groups = 16, in key order) spread so that vector g holds
// key 4g + k's value in all of 128-bit lane k.
inline Batch spread_keys(Batch v, int g) {
  const __m512i idx =
      _mm512_add_epi32(_mm512_set1_epi32(4 * g),
                       _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 2));
  return _mm512_permutexvar_ps(idx, v);
}
// Per 128-bit lane L: [a, b, c, d] = each vector's lanes 4L .. 4L + 3 reduced (Max: max, else +).
template <bool Max>
inline Batch lane_reduce4(Batch a, Batch b, Batch c, Batch d) {
  const auto op = [](Batch x, Batch y) { return Max ? max(x, y) : x + y; };
  const Batch ab = op(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));  // [a02 b02 a13 b13]
  const Batch cd = op(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512d x = _mm512_castps_pd(ab), y = _mm512_castps_pd(cd);
  return op(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
}
// Lanes 0..3: a, b, c, d reduced whole.
template <bool Max>
inline Batch reduce4(Batch a, Batch b, Batch c, Batch d) {
  const auto op = [](Batch x, Batch y) { return Max ? max(x, y) : x + y; };
  const Batch t = lane_reduce4<Max>(a, b, c, d);
  const Batch u = op(t, _mm512_shuffle_f32x4(t, t, 0x4e));
  return op(u, _mm512_shuffle_f32x4(u, u, 0xb1));
}
// Four vectors of keys' partial sums (vector g: keys 4g .. 4g + 3, one per 128-bit lane) -> the
// 16 keys' sums in key order.
inline Batch group_sums(const Batch a[4]) {
  return _mm512_permutexvar_ps(_mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0),
                               lane_reduce4<false>(a[0], a[1], a[2], a[3]));
}

// A quantized cache's codes unpacked to 32-bit lanes (kv_load.hpp's load_at).
namespace kv_detail {
using IntReg = __m512i;
using Fp8Words = __m256i;
// 16 bytes at p, zero- or sign-extended to 32-bit lanes.
inline IntReg u8_lanes(const std::byte* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline IntReg i8_lanes(const std::byte* p) {
  return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// 8 bytes at p, each byte's low nibble then its high one (u4's order).
inline IntReg nibble_pair_lanes(const std::byte* p) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m512i w = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
  return _mm512_and_si512(_mm512_srlv_epi32(w, _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0)),
                          _mm512_set1_epi32(0x0f));
}
inline Batch to_floats(IntReg x) { return _mm512_cvtepi32_ps(x); }
inline IntReg srl(IntReg x, int n) { return _mm512_srl_epi32(x, _mm_cvtsi32_si128(n)); }
inline IntReg and_(IntReg x, int m) { return _mm512_and_si512(x, _mm512_set1_epi32(m)); }
// A broadcast binary16 value as float32.
inline Batch f16_scale(uint16_t bits) { return _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(bits))); }
// 16 fp8 bytes at p as 16-bit lanes; read as binary16 and widened to float32. E5M2: the byte is the
// word's top half. E4M3: the sign at bit 15 and the 7-bit magnitude one bit lower than the byte's
// (a shift up, an arithmetic shift down, a mask: the value times 2^-8), times 2^8 in float32; its NaN
// code (S.1111.111, which reads 480) made NaN with its sign by one masked ternary-logic op.
inline Fp8Words fp8_words(const std::byte* p) {
  return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline Batch e5m2_floats(Fp8Words w) { return _mm512_cvtph_ps(_mm256_slli_epi16(w, 8)); }
// The value times 2^-8 for every code but the NaN code (S.1111.111, which reads +-1.875 here): a tile
// without one (e4m3_nan_code_in) reads its values by this alone, its scores and P taking the 2^8
// (tiles.cpp: kReadScale).
inline Batch e4m3_floats_scaled(Fp8Words w) {
  return _mm512_cvtph_ps(
      _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(w, 8), 1), _mm256_set1_epi16(static_cast<short>(0xbfff))));
}
inline Batch e4m3_floats(Fp8Words w) {
  const __m512 x = _mm512_mul_ps(e4m3_floats_scaled(w), _mm512_set1_ps(256.f));
  const __m256i m7 = _mm256_set1_epi16(0x7f);
  const __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(w, m7), m7);
  // (x & sign) | quiet NaN where nan: imm 0xea = (A & B) | C
  return _mm512_castsi512_ps(_mm512_mask_ternarylogic_epi32(_mm512_castps_si512(x), nan, _mm512_set1_epi32(INT32_MIN),
                                                            _mm512_set1_epi32(0x7fc00000), 0xea));
}
// Whether one of the n bytes at p is E4M3's NaN code (0x7f or 0xff): the largest byte | 0x80 is 0xff.
inline bool e4m3_nan_code_in(const std::byte* p, int64_t n) {
  const __m512i top = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i m = top;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) m = _mm512_max_epu8(m, _mm512_or_si512(_mm512_loadu_si512(p + i), top));
  if (i < n) m = _mm512_max_epu8(m, _mm512_or_si512(_mm512_maskz_loadu_epi8(~0ull >> (64 - (n - i)), p + i), top));
  return _mm512_cmpeq_epi8_mask(m, _mm512_set1_epi8(-1)) != 0;
}
}  // namespace kv_detail

// The integer vocabulary of int8_dot.hpp (decode_i8, flash_int8).
namespace i8_detail {
using IVec = __m512i;
inline IVec bytes80() { return _mm512_set1_epi8(static_cast<char>(0x80)); }
// acc + the sums of four u8 x s8 products per 32-bit lane. vpdpbusd as inline assembly (EVEX): the
// target's flags lack VNNI, and only a CPU that has it runs this (Tiling::i8_vnni). Without VNNI:
// vpmaddubsw (pairs into int16, saturating - exact here: u <= 128, |s| <= 127) and vpmaddwd by 1.
template <bool Vnni>
inline IVec dot4(IVec acc, IVec u, IVec s) {
  if constexpr (Vnni) {
    asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
  } else {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
  }
}
inline IVec abs8(IVec x) { return _mm512_abs_epi8(x); }
// s where c >= 0, -s where c < 0 (c = 0: |c| = 0 makes the product 0 whatever s is).
inline IVec sign8(IVec s, IVec c) { return _mm512_mask_sub_epi8(s, _mm512_movepi8_mask(c), _mm512_setzero_si512(), s); }
inline Batch to_float(IVec x) { return _mm512_cvtepi32_ps(x); }
inline IVec load_ivec(const void* p) { return _mm512_load_si512(p); }
inline void store_ivec(void* p, IVec x) { _mm512_store_si512(p, x); }
inline IVec izero() { return _mm512_setzero_si512(); }
inline IVec bcast32(int32_t x) { return _mm512_set1_epi32(x); }
// The low 8 int32 lanes of lo, the high 8 of hi.
inline IVec halves(IVec lo, IVec hi) { return _mm512_mask_blend_epi32(0xff00, lo, hi); }
inline __mmask64 first_bytes(int64_t n) { return n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1; }

// K slices (score_rows_i8): 4 keys per vector, one per 128-bit lane.
inline constexpr int kSliceKeys = 4;
inline __m128i slice_bytes(const std::byte* p, int64_t n) {  // 16 bytes at p, zero past n
  return n >= 16 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))
                 : _mm_maskz_loadu_epi8(static_cast<__mmask16>(n <= 0 ? 0 : (1u << n) - 1), p);
}
// The 16 bytes at p[k] + off of each key k in its lane k (n: the bytes there are).
inline IVec slice_of(const std::byte* const* p, int64_t off, int64_t n) {
  __m512i v = _mm512_broadcast_i32x4(slice_bytes(p[0] + off, n));
  v = _mm512_mask_broadcast_i32x4(v, 0x00f0, slice_bytes(p[1] + off, n));
  v = _mm512_mask_broadcast_i32x4(v, 0x0f00, slice_bytes(p[2] + off, n));
  return _mm512_mask_broadcast_i32x4(v, 0xf000, slice_bytes(p[3] + off, n));
}
inline IVec bcast_slice(const int8_t* q) {
  return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(q)));
}
inline IVec lane0_of_each_key(int32_t x) { return _mm512_maskz_set1_epi32(0x1111, x); }
inline IVec xor80(IVec x) { return _mm512_xor_si512(x, bytes80()); }
inline IVec nibbles_lo(IVec x) { return _mm512_and_si512(x, _mm512_set1_epi8(0x0f)); }
inline IVec nibbles_hi(IVec x) { return _mm512_and_si512(_mm512_srli_epi16(x, 4), _mm512_set1_epi8(0x0f)); }
// Four vectors of keys' int32 partial sums -> the 16 keys' sums in key order.
inline IVec group_sums(const IVec a[4]) {
  const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a[0], a[1]), _mm512_unpackhi_epi32(a[0], a[1]));
  const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2], a[3]), _mm512_unpackhi_epi32(a[2], a[3]));
  const __m512i t =
      _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));  // lane 4L+g: key 4g+L
  return _mm512_permutexvar_epi32(_mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0), t);
}

// kLanes P weights rounded half to even (MXCSR) to integer codes, stored as 16 bytes at out
// (signed: int8; else uint8, the codes in [0, 255]); returns the codes as floats.
template <bool Signed>
inline Batch round_to_codes(Batch y, uint8_t* out) {
  const __m512i c = _mm512_cvtps_epi32(y);
  _mm_store_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(c));
  return _mm512_cvtepi32_ps(c);
}

// Integer P.V (pv_tile_i8): rows per pass - 4 x 4 accumulators, the 4 rows' codes and their unpacks.
inline constexpr int kPvRows = 4;
// V row r's codes for columns [c0, c0 + 64) in column order, zero past the row (rem: its columns
// from c0 on): u8 as c - 128 (vpdpbusd's signed operand), u4 and q4_0 as nibbles 0..15, q8_0 as stored.
template <KvDType T>
inline IVec v_codes(const std::byte* r, int64_t c0, int64_t rem) {
  if constexpr (T == KvDType::U8) {
    const std::byte* p = r + 8 + c0;
    const IVec u = rem >= 64 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(first_bytes(rem), p);
    return _mm512_xor_si512(u, bytes80());
  } else if constexpr (T == KvDType::U4) {
    const std::byte* p = r + 8 + c0 / 2;
    const int64_t n = (rem + 1) / 2;
    const __m256i y = n >= 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                              : _mm256_maskz_loadu_epi8(static_cast<__mmask32>(first_bytes(n)), p);
    // byte 2i: byte i's low nibble, byte 2i + 1 its high one: (z | z << 4) & 0x0f0f per word
    const IVec z = _mm512_cvtepu8_epi16(y);
    return _mm512_ternarylogic_epi32(z, _mm512_slli_epi16(z, 4), _mm512_set1_epi16(0x0f0f), 0xa8);
  } else if constexpr (T == KvDType::Q8_0) {
    const std::byte* b0 = r + c0 / 32 * 34;
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 2));
    const __m256i hi =
        rem > 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 36)) : _mm256_setzero_si256();
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  } else {
    static_assert(T == KvDType::Q4_0);
    // A block's 16 bytes hold values 0..15 (low nibbles) and 16..31 (high): lanes [B0, B0, B1, B1],
    // the odd lanes shifted by 4, then the nibbles.
    const std::byte* b0 = r + c0 / 32 * 18;
    const __m128i x0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 2));
    const __m128i x1 = rem > 32 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 20)) : _mm_setzero_si128();
    IVec z =
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_broadcastsi128_si256(x0)), _mm256_broadcastsi128_si256(x1), 1);
    z = _mm512_mask_srli_epi16(z, 0xff00ff00u, z, 4);
    return _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
  }
}
// Bytes [64 t, 64 t + 64) of key row r's codes as stored, zero past them (prep_k_words): u8 and u4
// the row's bytes past its scale and zero point, q8_0 and q4_0 the d / 32 blocks' code bytes back to back.
template <KvDType T>
inline IVec key_bytes(const std::byte* r, int64_t t, int64_t d) {
  if constexpr (T == KvDType::U8 || T == KvDType::U4) {
    const int64_t n = (T == KvDType::U8 ? d : (d + 1) / 2) - 64 * t;
    return _mm512_maskz_loadu_epi8(n <= 0 ? 0 : first_bytes(n), r + 8 + 64 * t);
  } else {
    constexpr int kBytes = T == KvDType::Q8_0 ? 32 : 16, kStride = kBytes + 2, kPer = 64 / kBytes;
    const int64_t nb = d / 32;
    IVec z = _mm512_setzero_si512();
    for (int i = 0; i < kPer; ++i) {
      const int64_t b = kPer * t + i;
      if (b >= nb) break;
      const std::byte* p = r + b * kStride + 2;
      if constexpr (kBytes == 32) {
        const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        z = i ? _mm512_inserti64x4(z, y, 1) : _mm512_inserti64x4(z, y, 0);
      } else {
        z = _mm512_mask_broadcast_i32x4(z, static_cast<__mmask16>(0xf << (4 * i)),
                                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      }
    }
    return z;
  }
}
// x[i] word j <- x[j] word i (transpose_block on the integer bits).
inline void transpose_words(IVec x[16]) {
  __m512 f[16];
  for (int i = 0; i < 16; ++i) f[i] = _mm512_castsi512_ps(x[i]);
  transpose_block(f);
  for (int i = 0; i < 16; ++i) x[i] = _mm512_castps_si512(f[i]);
}
inline IVec lo8(IVec a, IVec b) { return _mm512_unpacklo_epi8(a, b); }
inline IVec hi8(IVec a, IVec b) { return _mm512_unpackhi_epi8(a, b); }
inline IVec lo16(IVec a, IVec b) { return _mm512_unpacklo_epi16(a, b); }
inline IVec hi16(IVec a, IVec b) { return _mm512_unpackhi_epi16(a, b); }
// x[k] lane 4L + c holds column 16L + 4k + c: out[n] = columns 16n .. 16n + 15 (128-bit lane n of each x[k]).
inline void column_order(const IVec x[4], IVec out[4]) {
  const IVec t0 = _mm512_shuffle_i32x4(x[0], x[1], 0x44), t1 = _mm512_shuffle_i32x4(x[2], x[3], 0x44);
  const IVec t2 = _mm512_shuffle_i32x4(x[0], x[1], 0xee), t3 = _mm512_shuffle_i32x4(x[2], x[3], 0xee);
  out[0] = _mm512_shuffle_i32x4(t0, t1, 0x88), out[1] = _mm512_shuffle_i32x4(t0, t1, 0xdd);
  out[2] = _mm512_shuffle_i32x4(t2, t3, 0x88), out[3] = _mm512_shuffle_i32x4(t2, t3, 0xdd);
}
}  // namespace i8_detail

// NEON's sdot path: not on this target (absent.hpp's declaration, never called: kI8Sdot).
namespace i8_detail {
template <KvDType T>
int32_t sdot_codes(const int8_t* q, int32_t qsum, const uint8_t* u, int64_t d, int64_t b);
}

}  // namespace attnlab::ATTN_TARGET_NS::simd
