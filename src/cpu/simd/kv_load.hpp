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
// Where the floor has the code unpacking (kKvVector: AVX2, AVX-512), kLanes values decode with a few vector
// instructions (q8_0: a sign-extending load, a conversion and the block's scale; q4_0: the block's 16 bytes, a shift
// selecting the low or high nibbles, minus 8; u8/u4: minus the zero point, times the scale; fp8 through binary16's
// vcvtph2ps); other targets call value() per lane. Same values as kv_read::row. fp8's per-tensor scale is not part of a
// row: the engine takes a cache whose scale is 1 (what the lab writes) and refuses another (tiles.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attnlab/kv_quant.hpp"
#include "attnlab/blocks/kv_read.hpp"
#include "cpu/simd/vec_math.hpp"

namespace attnlab::ATTN_TARGET_NS::simd {

// Finite: rows known to hold no NaN code (fp8_e4m3 only: the tile engine scans a tile's rows,
// tiles.cpp's e4m3_finite), read without the NaN code's test and without E4M3's 2^8 (kReadScale).
template <KvDType T, bool Finite = false>
struct Quant {
  static constexpr KvDType type = T;
  static constexpr bool kFinite = Finite;
  std::byte raw;
};
template <class E>
inline constexpr bool kIsQuant = false;
template <KvDType T, bool F>
inline constexpr bool kIsQuant<Quant<T, F>> = true;
// What every value read from rows of E carries: 1, or 2^-8 for Quant<Fp8E4M3, true> (binary16 holds
// E4M3's magnitudes 2^8 lower; the scores and P take the 2^8 back, once per tile). A power of two, so
// the products are the unscaled ones bit for bit, bar subnormal ones.
template <class E>
inline constexpr float kReadScale = 1.f;
template <>
inline constexpr float kReadScale<Quant<KvDType::Fp8E4M3, true>> = 0x1p-8f;

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
template <KvDType T, bool F>
inline constexpr int kValueBits<Quant<T, F>> = T == KvDType::Q4_0 || T == KvDType::U4 ? 4 : 8;

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
    return kv_read::value(E::type, reinterpret_cast<const std::byte*>(row), i, 1.0f) * kReadScale<E>;
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

}  // namespace kv_detail

template <class E>
inline Batch load_at(const E* row, int64_t c) {
  if constexpr ((kIsCodes<E> || kIsQuant<E>)&&!kKvVector) {
    return kv_detail::lanes_of(row, c, kLanes, 0.f);
  } else if constexpr (kIsCodes<E>) {
    using namespace kv_detail;
    const auto* r = reinterpret_cast<const std::byte*>(row);
    if constexpr (E::type == KvDType::U8) {
      return to_floats(u8_lanes(r + c));
    } else {
      return to_floats(nibble_pair_lanes(r + c / 2));
    }
  } else if constexpr (!kIsQuant<E>) {
    return load_unaligned(row + c);
  } else {
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
      if constexpr (E::kFinite) return e4m3_floats_scaled(fp8_words(r + c));
      return e4m3_floats(fp8_words(r + c));
    }
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

// A whole row through load_at / load_partial_at (the test probe of src/cpu/dispatch/target.hpp).
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
