// The avx2 target's floor (x86-64-v3: AVX2, FMA, F16C): 8 float lanes, 16 vector registers, no
// mask registers (partial loads by vmaskmovps, byte tails through a zeroed buffer), AVX-VNNI's
// VEX vpdpbusd by inline assembly where the CPU has it. The vocabulary is isa.hpp's; avx512.hpp
// spells the same names for 16 lanes.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attnlab/dtype.hpp"
#include "attnlab/kv_quant.hpp"
#include "cpu/simd/isa/portable.hpp"
#include "cpu/simd/isa/xsimd_lanes.hpp"

namespace attnlab::ATTN_TARGET_NS::simd {

inline constexpr const char* kIsaName = "avx2";
inline constexpr int kVectorRegisters = 16;
inline constexpr bool kCheapScale = false;  // 2^n by exponent-field arithmetic (portable.hpp)
inline constexpr bool kRegisterTranspose = true;
inline constexpr bool kEvenOddBf16 = true;
inline constexpr bool kKvVector = true;
inline constexpr bool kI8Vector = true;
inline constexpr bool kI8Sdot = false;
inline constexpr const char* kI8Unit = "avx_vnni";
inline constexpr const char* kI8ScoreUnit = kI8Unit;
inline constexpr int kI8Chunk = 32;

namespace detail {
using portable::clamp_hi;
using portable::scale_nonpositive_or_zero;
using portable::scale_or_zero;
}  // namespace detail
using portable::transpose_sum;

// Three shuffle + max steps (a store and 7 scalar compares were ~3x slower).
inline float reduce_max(Batch v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

inline Batch load_partial(const float* p, int n, float fill = 0.f) {
  // Whole vectors by a plain load: a masked load (vmaskmovps) in a stream of loads from
  // memory stalls it (measured on Zen 3: K packing from DRAM 3.4 vs 9 GB/s).
  if (n == kLanes) return Batch::load_unaligned(p);
  // vmaskmovps: masked-off lanes are never read (no fault past p + n).
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
  return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
}
inline Batch keep_bits(Batch x, uint32_t bits, float fill) {
  const __m256i lane = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i on = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(bits)), lane), lane);
  return _mm256_blendv_ps(_mm256_set1_ps(fill), x, _mm256_castsi256_ps(on));
}
inline void store_partial(float* p, Batch v, int n) {
  const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  _mm256_maskstore_ps(p, m, v);
}
inline Batch load_unaligned(const bf16* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline Batch load_unaligned(const f16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void keep_in_register(Batch& v) { asm("" : "+x"(v.data)); }
inline Batch trunc_float(Batch y) { return _mm256_cvtepi32_ps(_mm256_cvttps_epi32(y)); }

// In-register transpose of an 8 x 8 float block: r[i] lane j <- r[j] lane i.
using FloatReg = Batch::register_type;
inline void transpose_block(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);      // a0 b0 a1 b1 | a4 b4 a5 b5
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);  // a2 b2 a3 b3 | a6 b6 a7 b7
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));      // col 0 | 4
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));      // col 1 | 5
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));  // 2 | 6
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));  // 3 | 7
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    r[c + 4] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}

inline void load_even_odd(const bf16* p, Batch& even, Batch& odd) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

// avx512.hpp's f16_at: the 8 binary16 values at p[c] + off as float32, by two gathers.
inline Batch f16_at(const std::byte* const* p, int64_t off) {
  const __m256i o = _mm256_set1_epi64x(off);
  const __m256i a = _mm256_add_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), o);
  const __m256i b = _mm256_add_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 4)), o);
  const __m128i lo = _mm256_i64gather_epi32(static_cast<const int*>(nullptr), a, 1);
  const __m128i hi = _mm256_i64gather_epi32(static_cast<const int*>(nullptr), b, 1);
  const __m128i m = _mm_set1_epi32(0xffff);
  return _mm256_cvtph_ps(_mm_packus_epi32(_mm_and_si128(lo, m), _mm_and_si128(hi, m)));
}
// 8 keys' values in key order; vector g holds key 2g + k's value in all of 128-bit lane k.
inline Batch spread_keys(Batch v, int g) {
  return _mm256_permutevar8x32_ps(
      v, _mm256_setr_epi32(2 * g, 2 * g, 2 * g, 2 * g, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1));
}
template <bool Max>
inline Batch lane_reduce4(Batch a, Batch b, Batch c, Batch d) {
  const auto op = [](Batch x, Batch y) { return Max ? max(x, y) : x + y; };
  const Batch ab = op(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
  const Batch cd = op(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
  const __m256d x = _mm256_castps_pd(ab), y = _mm256_castps_pd(cd);
  return op(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)), _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
}
template <bool Max>
inline Batch reduce4(Batch a, Batch b, Batch c, Batch d) {
  const Batch t = lane_reduce4<Max>(a, b, c, d);
  const Batch u = _mm256_permute2f128_ps(t, t, 0x01);
  return Max ? max(t, u) : t + u;
}
inline Batch group_sums(const Batch a[4]) {
  return _mm256_permutevar8x32_ps(lane_reduce4<false>(a[0], a[1], a[2], a[3]),
                                  _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

namespace kv_detail {
using IntReg = __m256i;
using Fp8Words = __m128i;
inline IntReg u8_lanes(const std::byte* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline IntReg i8_lanes(const std::byte* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline IntReg nibble_pair_lanes(const std::byte* p) {
  int32_t four;
  std::memcpy(&four, p, 4);
  const __m128i b = _mm_cvtsi32_si128(four);
  const __m256i w = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
  return _mm256_and_si256(_mm256_srlv_epi32(w, _mm256_set_epi32(4, 0, 4, 0, 4, 0, 4, 0)), _mm256_set1_epi32(0x0f));
}
inline Batch to_floats(IntReg x) { return _mm256_cvtepi32_ps(x); }
inline IntReg srl(IntReg x, int n) { return _mm256_srl_epi32(x, _mm_cvtsi32_si128(n)); }
inline IntReg and_(IntReg x, int m) { return _mm256_and_si256(x, _mm256_set1_epi32(m)); }
inline Batch f16_scale(uint16_t bits) { return _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(bits))); }
inline Fp8Words fp8_words(const std::byte* p) {
  return _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline Batch e5m2_floats(Fp8Words w) { return _mm256_cvtph_ps(_mm_slli_epi16(w, 8)); }
inline Batch e4m3_floats_scaled(Fp8Words w) {  // avx512.hpp's: the value times 2^-8
  return _mm256_cvtph_ps(
      _mm_and_si128(_mm_srai_epi16(_mm_slli_epi16(w, 8), 1), _mm_set1_epi16(static_cast<short>(0xbfff))));
}
// E4M3 as avx512.hpp's e4m3_floats: the byte's bits moved into binary16 (the value times 2^-8), times
// 2^8; the NaN code made NaN with its sign by a blend.
inline Batch e4m3_floats(Fp8Words w) {
  const __m256 x = _mm256_mul_ps(e4m3_floats_scaled(w), _mm256_set1_ps(256.f));
  const __m128i m7 = _mm_set1_epi16(0x7f);
  const __m256 nan = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm_cmpeq_epi16(_mm_and_si128(w, m7), m7)));
  const __m256 q = _mm256_or_ps(_mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN))),
                                _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
  return _mm256_blendv_ps(x, q, nan);
}
inline bool e4m3_nan_code_in(const std::byte* p, int64_t n) {  // avx512.hpp's
  const __m256i top = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256i m = top;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    m = _mm256_max_epu8(m, _mm256_or_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)), top));
  bool found = _mm256_movemask_epi8(_mm256_cmpeq_epi8(m, _mm256_set1_epi8(-1))) != 0;
  for (; i < n; ++i) found = found || (static_cast<uint8_t>(p[i]) | 0x80) == 0xff;
  return found;
}
}  // namespace kv_detail

namespace i8_detail {
using IVec = __m256i;
inline IVec bytes80() { return _mm256_set1_epi8(static_cast<char>(0x80)); }
// As the AVX-512 dot4: AVX-VNNI's VEX-encoded vpdpbusd on ymm ({vex}: the EVEX form needs
// AVX512-VNNI), else vpmaddubsw + vpmaddwd.
template <bool Vnni>
inline IVec dot4(IVec acc, IVec u, IVec s) {
  if constexpr (Vnni) {
    asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));  // %{ %}: braces, not asm dialects
    return acc;
  } else {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
  }
}
inline IVec abs8(IVec x) { return _mm256_abs_epi8(x); }
inline IVec sign8(IVec s, IVec c) { return _mm256_sign_epi8(s, c); }
inline Batch to_float(IVec x) { return _mm256_cvtepi32_ps(x); }
inline IVec load_ivec(const void* p) { return _mm256_load_si256(static_cast<const __m256i*>(p)); }
inline void store_ivec(void* p, IVec x) { _mm256_store_si256(static_cast<__m256i*>(p), x); }
inline IVec izero() { return _mm256_setzero_si256(); }
inline IVec bcast32(int32_t x) { return _mm256_set1_epi32(x); }
inline IVec halves(IVec lo, IVec hi) { return _mm256_blend_epi32(lo, hi, 0xf0); }
// n < full bytes at p, zero padded (AVX2 has no byte-masked load).
inline void copy_bytes(const std::byte* p, int64_t n, std::byte* out, int64_t full) {
  std::memset(out, 0, static_cast<size_t>(full));
  std::memcpy(out, p, static_cast<size_t>(n));
}

inline constexpr int kSliceKeys = 2;
inline __m128i slice_bytes(const std::byte* p, int64_t n) {
  if (n >= 16) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  alignas(16) std::byte buf[16] = {};
  if (n > 0) std::memcpy(buf, p, static_cast<size_t>(n));
  return _mm_load_si128(reinterpret_cast<const __m128i*>(buf));
}
inline IVec slice_of(const std::byte* const* p, int64_t off, int64_t n) {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(slice_bytes(p[0] + off, n)), slice_bytes(p[1] + off, n), 1);
}
inline IVec bcast_slice(const int8_t* q) {
  return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(q)));
}
inline IVec lane0_of_each_key(int32_t x) { return _mm256_setr_epi32(x, 0, 0, 0, x, 0, 0, 0); }
inline IVec xor80(IVec x) { return _mm256_xor_si256(x, bytes80()); }
inline IVec nibbles_lo(IVec x) { return _mm256_and_si256(x, _mm256_set1_epi8(0x0f)); }
inline IVec nibbles_hi(IVec x) { return _mm256_and_si256(_mm256_srli_epi16(x, 4), _mm256_set1_epi8(0x0f)); }
inline IVec group_sums(const IVec a[4]) {
  const __m256i ab = _mm256_add_epi32(_mm256_unpacklo_epi32(a[0], a[1]), _mm256_unpackhi_epi32(a[0], a[1]));
  const __m256i cd = _mm256_add_epi32(_mm256_unpacklo_epi32(a[2], a[3]), _mm256_unpackhi_epi32(a[2], a[3]));
  const __m256i t =
      _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));  // lane 4L+g: key 2g+L
  return _mm256_permutevar8x32_epi32(t, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// 8 P weights rounded half to even (MXCSR) to codes, stored as 8 bytes at out (saturating packs:
// signed int8, else uint8); returns the codes as floats.
template <bool Signed>
inline Batch round_to_codes(Batch y, uint8_t* out) {
  const __m256i c = _mm256_cvtps_epi32(y);
  const __m128i c16 = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), Signed ? _mm_packs_epi16(c16, c16) : _mm_packus_epi16(c16, c16));
  return _mm256_cvtepi32_ps(c);
}

inline constexpr int kPvRows = 2;  // 16 registers: 2 x 4 accumulators, the 4 rows' codes and their unpacks
template <KvDType T>
inline IVec v_codes(const std::byte* r, int64_t c0, int64_t rem) {
  if constexpr (T == KvDType::U8) {
    const std::byte* p = r + 8 + c0;
    IVec u;
    if (rem >= 32) {
      u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    } else {
      alignas(32) std::byte buf[32];
      copy_bytes(p, rem, buf, 32);
      u = _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
    }
    return _mm256_xor_si256(u, bytes80());
  } else if constexpr (T == KvDType::U4) {
    const std::byte* p = r + 8 + c0 / 2;
    const int64_t n = (rem + 1) / 2;
    __m128i x;
    if (n >= 16) {
      x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    } else {
      alignas(16) std::byte buf[16];
      copy_bytes(p, n, buf, 16);
      x = _mm_load_si128(reinterpret_cast<const __m128i*>(buf));
    }
    const IVec z = _mm256_cvtepu8_epi16(x);
    return _mm256_and_si256(_mm256_or_si256(z, _mm256_slli_epi16(z, 4)), _mm256_set1_epi16(0x0f0f));
  } else if constexpr (T == KvDType::Q8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + c0 / 32 * 34 + 2));
  } else {
    static_assert(T == KvDType::Q4_0);
    const IVec z = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + c0 / 32 * 18 + 2)));
    return _mm256_and_si256(_mm256_blend_epi32(z, _mm256_srli_epi16(z, 4), 0xf0), _mm256_set1_epi8(0x0f));
  }
}
// avx512.hpp's key_bytes over 32 bytes: [32 t, 32 t + 32) of key row r's codes as stored.
template <KvDType T>
inline IVec key_bytes(const std::byte* r, int64_t t, int64_t d) {
  if constexpr (T == KvDType::U8 || T == KvDType::U4) {
    const int64_t n = (T == KvDType::U8 ? d : (d + 1) / 2) - 32 * t;
    const std::byte* p = r + 8 + 32 * t;
    if (n >= 32) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    alignas(32) std::byte buf[32];
    copy_bytes(p, n > 0 ? n : 0, buf, 32);
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
  } else if constexpr (T == KvDType::Q8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + t * 34 + 2));  // block t (t < d / 32)
  } else {
    static_assert(T == KvDType::Q4_0);
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 2 * t * 18 + 2));
    const __m128i hi = 2 * t + 1 < d / 32 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + (2 * t + 1) * 18 + 2))
                                          : _mm_setzero_si128();
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
  }
}
// x[i] word j <- x[j] word i (transpose_block on the integer bits).
inline void transpose_words(IVec x[8]) {
  __m256 f[8];
  for (int i = 0; i < 8; ++i) f[i] = _mm256_castsi256_ps(x[i]);
  transpose_block(f);
  for (int i = 0; i < 8; ++i) x[i] = _mm256_castps_si256(f[i]);
}
inline IVec lo8(IVec a, IVec b) { return _mm256_unpacklo_epi8(a, b); }
inline IVec hi8(IVec a, IVec b) { return _mm256_unpackhi_epi8(a, b); }
inline IVec lo16(IVec a, IVec b) { return _mm256_unpacklo_epi16(a, b); }
inline IVec hi16(IVec a, IVec b) { return _mm256_unpackhi_epi16(a, b); }
// x[k] lane 4L + c holds column 16L + 4k + c: out[n] = columns 8n .. 8n + 7.
inline void column_order(const IVec x[4], IVec out[4]) {
  out[0] = _mm256_permute2x128_si256(x[0], x[1], 0x20), out[1] = _mm256_permute2x128_si256(x[2], x[3], 0x20);
  out[2] = _mm256_permute2x128_si256(x[0], x[1], 0x31), out[3] = _mm256_permute2x128_si256(x[2], x[3], 0x31);
}

// NEON's sdot path: not on this target (never called: kI8Sdot).
template <KvDType T>
int32_t sdot_codes(const int8_t* q, int32_t qsum, const uint8_t* u, int64_t d, int64_t b);
}  // namespace i8_detail

}  // namespace attnlab::ATTN_TARGET_NS::simd
