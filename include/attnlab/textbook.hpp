// The textbook float32 row arithmetic, shared by the `naive` kernel and by the tolerance
// baseline (which must make exactly the error naive makes). E is the storage type of Q, K
// and V (float, bf16, f16): each element is widened exactly to float32 where it is read.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "attnlab/interval.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab::textbook {

// s[j - iv.lo] = scale * <q, K[b, hk, j, :]> for j in iv, plain sequential dot products.
template <class E>
void scores(const E* q, const View4<const E>& k, int64_t b, int64_t hk, Interval iv, float scale, float* s) {
  for (int64_t j = iv.lo; j < iv.hi; ++j) {
    const E* kr = k.row(b, hk, j);
    float dot = 0.f;
    for (int64_t d = 0; d < k.dim; ++d) dot += to_float(q[d]) * to_float(kr[d]);
    s[j - iv.lo] = scale * dot;
  }
}

// Stable softmax of s[0 .. iv.size()) in place (subtract the max), then
// o = sum_j p_j V[b, hk, iv.lo + j, :]. Returns the natural-log LSE (-inf, and o = 0, for
// an empty interval).
template <class E>
float softmax_pv(float* s, const View4<const E>& v, int64_t b, int64_t hk, Interval iv, float* o) {
  const int64_t n = iv.size();
  for (int64_t d = 0; d < v.dim; ++d) o[d] = 0.f;
  if (n == 0) return -std::numeric_limits<float>::infinity();
  float m = s[0];
  for (int64_t j = 1; j < n; ++j) m = s[j] > m ? s[j] : m;
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - m);
    sum += s[j];
  }
  const float inv = 1.f / sum;
  for (int64_t j = 0; j < n; ++j) {
    const float p = s[j] * inv;
    const E* vr = v.row(b, hk, iv.lo + j);
    for (int64_t d = 0; d < v.dim; ++d) o[d] += p * to_float(vr[d]);
  }
  return m + std::log(sum);
}

// Both steps for query row (b, h, i) of typed inputs; o gets head_dim floats.
template <class E>
float row(const Problem& p, const TypedInputs<E>& in, int64_t b, int64_t h, int64_t i, Interval iv, float* s,
          float* o) {
  const int64_t hk = p.kv_head_of(h);
  scores(in.q.row(b, h, i), in.k, b, hk, iv, p.effective_scale(), s);
  return softmax_pv(s, in.v, b, hk, iv, o);
}

}  // namespace attnlab::textbook
