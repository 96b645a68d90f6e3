// A quantized KV cache as the tile engine's element type: Quant<T> stands for one byte of a
// cache row of layout T (include/attnlab/kv_quant.hpp), so a K/V view of Quant<T> has row
// strides in bytes and row(b, h, j) points at row j's first byte. The engine reads every stored
// row through the functions below, for any element type E (float, bf16, f16 or Quant<T>):
//   load_at(row, c)               values [c, c + kLanes) of a row, widened to float32
//   load_partial_at(row, c, n)    values [c, c + n), `fill` in the other lanes
//   value_at(row, i)              value i
//   row_bytes<E>(d)               bytes of a stored row of d values (prefetching, gathering)
// For Quant<T> the values are read in registers by the rule of kv_read.hpp, so the scores and
// P.V run straight on the quantized bytes: no float32 copy of the cache is written or read.
// AVX2 and AVX-512 decode kLanes values with a few vector instructions (q8_0: a sign-extending
// load, a conversion and the block's scale; q4_0: the block's 16 bytes, a shift selecting the
// low or high nibbles, minus 8; u8/u4: minus the zero point, times the scale; fp8 through
// binary16's vcvtph2ps); other targets call value() per lane. Same values as kv_read::row.
// fp8's per-tensor scale is not part of a row: the engine takes a cache whose scale is 1 (what
// the lab writes) and refuses another (tiles.cpp).
#pragma once

#ifndef ATTN_TARGET_NS
#error "src/cpu/simd/ is per-target code: include it only from ATTN_TARGET_SOURCES (src/cpu/target.hpp)"
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attnlab/kv_quant.hpp"
#include "attnlab/kv_read.hpp"
#include "cpu/simd/vec_math.hpp"

namespace attnlab::ATTN_TARGET_NS::simd {

template <KvDType T>
struct Quant {
  static constexpr KvDType type = T;
  std::byte raw;
};
template <class E>
inline constexpr bool kIsQuant = false;
template <KvDType T>
inline constexpr bool kIsQuant<Quant<T>> = true;

// A u8 / u4 row's codes alone, as numbers (its 8-byte scale and zero point skipped: a row of
// Codes<T> starts 8 bytes into the Quant<T> row): decode_i8's P.V, where each key's scale rides
// on P and the zero points' share comes off once per row (int8_dot.hpp, fold_row_scales).
template <KvDType T>
struct Codes {
  static constexpr KvDType type = T;
  std::byte raw;
};
template <class E>
inline constexpr bool kIsCodes = false;
template <KvDType T>
inline constexpr bool kIsCodes<Codes<T>> = true;

// Bits a stored value takes, its row's scales aside (what a vector load of kLanes values reads).
template <class E>
inline constexpr int kValueBits = 8 * static_cast<int>(sizeof(E));
template <KvDType T>
inline constexpr int kValueBits<Codes<T>> = T == KvDType::U8 ? 8 : 4;
template <KvDType T>
inline constexpr int kValueBits<Quant<T>> = T == KvDType::Q4_0 || T == KvDType::U4 ? 4 : 8;

template <class E>
inline int64_t row_bytes(int64_t d) {
  if constexpr (kIsCodes<E>) {
    return E::type == KvDType::U8 ? d : (d + 1) / 2;
  } else if constexpr (kIsQuant<E>) {
    return kv_row_bytes(E::type, d);
  } else {
    return d * static_cast<int64_t>(sizeof(E));
  }
}

template <class E>
inline float value_at(const E* row, int64_t i) {
  if constexpr (kIsCodes<E>) {
    const auto* u = reinterpret_cast<const uint8_t*>(row);
    return static_cast<float>(E::type == KvDType::U8 ? u[i] : i % 2 ? u[i / 2] >> 4 : u[i / 2] & 0x0f);
  } else if constexpr (kIsQuant<E>) {
    return kv_read::value(E::type, reinterpret_cast<const std::byte*>(row), i, 1.0f);
  } else {
    return to_float(row[i]);
  }
}

namespace kv_detail {

// Lanes [0, n) by the one-value rule, `fill` in the others.
template <class E>
inline Batch lanes_of(const E* row, int64_t c, int n, float fill) {
  alignas(64) float lanes[kLanes];
  for (int i = 0; i < kLanes; ++i) lanes[i] = i < n ? value_at(row, c + i) : fill;
  return Batch::load_aligned(lanes);
}

inline float load_f32(const std::byte* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint16_t load_u16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

#if defined(__AVX512F__)
using IntReg = __m512i;
// kLanes (16) bytes at p, zero- or sign-extended to 32-bit lanes.
inline IntReg u8_lanes(const std::byte* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline IntReg i8_lanes(const std::byte* p) {
  return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// kLanes / 2 (8) bytes at p, each byte's low nibble then its high one (u4's order).
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
// kLanes fp8 bytes at p as 16-bit lanes; read as binary16 (E5M2: the byte is the word's top
// half; E4M3: sign, then exponent and mantissa 1 bit lower, i.e. the value times 2^-8) and
// widened to float32; E4M3's NaN code (S.1111.111) made NaN by hand.
inline __m256i fp8_words(const std::byte* p) {
  return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline Batch e5m2_floats(__m256i w) { return _mm512_cvtph_ps(_mm256_slli_epi16(w, 8)); }
inline Batch e4m3_floats_times_2e8(__m256i w) {
  return _mm512_cvtph_ps(_mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8),
                                         _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7)));
}
inline Batch nan_where_7f(__m256i w, Batch x) {
  const __m256i m7 = _mm256_and_si256(w, _mm256_set1_epi16(0x7f));
  const __mmask16 nan = _mm256_cmpeq_epi16_mask(m7, _mm256_set1_epi16(0x7f));
  const __m512 q = _mm512_or_ps(_mm512_and_ps(x, _mm512_castsi512_ps(_mm512_set1_epi32(INT32_MIN))),
                                _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
  return _mm512_mask_blend_ps(nan, x, q);
}
#define ATTN_KV_VECTOR 1
#elif defined(__AVX2__)
using IntReg = __m256i;
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
inline __m128i fp8_words(const std::byte* p) {
  return _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline Batch e5m2_floats(__m128i w) { return _mm256_cvtph_ps(_mm_slli_epi16(w, 8)); }
inline Batch e4m3_floats_times_2e8(__m128i w) {
  return _mm256_cvtph_ps(_mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8),
                                      _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), 7)));
}
inline Batch nan_where_7f(__m128i w, Batch x) {
  const __m128i m7 = _mm_and_si128(w, _mm_set1_epi16(0x7f));
  const __m256 nan = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm_cmpeq_epi16(m7, _mm_set1_epi16(0x7f))));
  const __m256 q = _mm256_or_ps(_mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN))),
                                _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
  return _mm256_blendv_ps(x, q, nan);
}
#define ATTN_KV_VECTOR 1
#endif

}  // namespace kv_detail

template <class E>
inline Batch load_at(const E* row, int64_t c) {
  if constexpr (kIsCodes<E>) {
#if defined(ATTN_KV_VECTOR)
    using namespace kv_detail;
    const auto* r = reinterpret_cast<const std::byte*>(row);
    if constexpr (E::type == KvDType::U8) {
      return to_floats(u8_lanes(r + c));
    } else {
      return to_floats(nibble_pair_lanes(r + c / 2));
    }
#else
    return kv_detail::lanes_of(row, c, kLanes, 0.f);
#endif
  } else if constexpr (!kIsQuant<E>) {
    return load_unaligned(row + c);
  } else {
#if defined(ATTN_KV_VECTOR)
    using namespace kv_detail;
    constexpr KvDType T = E::type;
    const auto* r = reinterpret_cast<const std::byte*>(row);
    static_assert(32 % kLanes == 0, "a vector never straddles a 32-value block");
    if constexpr (T == KvDType::Q8_0) {
      const std::byte* blk = r + c / 32 * 34;
      return f16_scale(load_u16(blk)) * to_floats(i8_lanes(blk + 2 + c % 32));
    } else if constexpr (T == KvDType::Q4_0) {
      const std::byte* blk = r + c / 32 * 18;
      const IntReg nib = and_(srl(u8_lanes(blk + 2 + c % 16), c % 32 < 16 ? 0 : 4), 0x0f);
      return (to_floats(nib) - Batch(8.f)) * f16_scale(load_u16(blk));
    } else if constexpr (T == KvDType::U8) {
      return (to_floats(u8_lanes(r + 8 + c)) - Batch(load_f32(r + 4))) * Batch(load_f32(r));
    } else if constexpr (T == KvDType::U4) {
      return (to_floats(nibble_pair_lanes(r + 8 + c / 2)) - Batch(load_f32(r + 4))) * Batch(load_f32(r));
    } else if constexpr (T == KvDType::Fp8E5M2) {
      return e5m2_floats(fp8_words(r + c));
    } else {
      static_assert(T == KvDType::Fp8E4M3);
      const auto w = fp8_words(r + c);
      return nan_where_7f(w, e4m3_floats_times_2e8(w) * Batch(256.f));
    }
#else
    return kv_detail::lanes_of(row, c, kLanes, 0.f);
#endif
  }
}

template <class E>
inline Batch load_partial_at(const E* row, int64_t c, int n, float fill = 0.f) {
  if constexpr (!kIsQuant<E> && !kIsCodes<E>) {
    return load_partial(row + c, n, fill);
  } else {
    if (n == kLanes) return load_at(row, c);
    return kv_detail::lanes_of(row, c, n, fill);
  }
}

// A whole row through load_at / load_partial_at (the test probe of src/cpu/target.hpp).
template <KvDType T>
inline void read_row_as(const std::byte* row, int64_t d, float* out) {
  const auto* r = reinterpret_cast<const Quant<T>*>(row);
  alignas(64) float lanes[kLanes];
  for (int64_t c = 0; c < d; c += kLanes) {
    const int n = static_cast<int>(d - c < kLanes ? d - c : kLanes);
    (n == kLanes ? load_at(r, c) : load_partial_at(r, c, n)).store_aligned(lanes);
    std::memcpy(out + c, lanes, sizeof(float) * static_cast<size_t>(n));
  }
}
inline void read_kv_row(KvDType t, const std::byte* row, int64_t d, float* out) {
  switch (t) {
    case KvDType::Q8_0: return read_row_as<KvDType::Q8_0>(row, d, out);
    case KvDType::Q4_0: return read_row_as<KvDType::Q4_0>(row, d, out);
    case KvDType::U8: return read_row_as<KvDType::U8>(row, d, out);
    case KvDType::U4: return read_row_as<KvDType::U4>(row, d, out);
    case KvDType::Fp8E4M3: return read_row_as<KvDType::Fp8E4M3>(row, d, out);
    case KvDType::Fp8E5M2: return read_row_as<KvDType::Fp8E5M2>(row, d, out);
    case KvDType::Same: return;
  }
}

}  // namespace attnlab::ATTN_TARGET_NS::simd
