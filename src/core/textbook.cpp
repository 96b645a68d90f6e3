#include "attnlab/textbook.hpp"

#include <cmath>
#include <limits>

namespace attnlab::textbook {

void scores(const float* q, const ConstView& k, int64_t b, int64_t hk, Interval iv,
            float scale, float* s) {
  for (int64_t j = iv.lo; j < iv.hi; ++j) {
    const float* kr = k.row(b, hk, j);
    float dot = 0.f;
    for (int64_t d = 0; d < k.dim; ++d) dot += q[d] * kr[d];
    s[j - iv.lo] = scale * dot;
  }
}

float softmax_pv(float* s, const ConstView& v, int64_t b, int64_t hk, Interval iv, float* o) {
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
    const float* vr = v.row(b, hk, iv.lo + j);
    for (int64_t d = 0; d < v.dim; ++d) o[d] += p * vr[d];
  }
  return m + std::log(sum);
}

}  // namespace attnlab::textbook
