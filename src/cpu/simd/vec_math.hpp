// Vector building blocks shared by the SIMD kernels (simd, threaded, flash, decode).
//
// Per-target code (src/cpu/dispatch/target.hpp): compiled once per instruction-set target.
// Exports (namespace attnlab::<target>::simd) - keep this list small and stable:
//   Batch, kLanes                   xsimd::batch<float> on the target's arch (16 lanes avx512,
//                                   8 avx2, 4 neon), or the 1-lane ScalarBatch (scalar)
//   kVectorRegisters                32 (AVX-512, AArch64) or 16: what register tiles are sized for
//   fma, fnma, max, min, select, nearbyint   element-wise, for either Batch type
//   mask_and, mask_or               combine comparison results (lane masks, or bool for scalar)
//   kLog2e, kLn2                    float constants for folding log2(e) into a scale
//   exp2(Batch)                     2^x           (what the kernels use, log2(e) folded
//                                                  into the score scale)
//   exp2_nonpositive(Batch)         2^x for x <= 0 or NaN: exp2's values, cheaper on AVX2
//   exp(Batch)                      e^x           (Cody-Waite reduction, accurate)
//   tanh(Batch)                     tanh x        (softcap's: score_mod.hpp)
//   lane_index(v)                   v * kLanes + lane, as floats
//   modify_score_row(...)           softcap and ALiBi on a row of scores in log2 units
//   reduce_sum(Batch), reduce_max(Batch)          horizontal reductions
//   transpose_sum(const Batch rows[kLanes])       lane i = reduce_sum(rows[i])
//   rescale_log2(m_old, m_new)      online_softmax's rescale rule, kLanes rows at once
//   scale_row(acc, scale, d, o)     o = acc * scale, d floats: a finished output row
//   keep_bits(x, bits, fill)       lane j of x where bit j of bits is set, else fill
//   load_partial(p, n[, fill]), store_partial(p, v, n)
//                                   lanes [0, n) only, n in [0, kLanes]; never touch
//                                   memory past p + n (masked loads/stores on AVX-512)
//   load_unaligned(p), load_partial(p, n) for p of float, bf16 or f16 (include/attnlab/
//                                   dtype.hpp): kLanes values widened exactly to float32
//                                   (bf16: a 16-bit shift; f16: vcvtph2ps (F16C) on x86,
//                                   fcvtl on AArch64, dtype.hpp's conversion for scalar)
//
// exp2 / exp: range reduction x = n + f (exp2: f = x - round(x), exact; exp: n =
// round(x*log2e), r = x - n*ln2 in two FMA steps with a hi/lo split of ln2), a
// degree-6 polynomial for 2^f resp. e^r (Cephes exp2f/expf coefficients), and 2^n applied
// with _mm512_scalef_ps (no integer exponent arithmetic, no overflow of the exponent
// field). Special values, as the softmax needs them:
//   -inf and every input whose result is below FLT_MIN (exp2: x < -126, exp: x < -87.336)
//   return exactly +0 - results are flushed instead of going denormal, so a P*V FMA never
//   sees a denormal operand;  +inf and overflow return +inf;  NaN returns NaN.
// Measured accuracy against double std::exp2 / std::exp, over EVERY float of the range
// (1.1e9 points each; ulp = distance in representable floats; tests/kernels/test_simd_math.cpp
// re-checks these bounds on every 61st float):
//   exp2 on [-126, 0]:      max 1 ulp, max rel. error 8.0e-8  (softmax range, log2e folded)
//   exp2 on [0, 128):       max 1 ulp
//   exp  on [-87.336, 0]:   max 1 ulp, max rel. error 8.4e-8
//   exp  on [0, 88.72]:     max 1 ulp, max rel. error 8.5e-8
// (xsimd 8.1's own xsimd::exp: 2 ulp by the same measure, and +inf from 88.38 on.)
// Cost: exp2 is 11 vector instructions (min, cmp, roundscale, sub, 6 FMA, scalef);
// exp is 15 (a multiply and two FMA for the reduction, r*r and the final add).
// The per-target steps (the lanes, 2^n, reductions, partial loads, widening) are the
// instruction-set floor's (src/cpu/simd/isa/); this file is the one algorithm over them.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "attnlab/dtype.hpp"
#include "cpu/simd/isa/isa.hpp"

namespace attnlab::ATTN_TARGET_NS::simd {

inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2 = 0.693147180559945309f;

namespace detail {

// 2^f for f in [-0.5, 0.5] (Cephes exp2f, relative error 1.7e-7 over the interval).
inline Batch exp2_poly(Batch f) {
  Batch p(1.535336188319500e-4f);
  p = simd::fma(p, f, Batch(1.339887440266574e-3f));
  p = simd::fma(p, f, Batch(9.618437357674640e-3f));
  p = simd::fma(p, f, Batch(5.550332471162809e-2f));
  p = simd::fma(p, f, Batch(2.402264791363012e-1f));
  p = simd::fma(p, f, Batch(6.931472028550421e-1f));
  return simd::fma(p, f, Batch(1.0f));
}

// e^r for r in [-ln2/2, ln2/2] (Cephes expf: 1 + r + r^2 * P(r)).
inline Batch exp_poly(Batch r) {
  Batch p(1.9875691500e-4f);
  p = simd::fma(p, r, Batch(1.3981999507e-3f));
  p = simd::fma(p, r, Batch(8.3334519073e-3f));
  p = simd::fma(p, r, Batch(4.1665795894e-2f));
  p = simd::fma(p, r, Batch(1.6666665459e-1f));
  p = simd::fma(p, r, Batch(5.0000001201e-1f));
  const Batch r2 = r * r;
  return simd::fma(p, r2, r) + Batch(1.0f);
}

}  // namespace detail

// 2^x. See the header comment for accuracy and special values.
inline Batch exp2(Batch x) {
  const Batch xc = detail::clamp_hi(x, 129.f);  // +inf -> 129 -> 2^129 = +inf
  const Batch n = simd::nearbyint(xc);
  const Batch p = detail::exp2_poly(xc - n);
  return detail::scale_or_zero(p, n, x, -126.f);
}

// 2^x for x <= 0 or NaN - what the softmax feeds it (s - max, m_old - m_new): the same
// values, bit for bit, as exp2 on that domain (tests/kernels/test_simd_math.cpp), with 2^n applied
// as one exponent-field factor (n in [-126, 0] once the underflowing lanes are zeroed)
// instead of the portable two-factor form, ~7 instructions fewer on AVX2. Positive x is
// outside the contract (where 2^n is cheap anyway - kCheapScale: AVX-512's scalef, scalar - exp2).
inline Batch exp2_nonpositive(Batch x) {
  if constexpr (kCheapScale) return exp2(x);
  const Batch xc = simd::max(Batch(-127.f), x);  // keeps the integer conversion in range
  const Batch n = simd::nearbyint(xc);
  return detail::scale_nonpositive_or_zero(detail::exp2_poly(xc - n), n, x);
}

// e^x. See the header comment for accuracy and special values.
inline Batch exp(Batch x) {
  constexpr float kLn2Hi = 0.693359375f;     // 9 significant bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;  // ln2 - kLn2Hi
  constexpr float kMinLog = -87.3365447f;    // ln(FLT_MIN)
  const Batch xc = detail::clamp_hi(x, 89.5f);
  const Batch n = simd::nearbyint(xc * Batch(kLog2e));
  Batch r = simd::fnma(n, Batch(kLn2Hi), xc);
  r = simd::fnma(n, Batch(kLn2Lo), r);
  return detail::scale_or_zero(detail::exp_poly(r), n, x, kMinLog);
}

// tanh x, Cephes tanhf's split: |x| < 0.625 an odd polynomial x + x^3 P(x^2) (no cancellation near 0,
// where 1 - 2 / (e^2x + 1) would lose the low bits), else sign(x) (1 - 2 / (e^2|x| + 1)) with exp
// above (e^2|x| = inf past 44: exactly +-1). +-inf give +-1, NaN gives NaN. Measured against double
// std::tanh on every 61st float (tests/kernels/test_simd_math.cpp): at most 3 ulp.
inline Batch tanh(Batch x) {
  const Batch a = simd::max(x, -x);
  const Batch z = x * x;
  Batch p(-5.70498872745e-3f);
  p = simd::fma(p, z, Batch(2.06390887954e-2f));
  p = simd::fma(p, z, Batch(-5.37397155531e-2f));
  p = simd::fma(p, z, Batch(1.33314422036e-1f));
  p = simd::fma(p, z, Batch(-3.33332819422e-1f));
  const Batch small = simd::fma(p * z, x, x);
  const Batch big = Batch(1.f) - Batch(2.f) / (exp(a + a) + Batch(1.f));
  return simd::select(a < Batch(0.625f), small, simd::select(x < Batch(0.f), -big, big));
}

// Lane index of each value in vector v of a row, as floats (exact below 2^24).
inline Batch lane_index(int v) {
  alignas(64) static const float kIota[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  static_assert(kLanes <= 16, "kIota covers 16 lanes");
  return Batch::load_aligned(kIota) + Batch(static_cast<float>(v * kLanes));
}

// The score modifications (include/attnlab/blocks/score_mod.hpp) of one row's scores in vectors
// [va, vb) of s (64-byte aligned) in log2 units, in place: cap2 = c log2 e > 0 gives cap2 tanh(x / cap2)
// (= c tanh(s / c) log2 e), then slope2 = m_h log2 e != 0 adds slope2 (j - diagonal), lane 0 of vector 0
// being key j0 (j0_minus_diag = j0 - the row's diagonal).
inline void modify_score_row(float* s, int va, int vb, float cap2, float slope2, int64_t j0_minus_diag) {
  if (cap2 > 0.f) {
    const Batch c(cap2), inv(1.f / cap2);
    for (int v = va; v < vb; ++v) (c * tanh(Batch::load_aligned(s + v * kLanes) * inv)).store_aligned(s + v * kLanes);
  }
  if (slope2 != 0.f) {
    const Batch slope(slope2), base(static_cast<float>(j0_minus_diag));
    for (int v = va; v < vb; ++v) {
      simd::fma(slope, lane_index(v) + base, Batch::load_aligned(s + v * kLanes)).store_aligned(s + v * kLanes);
    }
  }
}

// o[0, d) = acc[0, d) * scale: a finished row's output (acc 64-byte aligned and padded to
// whole vectors; o any alignment, nothing past o + d written). Every kernel's last step.
inline void scale_row(const float* acc, float scale, int64_t d, float* o) {
  const Batch s(scale);
  int64_t c = 0;
  for (; c + kLanes <= d; c += kLanes) (Batch::load_aligned(acc + c) * s).store_unaligned(o + c);
  if (c < d) store_partial(o + c, Batch::load_aligned(acc + c) * s, static_cast<int>(d - c));
}

// Rule 3 of include/attnlab/blocks/online_softmax.hpp (rescale<Log2>) for kLanes rows at once,
// with this file's exp2 instead of one libm call per row: 1 where the max did not move or
// m_old is -inf, else 2^(m_old - subtrahend(m_new)) (NaN stays NaN).
inline Batch rescale_log2(Batch m_old, Batch m_new) {
  const Batch neg_inf(-std::numeric_limits<float>::infinity());
  const Batch sub = simd::select(m_new == neg_inf, Batch(0.f), m_new);
  const Batch e = simd::exp2_nonpositive(m_old - sub);  // m_old <= m_new, or NaN
  return simd::select(simd::mask_or(m_old == m_new, m_old == neg_inf), Batch(1.f), e);
}

// kLanes consecutive values of a float32, bf16 or f16 array as float32 (exact widening; the
// 16-bit ones are the floor's).
inline Batch load_unaligned(const float* p) { return Batch::load_unaligned(p); }

// Lanes [0, n) widened from a bf16 or f16 array, `fill` in the others; reads only p[0..n).
// (Partial loads are the head_dim tails and short packing rows, never the inner loops.)
template <class E, class = std::enable_if_t<!std::is_same_v<E, float>>>
inline Batch load_partial(const E* p, int n, float fill = 0.f) {
  if (n == kLanes) return load_unaligned(p);
  alignas(64) float lanes[kLanes];
  for (int i = 0; i < kLanes; ++i) lanes[i] = i < n ? to_float(p[i]) : fill;
  return Batch::load_aligned(lanes);
}

}  // namespace attnlab::ATTN_TARGET_NS::simd
