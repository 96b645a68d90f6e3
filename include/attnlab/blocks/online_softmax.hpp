// The online-softmax rules every tiled kernel shares (CPU and CUDA: ATTN_HD), so that NaN and
// Inf reach O and LSE exactly as in the float64 reference (textbook IEEE arithmetic).
//
// A row's state over the keys seen so far: running max m, sum l and accumulator acc, with
//   p_j = e(s_j - subtrahend(m)),   l = sum_j p_j,   acc = sum_j p_j V_j
// where e is exp2 (scores in log2 units) or exp (natural units); the rules are the same.
//
//  1. Whether a row is fully masked comes from its visible interval alone (Interval::empty):
//     O = 0, LSE = -inf. A running max of -inf or NaN never means "masked", and a key tile
//     is skipped only when no row of the block has a visible key in it.
//  2. subtrahend(m) = m, or 0 while m = -inf (FlashAttention-2's Check_inf). p is then 0 for
//     s = -inf, NaN for s = NaN (and for s = m = +inf), never exp(-inf - -inf) by accident.
//     A NaN score makes p, hence l, NaN whatever m is, so the max operation may drop NaN
//     (maxps, fmaxf and std::max do, depending on the operand order).
//  3. When the max moves from m_old to m_new, l and acc are multiplied by
//     rescale(m_old, m_new): 1 when nothing changed or while m_old = -inf (acc then holds
//     only 0 * V_j, i.e. 0 or NaN, and l = 0: multiplying by 0 would change nothing), else
//     e(m_old - subtrahend(m_new)) (NaN when a NaN got into the max). The chunk merge of
//     split-key kernels uses the same factor as the weight of each chunk.
//  4. A row with visible keys ends with O = acc / l and LSE = m + log(l): l = 0 means every
//     visible score was -inf, and 0/0 = NaN is what the reference gives (O and LSE NaN).
//  5. Masked keys never reach a row: a masked score is replaced (a select, never arithmetic),
//     and in P*V a row multiplies only the V rows of its own visible keys (0 * NaN = NaN).
//     A visible key with p = 0 is still multiplied: 0 * NaN/Inf in V is NaN, as in the
//     reference.
//  6. A sink logit b (score_mod.hpp) is one more term of the sum with no value row, added at the
//     finish (finish): with M = max(m, b), l' = l e(m - M) + e(b - M), O = acc e(m - M) / l',
//     LSE = M + log l'. A row that sees no key gets O = 0, LSE = b; one whose scores were all -inf
//     O = acc * 0 (0, or NaN from 0 * NaN/Inf in V) and LSE = b; a NaN max stays NaN.
#pragma once

#include <cmath>

#include "attnlab/blocks/interval.hpp"

namespace attnlab::online_softmax {

enum class Units { Log2, Natural };  // scores scaled by log2(e) (exp2) or not (exp)

template <Units U>
ATTN_HD float expu(float x) {
  if constexpr (U == Units::Log2) {
    return exp2f(x);
  } else {
    return expf(x);
  }
}

// Rule 2: what is subtracted from the scores before the exponential.
ATTN_HD float subtrahend(float m) { return m == -INFINITY ? 0.f : m; }

// Rule 3: factor for the state accumulated under max m_old once the max is m_new.
template <Units U>
ATTN_HD float rescale(float m_old, float m_new) {
  return m_old == m_new || m_old == -INFINITY ? 1.f : expu<U>(m_old - subtrahend(m_new));
}

// Rules 1 and 4: the factor O = acc * out_scale and the natural-log LSE of a finished row.
// `empty`: the row's visible interval is empty (then acc was never touched and is 0).
template <class T>
ATTN_HD T out_scale(bool empty, T l) {
  return empty ? T(0) : T(1) / l;  // l = 0: acc (0 or NaN) * inf = NaN
}
template <Units U, class T>
ATTN_HD float out_lse(bool empty, float m, T l) {
  if (empty) return -INFINITY;
  if (l == T(0)) return NAN;
  const double unit = U == Units::Log2 ? 0.6931471805599453 : 1.0;
  return static_cast<float>(static_cast<double>(m) * unit + log(static_cast<double>(l)));
}

// Rules 1, 4 and 6 in one call: the factor O = acc * out_scale and the natural-log LSE, with the
// row's sink logit in the units of m (-inf: none, rules 1 and 4 alone).
struct Finish {
  float out_scale;
  float lse;
};
template <Units U, class T>
ATTN_HD Finish finish(bool empty, float m, T l, float sink = -INFINITY) {
  if (sink == -INFINITY) return {static_cast<float>(out_scale(empty, l)), out_lse<U>(empty, m, l)};
  if (empty) return {0.f, out_lse<U>(false, sink, T(1))};
  const float top = m > sink ? m : sink;              // a NaN m: top = sink, and c below is NaN
  const T c = m == top ? T(1) : T(expu<U>(m - top));  // m = -inf (every score -inf): c = 0
  const T l2 = l * c + T(expu<U>(sink - top));
  return {static_cast<float>(c / l2), out_lse<U>(false, top, l2)};
}

}  // namespace attnlab::online_softmax
