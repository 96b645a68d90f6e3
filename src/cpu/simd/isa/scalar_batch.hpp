// The `scalar` target's Batch: one float, with the subset of xsimd::batch<float>'s interface
// the kernels use (src/cpu/simd/vec_math.hpp; the floor's scalar.hpp), in plain arithmetic. The target is compiled
// without vectorization (-fno-tree-vectorize), so it measures one float per instruction -
// the baseline the vector targets' speed-ups are quoted against.
// fma is a * b + c: the x86-64 baseline has no FMA instruction (a libm fmaf call per
// element would measure the library, not the CPU); on aarch64 the compiler may fuse it.
#pragma once

#include <cstddef>

namespace attnlab::ATTN_TARGET_NS::simd {

struct ScalarBatch {
  using batch_bool_type = bool;
  static constexpr std::size_t size = 1;
  float v;

  ScalarBatch() = default;
  ScalarBatch(float x) : v(x) {}  // NOLINT: implicit, as xsimd's broadcast is used
  static ScalarBatch load_aligned(const float* p) { return {*p}; }
  static ScalarBatch load_unaligned(const float* p) { return {*p}; }
  void store_aligned(float* p) const { *p = v; }
  void store_unaligned(float* p) const { *p = v; }

  ScalarBatch& operator+=(ScalarBatch o) {
    v += o.v;
    return *this;
  }
  ScalarBatch& operator-=(ScalarBatch o) {
    v -= o.v;
    return *this;
  }
  ScalarBatch& operator*=(ScalarBatch o) {
    v *= o.v;
    return *this;
  }
  friend ScalarBatch operator-(ScalarBatch a) { return {-a.v}; }
  friend ScalarBatch operator+(ScalarBatch a, ScalarBatch b) { return {a.v + b.v}; }
  friend ScalarBatch operator-(ScalarBatch a, ScalarBatch b) { return {a.v - b.v}; }
  friend ScalarBatch operator*(ScalarBatch a, ScalarBatch b) { return {a.v * b.v}; }
  friend ScalarBatch operator/(ScalarBatch a, ScalarBatch b) { return {a.v / b.v}; }
  friend bool operator<(ScalarBatch a, ScalarBatch b) { return a.v < b.v; }
  friend bool operator>(ScalarBatch a, ScalarBatch b) { return a.v > b.v; }
  friend bool operator<=(ScalarBatch a, ScalarBatch b) { return a.v <= b.v; }
  friend bool operator>=(ScalarBatch a, ScalarBatch b) { return a.v >= b.v; }
  friend bool operator!=(ScalarBatch a, ScalarBatch b) { return a.v != b.v; }
  friend bool operator==(ScalarBatch a, ScalarBatch b) { return a.v == b.v; }
};

inline ScalarBatch fma(ScalarBatch a, ScalarBatch b, ScalarBatch c) { return {a.v * b.v + c.v}; }
inline ScalarBatch fnma(ScalarBatch a, ScalarBatch b, ScalarBatch c) { return {c.v - a.v * b.v}; }
// As the vector instructions: the second operand when either is NaN (vmaxps semantics).
inline ScalarBatch max(ScalarBatch a, ScalarBatch b) { return {a.v > b.v ? a.v : b.v}; }
inline ScalarBatch min(ScalarBatch a, ScalarBatch b) { return {a.v < b.v ? a.v : b.v}; }
inline ScalarBatch select(bool m, ScalarBatch a, ScalarBatch b) { return m ? a : b; }
inline bool mask_and(bool a, bool b) { return a && b; }
inline bool mask_or(bool a, bool b) { return a || b; }
// Round to nearest even for |x| < 2^22 (adding 1.5 * 2^23 drops the fraction in the default
// rounding mode); callers clamp x <= 129 and discard results below -126, so larger |x| only
// reach lanes whose result is thrown away. NaN stays NaN.
inline ScalarBatch nearbyint(ScalarBatch x) {
  constexpr float kMagic = 12582912.f;  // 1.5 * 2^23
  return {(x.v + kMagic) - kMagic};     // not folded to x: no -ffast-math here
}

}  // namespace attnlab::ATTN_TARGET_NS::simd
