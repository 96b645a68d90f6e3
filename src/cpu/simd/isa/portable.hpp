// xsimd-only forms of floor primitives, for vector targets without a faster spelling of their own
// (avx2 takes the exponent steps and transpose_sum from here, neon nearly everything). Each target
// header brings in the ones it uses with `using portable::name;`. Part of the floor (isa.hpp).
#pragma once

#include <cstdint>

#include "cpu/simd/isa/xsimd_lanes.hpp"

namespace attnlab::ATTN_TARGET_NS::simd::portable {

// p * 2^n for the lanes where x is not below `lo` (NaN counts as "not below"), +0 in the others:
// 2^n applied as two factors 2^(n/2) so the exponent field never overflows for |n| up to 254 and
// p * 2^128 with p < 1 stays finite; then the underflowing lanes zeroed and NaN restored.
inline Batch scale_or_zero(Batch p, Batch n, Batch x, float lo) {
  using IBatch = xsimd::batch<int32_t>;
  const IBatch ni = xsimd::to_int(xsimd::max(xsimd::min(n, Batch(128.f)), Batch(-126.f)));
  const IBatch half = ni >> 1;
  const Batch a = xsimd::bitwise_cast<Batch>((half + IBatch(127)) << 23);
  const Batch b = xsimd::bitwise_cast<Batch>((ni - half + IBatch(127)) << 23);
  const Batch z = xsimd::select(x < Batch(lo), Batch(0.f), (p * a) * b);
  return xsimd::select(xsimd::isnan(x), x, z);
}
// The same for n in [-127, 0] (exp2_nonpositive): 2^n as one exponent-field factor, ~7
// instructions fewer than the two-factor form; 0 where x < -126, x where x is NaN.
inline Batch scale_nonpositive_or_zero(Batch p, Batch n, Batch x) {
  using IBatch = xsimd::batch<int32_t>;
  const Batch two_n = xsimd::bitwise_cast<Batch>((xsimd::to_int(n) + IBatch(127)) << 23);
  const Batch z = xsimd::select(x < Batch(-126.f), Batch(0.f), p * two_n);
  return xsimd::select(xsimd::isnan(x), x, z);  // (x != x is an ordered compare in xsimd 8.1)
}
// min(x, hi) that keeps NaN.
inline Batch clamp_hi(Batch x, float hi) { return xsimd::select(x > Batch(hi), Batch(hi), x); }

// Lane i = the sum of rows[i] (xsimd's haddp: right on SSE/AVX/NEON, wrong on its AVX-512).
inline Batch transpose_sum(const Batch* rows) { return xsimd::haddp(rows); }

inline float reduce_max(Batch v) {
  alignas(64) float lanes[kLanes];
  v.store_aligned(lanes);
  float m = lanes[0];
  for (int i = 1; i < kLanes; ++i) m = lanes[i] > m ? lanes[i] : m;
  return m;
}
inline Batch load_partial(const float* p, int n, float fill = 0.f) {
  alignas(64) float lanes[kLanes];
  for (int i = 0; i < kLanes; ++i) lanes[i] = i < n ? p[i] : fill;
  return Batch::load_aligned(lanes);
}
inline void store_partial(float* p, Batch v, int n) {
  alignas(64) float lanes[kLanes];
  v.store_aligned(lanes);
  for (int i = 0; i < n; ++i) p[i] = lanes[i];
}

}  // namespace attnlab::ATTN_TARGET_NS::simd::portable
