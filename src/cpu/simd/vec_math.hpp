// Vector building blocks shared by the SIMD kernels (simd, threaded, flash, decode).
//
// Per-target code (src/cpu/target.hpp): compiled once per instruction-set target.
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
// (1.1e9 points each; ulp = distance in representable floats; tests/test_simd_math.cpp
// re-checks these bounds on every 61st float):
//   exp2 on [-126, 0]:      max 1 ulp, max rel. error 8.0e-8  (softmax range, log2e folded)
//   exp2 on [0, 128):       max 1 ulp
//   exp  on [-87.336, 0]:   max 1 ulp, max rel. error 8.4e-8
//   exp  on [0, 88.72]:     max 1 ulp, max rel. error 8.5e-8
// (xsimd 8.1's own xsimd::exp: 2 ulp by the same measure, and +inf from 88.38 on.)
// Cost: exp2 is 11 vector instructions (min, cmp, roundscale, sub, 6 FMA, scalef);
// exp is 15 (a multiply and two FMA for the reduction, r*r and the final add).
#pragma once

#ifndef ATTN_TARGET_NS
#error "src/cpu/simd/ is per-target code: include it only from ATTN_TARGET_SOURCES (src/cpu/target.hpp)"
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "attnlab/dtype.hpp"

#if defined(ATTN_TARGET_SCALAR)
#include "cpu/simd/scalar_batch.hpp"
#else
// GCC 12.2 reports -W(maybe-)uninitialized inside the AVX-512 intrinsic headers
// (_mm512_undefined_ps; GCC bug 105593, a false positive) wherever an intrinsic is inlined,
// and attributes it to the including kernel's functions. So the kernels that include this
// header (and only they) ignore those two diagnostics for the whole translation unit.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <xsimd/xsimd.hpp>
#endif

namespace attnlab::ATTN_TARGET_NS::simd {

#if defined(ATTN_TARGET_SCALAR)
using Batch = ScalarBatch;
#else
using Batch = xsimd::batch<float>;
// The element-wise operations the kernels use, spelled once for both Batch types.
inline Batch fma(Batch a, Batch b, Batch c) { return xsimd::fma(a, b, c); }
inline Batch fnma(Batch a, Batch b, Batch c) { return xsimd::fnma(a, b, c); }
inline Batch max(Batch a, Batch b) { return xsimd::max(a, b); }
inline Batch min(Batch a, Batch b) { return xsimd::min(a, b); }
inline Batch select(Batch::batch_bool_type m, Batch a, Batch b) { return xsimd::select(m, a, b); }
inline Batch::batch_bool_type mask_and(Batch::batch_bool_type a, Batch::batch_bool_type b) { return a & b; }
inline Batch::batch_bool_type mask_or(Batch::batch_bool_type a, Batch::batch_bool_type b) { return a | b; }
inline Batch nearbyint(Batch x) { return xsimd::nearbyint(x); }
#endif
inline constexpr int kLanes = static_cast<int>(Batch::size);
// Architectural vector registers: what register-blocked tiles are sized for.
#if defined(__AVX512F__) || defined(__aarch64__)
inline constexpr int kVectorRegisters = 32;
#else
inline constexpr int kVectorRegisters = 16;
#endif

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

#if defined(__AVX512F__)
// p * 2^n for the lanes where x is not below `lo` (NaN counts as "not below"), +0 in the
// others. n is integral; scalef saturates to +inf / 0 itself.
inline Batch scale_or_zero(Batch p, Batch n, Batch x, float lo) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(lo), _CMP_NLT_UQ);
  return _mm512_maskz_scalef_ps(keep, p, n);
}
// min(x, hi) that keeps NaN (vminps returns its second operand when one is NaN).
inline Batch clamp_hi(Batch x, float hi) { return _mm512_min_ps(_mm512_set1_ps(hi), x); }
#elif defined(ATTN_TARGET_SCALAR)
// One float: the same rule in plain arithmetic. n is integral and, once x >= lo, in
// [-126, 129]: 2^n is applied as two factors 2^(n/2), so p * 2^128 with p < 1 stays finite.
inline float pow2i(int e) {  // 2^e for e in [-126, 127]
  const uint32_t bits = static_cast<uint32_t>(e + 127) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline Batch scale_or_zero(Batch p, Batch n, Batch x, float lo) {
  if (x.v != x.v) return x;
  if (x.v < lo) return Batch(0.f);
  const int ni = static_cast<int>(n.v), half = ni >> 1;
  return Batch((p.v * pow2i(half)) * pow2i(ni - half));
}
inline Batch clamp_hi(Batch x, float hi) { return x.v > hi ? Batch(hi) : x; }
#else
// Portable fallback (non-AVX-512 builds): apply 2^n as two factors 2^(n/2) so the
// exponent field never overflows for |n| up to 254 and p * 2^128 with p < 1 stays finite;
// then zero the underflowing lanes and restore NaN.
inline Batch scale_or_zero(Batch p, Batch n, Batch x, float lo) {
  using IBatch = xsimd::batch<int32_t>;
  const IBatch ni = xsimd::to_int(xsimd::max(xsimd::min(n, Batch(128.f)), Batch(-126.f)));
  const IBatch half = ni >> 1;
  const Batch a = xsimd::bitwise_cast<Batch>((half + IBatch(127)) << 23);
  const Batch b = xsimd::bitwise_cast<Batch>((ni - half + IBatch(127)) << 23);
  const Batch z = xsimd::select(x < Batch(lo), Batch(0.f), (p * a) * b);
  return xsimd::select(xsimd::isnan(x), x, z);
}
inline Batch clamp_hi(Batch x, float hi) { return xsimd::select(x > Batch(hi), Batch(hi), x); }
#endif

}  // namespace detail

// 2^x. See the header comment for accuracy and special values.
inline Batch exp2(Batch x) {
  const Batch xc = detail::clamp_hi(x, 129.f);  // +inf -> 129 -> 2^129 = +inf
  const Batch n = simd::nearbyint(xc);
  const Batch p = detail::exp2_poly(xc - n);
  return detail::scale_or_zero(p, n, x, -126.f);
}

// 2^x for x <= 0 or NaN - what the softmax feeds it (s - max, m_old - m_new): the same
// values, bit for bit, as exp2 on that domain (tests/test_simd_math.cpp), with 2^n applied
// as one exponent-field factor (n in [-126, 0] once the underflowing lanes are zeroed)
// instead of the portable two-factor form, ~7 instructions fewer on AVX2. Positive x is
// outside the contract (AVX-512 and scalar simply use exp2).
inline Batch exp2_nonpositive(Batch x) {
#if defined(__AVX512F__) || defined(ATTN_TARGET_SCALAR)
  return exp2(x);
#else
  using IBatch = xsimd::batch<int32_t>;
  const Batch xc = simd::max(Batch(-127.f), x);  // keeps the integer conversion in range
  const Batch n = simd::nearbyint(xc);
  const Batch p = detail::exp2_poly(xc - n);
  const Batch two_n = xsimd::bitwise_cast<Batch>((xsimd::to_int(n) + IBatch(127)) << 23);
  const Batch z = xsimd::select(x < Batch(-126.f), Batch(0.f), p * two_n);
  return xsimd::select(xsimd::isnan(x), x, z);  // (x != x is an ordered compare in xsimd 8.1)
#endif
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

// Sum of all lanes (xsimd 8.1 spells it hadd; 9.0+ renamed it reduce_add).
#if defined(ATTN_TARGET_SCALAR)
inline float reduce_sum(Batch v) { return v.v; }
#else
inline float reduce_sum(Batch v) { return xsimd::hadd(v); }
#endif

// Lane i of the result = reduce_sum(rows[i]), for kLanes rows: the transposed reduction
// that turns kLanes dot-product accumulators into kLanes scores (about 3 shuffle/add
// instructions per row on AVX-512). Not xsimd::haddp: xsimd 8.1's AVX-512 haddp returns
// the sums in the wrong lanes (lanes 2,3 and 4,5 of each half swapped - measured; its
// SSE/AVX versions are right and are used below).
inline Batch transpose_sum(const Batch* rows) {
#if defined(__AVX512F__)
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
#elif defined(ATTN_TARGET_SCALAR)
  return rows[0];
#else
  return xsimd::haddp(rows);
#endif
}

// Largest lane (xsimd 8.1 has no reduce_max; 9.0+ has xsimd::reduce_max).
inline float reduce_max(Batch v) {
#if defined(__AVX512F__)
  return _mm512_reduce_max_ps(v);
#elif defined(__AVX2__)
  // Three shuffle + max steps (a store and 7 scalar compares were ~3x slower).
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
#else
  alignas(64) float lanes[kLanes];
  v.store_aligned(lanes);
  float m = lanes[0];
  for (int i = 1; i < kLanes; ++i) m = lanes[i] > m ? lanes[i] : m;
  return m;
#endif
}

// Lanes [0, n) from p, `fill` in lanes [n, kLanes). Reads only p[0..n). n in [0, kLanes].
inline Batch load_partial(const float* p, int n, float fill = 0.f) {
#if defined(__AVX512F__)
  const __mmask16 m = static_cast<__mmask16>((1u << n) - 1u);
  return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), m, p);
#elif defined(__AVX2__)
  // Whole vectors by a plain load: a masked load (vmaskmovps) in a stream of loads from
  // memory stalls it (measured on Zen 3: K packing from DRAM 3.4 vs 9 GB/s).
  if (n == kLanes) return Batch::load_unaligned(p);
  // vmaskmovps: masked-off lanes are never read (no fault past p + n).
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
  return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
#else
  alignas(64) float lanes[kLanes];
  for (int i = 0; i < kLanes; ++i) lanes[i] = i < n ? p[i] : fill;
  return Batch::load_aligned(lanes);
#endif
}

// Lane j of x where bit j of `bits` is set, `fill` where it is clear (bits above kLanes ignored):
// a block-map word's visible keys (pattern.hpp) applied to a vector of scores, by a select.
inline Batch keep_bits(Batch x, uint32_t bits, float fill) {
#if defined(__AVX512F__)
  return _mm512_mask_mov_ps(_mm512_set1_ps(fill), static_cast<__mmask16>(bits), x);
#elif defined(__AVX2__)
  const __m256i lane = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i on = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(bits)), lane), lane);
  return _mm256_blendv_ps(_mm256_set1_ps(fill), x, _mm256_castsi256_ps(on));
#elif defined(__aarch64__) && !defined(ATTN_TARGET_SCALAR)
  const uint32x4_t lane = {1u, 2u, 4u, 8u};
  return vbslq_f32(vtstq_u32(vdupq_n_u32(bits), lane), x, vdupq_n_f32(fill));
#else
  alignas(64) float lanes[kLanes];
  x.store_aligned(lanes);
  for (int i = 0; i < kLanes; ++i) lanes[i] = bits >> i & 1u ? lanes[i] : fill;
  return Batch::load_aligned(lanes);
#endif
}

// Writes lanes [0, n) of v to p[0..n); nothing else. n in [0, kLanes].
inline void store_partial(float* p, Batch v, int n) {
#if defined(__AVX512F__)
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1u), v);
#elif defined(__AVX2__)
  const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  _mm256_maskstore_ps(p, m, v);
#else
  alignas(64) float lanes[kLanes];
  v.store_aligned(lanes);
  for (int i = 0; i < n; ++i) p[i] = lanes[i];
#endif
}

// o[0, d) = acc[0, d) * scale: a finished row's output (acc 64-byte aligned and padded to
// whole vectors; o any alignment, nothing past o + d written). Every kernel's last step.
inline void scale_row(const float* acc, float scale, int64_t d, float* o) {
  const Batch s(scale);
  int64_t c = 0;
  for (; c + kLanes <= d; c += kLanes) (Batch::load_aligned(acc + c) * s).store_unaligned(o + c);
  if (c < d) store_partial(o + c, Batch::load_aligned(acc + c) * s, static_cast<int>(d - c));
}

// Rule 3 of include/attnlab/online_softmax.hpp (rescale<Log2>) for kLanes rows at once,
// with this file's exp2 instead of one libm call per row: 1 where the max did not move or
// m_old is -inf, else 2^(m_old - subtrahend(m_new)) (NaN stays NaN).
inline Batch rescale_log2(Batch m_old, Batch m_new) {
  const Batch neg_inf(-std::numeric_limits<float>::infinity());
  const Batch sub = simd::select(m_new == neg_inf, Batch(0.f), m_new);
  const Batch e = simd::exp2_nonpositive(m_old - sub);  // m_old <= m_new, or NaN
  return simd::select(simd::mask_or(m_old == m_new, m_old == neg_inf), Batch(1.f), e);
}

// kLanes consecutive values of a float32, bf16 or f16 array as float32 (exact widening).
inline Batch load_unaligned(const float* p) { return Batch::load_unaligned(p); }
inline Batch load_unaligned(const bf16* p) {
#if defined(ATTN_TARGET_SCALAR)
  return Batch(to_float(*p));
#elif defined(__AVX512F__)
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
#elif defined(__AVX2__)
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
#else  // NEON
  return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p)), 16));
#endif
}
inline Batch load_unaligned(const f16* p) {
#if defined(ATTN_TARGET_SCALAR)
  return Batch(to_float(*p));
#elif defined(__AVX512F__)
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__AVX2__)
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else  // NEON
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p))));
#endif
}

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
