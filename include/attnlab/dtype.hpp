// Storage dtypes of Q, K and V: float32, bfloat16, IEEE binary16. O and LSE are always
// float32, and every kernel computes in float32 (or wider) on the values widened exactly
// from storage, so a 16-bit run's error is the float32 path's error on rounded inputs.
//
//   bf16: the top 16 bits of a float32 (8-bit exponent, 7-bit mantissa): float32's range,
//         ~3 significant decimal digits (unit roundoff 2^-8).
//   f16:  IEEE binary16 (5-bit exponent, 10-bit mantissa): max 65504, subnormals below
//         2^-14, unit roundoff 2^-11.
// Narrowing (float32 -> 16 bit) rounds to nearest, ties to even; values past the largest
// finite become +-inf; NaN stays NaN (quiet); f16 keeps subnormals. Widening is exact.
// The 16-bit types are plain structs holding the bit pattern, so a View4<const bf16> and
// a View4<const f16> are distinct types and kernels overload on them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

// Always inlined: these are called from the per-target SIMD code too (src/cpu/dispatch/target.hpp),
// where an out-of-line copy compiled for AVX-512 could be the one the linker keeps.
#if defined(__CUDACC__)
#define ATTN_DT_HD __host__ __device__ __forceinline__
#else
#define ATTN_DT_HD inline __attribute__((always_inline))
#endif

namespace attnlab {

enum class DType : uint8_t { F32 = 0, BF16 = 1, F16 = 2 };

const char* to_string(DType dtype);  // "f32", "bf16", "f16"
// Throws InvalidInput naming `field` and the allowed values.
DType parse_dtype(const std::string& text, const char* field = "dtype");
ATTN_DT_HD constexpr int dtype_bytes(DType d) { return d == DType::F32 ? 4 : 2; }  // (CUDA device code too)

struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};
static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2 && std::is_trivially_copyable_v<bf16>);

template <class E>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::F32;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::BF16;
};
template <>
struct dtype_of<f16> {
  static constexpr DType value = DType::F16;
};
template <class E>
inline constexpr DType dtype_of_v = dtype_of<std::remove_const_t<E>>::value;

namespace dtype_detail {
ATTN_DT_HD uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
ATTN_DT_HD float float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
}  // namespace dtype_detail

// Exact widening.
ATTN_DT_HD float to_float(float x) { return x; }
ATTN_DT_HD float to_float(bf16 x) { return dtype_detail::float_of(uint32_t{x.bits} << 16); }
ATTN_DT_HD float to_float(f16 x) {
  const uint32_t sign = uint32_t{x.bits & 0x8000u} << 16;
  const uint32_t exp = (x.bits >> 10) & 0x1fu, mant = x.bits & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float32
    const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return dtype_detail::float_of(dtype_detail::bits_of(mag) | sign);
  }
  const uint32_t e32 = exp == 31 ? 255u : exp + (127 - 15);
  return dtype_detail::float_of(sign | (e32 << 23) | (mant << 13));
}

// Round to nearest even.
ATTN_DT_HD bf16 to_bf16(float f) {
  const uint32_t u = dtype_detail::bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};  // quiet NaN
  return bf16{static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};  // overflow carries to inf
}
ATTN_DT_HD f16 to_f16(float f) {
  uint32_t u = dtype_detail::bits_of(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  uint32_t h;
  if (u >= 0x47800000u) {  // >= 65536 (rounds to inf), inf or NaN
    h = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < 0x38800000u) {  // below 2^-14: subnormal or zero. Adding 0.5 lets the
    // float adder round the value to a multiple of 2^-24 (RNE): the low mantissa bits are it.
    const float r = dtype_detail::float_of(u) + 0.5f;
    h = dtype_detail::bits_of(r) - 0x3f000000u;
  } else {  // normal: rebias, round the 13 dropped bits to nearest even (may carry to inf)
    h = (u + 0xc8000fffu + ((u >> 13) & 1u)) >> 13;  // 0xc8000000 = (15 - 127) << 23
  }
  return f16{static_cast<uint16_t>(h | sign)};
}

// x stored as E (float, bf16 or f16), rounded to nearest even.
template <class E>
ATTN_DT_HD E from_float(float x) {
  if constexpr (std::is_same_v<E, bf16>)
    return to_bf16(x);
  else if constexpr (std::is_same_v<E, f16>)
    return to_f16(x);
  else
    return x;
}

// The value a float32 takes when stored as dtype d.
inline float round_to(DType d, float x) {
  return d == DType::BF16 ? to_float(to_bf16(x)) : d == DType::F16 ? to_float(to_f16(x)) : x;
}

// f(E{}) with E = float, bf16 or f16 by d: where a dtype known at run time picks a template.
template <class F>
decltype(auto) visit_dtype(DType d, F&& f) {
  switch (d) {
    case DType::BF16: return f(bf16{});
    case DType::F16: return f(f16{});
    case DType::F32: break;
  }
  return f(float{});
}

}  // namespace attnlab
