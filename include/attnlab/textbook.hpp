// The textbook float32 row arithmetic, shared by the `naive` kernel and by the tolerance
// baseline (which must make exactly the error naive makes).
#pragma once

#include <cstdint>

#include "attnlab/interval.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab::textbook {

// s[j - iv.lo] = scale * <q, K[b, hk, j, :]> for j in iv, plain sequential dot products.
void scores(const float* q, const ConstView& k, int64_t b, int64_t hk, Interval iv,
            float scale, float* s);

// Stable softmax of s[0 .. iv.size()) in place (subtract the max), then
// o = sum_j p_j V[b, hk, iv.lo + j, :]. Returns the natural-log LSE (-inf, and o = 0, for
// an empty interval).
float softmax_pv(float* s, const ConstView& v, int64_t b, int64_t hk, Interval iv, float* o);

}  // namespace attnlab::textbook
