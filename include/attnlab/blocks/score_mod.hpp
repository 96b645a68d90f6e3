// The score modifications (docs/operation.md), in ONE place, usable from host and CUDA device code.
// For query row i of head h (its diagonal pos = MaskSpec::pos(i)) and a visible key j:
//   s  = scale * <q, k_j>
//   softcap c > 0:   s = c * tanh(s / c)                (Gemma 2, Grok-1)
//   ALiBi slope m_h: s = s + m_h * (j - pos)            (BLOOM, MPT: keys before the diagonal lose)
// in that order (FlashAttention's and llama.cpp's), before the mask: a masked key is removed
// whatever its modified score. A sink logit b_h (gpt-oss) is one more term of the softmax with no
// value row:  O = sum_j e^{s_j} v_j / (e^{b_h} + sum_j e^{s_j}),  LSE = log(e^{b_h} + sum_j e^{s_j});
// a row that sees no key gets O = 0 and LSE = b_h. Kernels in log2 units (scores times log2 e)
// apply the same functions with c, m_h and b_h times log2 e: c tanh(s / c) scales with its units.
// The sink logit's finish is online_softmax::finish (online_softmax.hpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "attnlab/blocks/interval.hpp"

namespace attnlab {

// The modification of one row's scores: what Problem::score_mod(b, h, i) gives.
struct ScoreMod {
  float softcap = 0.f;  // c; 0: none
  float slope = 0.f;    // m_h; 0: none
  int64_t pos = 0;      // the row's diagonal (MaskSpec::pos)
  ATTN_HD bool on() const { return softcap > 0.f || slope != 0.f; }
  template <class T>
  ATTN_HD T operator()(T s, int64_t j) const {
    if (softcap > 0.f) s = T(softcap) * std::tanh(s / T(softcap));
    if (slope != 0.f) s += T(slope) * T(j - pos);
    return s;
  }
  // The derivative of the modified score in s (the backward's factor on dS): softcap's
  // 1 - tanh^2(s / c), else 1 (ALiBi's bias does not depend on s).
  template <class T>
  ATTN_HD T derivative(T s) const {
    if (!(softcap > 0.f)) return T(1);
    const T t = std::tanh(s / T(softcap));
    return T(1) - t * t;
  }
};

}  // namespace attnlab
