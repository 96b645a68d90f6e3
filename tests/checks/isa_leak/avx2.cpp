// A per-target object (built with -mavx2 -mfma, as the avx2 target) with its planted leaks.
#include <immintrin.h>

#include "shared.hpp"

namespace attnlab::avx2 {

// Control: AVX2 in the avx2 namespace is allowed.
float sum(const float* x, int n) { return fixture::shared_sum(x, n); }

// Leak: AVX-512 (zmm) in the avx2 namespace.
__attribute__((target("avx512f"), noinline)) float wide(const float* x, int n) {
  __m512 acc = _mm512_setzero_ps();
  for (int i = 0; i + 16 <= n; i += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(x + i));
  return _mm512_reduce_add_ps(acc);
}

// Leak: an EVEX-only instruction on ymm registers (AVX-512VL: no zmm, no mask register in
// the text; only the encoding tells it from AVX2) in the avx2 namespace.
__attribute__((target("avx512f,avx512vl"), noinline)) float evex_ymm(const float* x, int n) {
  __m256i acc = _mm256_setzero_si256();
  for (int i = 0; i + 8 <= n; i += 8) {
    acc = _mm256_ternarylogic_epi32(acc, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)),
                                    _mm256_set1_epi32(n), 0x96);
  }
  return static_cast<float>(_mm256_extract_epi32(acc, 0));
}

// Control: a template instantiated with a lambda of this namespace.
float with_lambda(const float* x, int n) {
  return fixture::apply(
      [](const float* p, int m) {
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i + 8 <= m; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(p + i), acc, acc);
        float lanes[8];
        _mm256_storeu_ps(lanes, acc);
        return lanes[0] + lanes[7];
      },
      x, n);
}

}  // namespace attnlab::avx2

namespace attnlab::avx512 {

// Control: AVX-512 in the avx512 namespace is allowed.
__attribute__((target("avx512f"), noinline)) float wide(const float* x, int n) {
  __m512 acc = _mm512_setzero_ps();
  for (int i = 0; i + 16 <= n; i += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(x + i));
  return _mm512_reduce_add_ps(acc);
}

}  // namespace attnlab::avx512

// Leak: an x86-64-v3 instruction that is not VEX-encoded (lzcnt) outside any target.
__attribute__((target("lzcnt"), noinline)) unsigned baseline_clz(unsigned v) { return __builtin_clz(v | 1u); }

// Leak: an x86-64-v2 instruction (popcnt) in baseline code, which must run on x86-64-v1.
__attribute__((target("popcnt"), noinline)) int baseline_popcount(unsigned v) { return __builtin_popcount(v); }
