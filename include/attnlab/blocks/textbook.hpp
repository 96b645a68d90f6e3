// The textbook float32 row arithmetic, shared by the `naive` kernel and by the tolerance
// baseline (which must make exactly the error naive makes). E is the storage type of Q, K
// and V (float, bf16, f16): each element is widened exactly to float32 where it is read.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "attnlab/blocks/interval.hpp"
#include "attnlab/blocks/score_mod.hpp"
#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab::textbook {

// The keys a row sees: an Interval (the interval rule), or a list of key indices in ascending
// order (a sparse pattern, pattern.hpp).
struct KeyList {
  const int64_t* idx = nullptr;
  int64_t n = 0;
};
inline int64_t key_count(Interval iv) { return iv.size(); }
inline int64_t key_at(Interval iv, int64_t x) { return iv.lo + x; }
inline int64_t key_count(const KeyList& k) { return k.n; }
inline int64_t key_at(const KeyList& k, int64_t x) { return k.idx[x]; }

// s[x] = scale * <q, K[b, hk, key x, :]> for the keys of `keys`, plain sequential dot products.
template <class E, class Keys>
void scores(const E* q, const View4<const E>& k, int64_t b, int64_t hk, const Keys& keys, float scale, float* s) {
  const int64_t n = key_count(keys);
  for (int64_t x = 0; x < n; ++x) {
    const E* kr = k.row(b, hk, key_at(keys, x));
    float dot = 0.f;
    for (int64_t d = 0; d < k.dim; ++d) dot += to_float(q[d]) * to_float(kr[d]);
    s[x] = scale * dot;
  }
}

// The score modifications of row mod (softcap, then ALiBi: score_mod.hpp) on s[x], in float32.
template <class Keys>
void modify(const ScoreMod& mod, const Keys& keys, float* s) {
  if (!mod.on()) return;
  for (int64_t x = 0; x < key_count(keys); ++x) s[x] = mod(s[x], key_at(keys, x));
}

// Stable softmax of s[0 .. key_count(keys)) in place (subtract the max), then
// o = sum_x p_x V[b, hk, key x, :]. Returns the natural-log LSE (-inf, and o = 0, for a row
// that sees no key). round_p: each exp(s - max) rounded to bf16 before P.V (the sum stays
// unrounded), the arithmetic of Arithmetic::Bf16Products (kernel.hpp). sink: the row's sink
// logit (score_mod.hpp; -inf: none), one more term of the sum, and the LSE of a row without keys.
// The softmax's first half for n >= 1 scores: s[j] = exp(s[j] - max) in place; *m = the max (the
// sink logit's too), returns the sum of the exps (the textbook order, shared with verify.cpp's int8
// cache baseline).
inline float exp_shifted(float* s, int64_t n, float* m, float sink = -std::numeric_limits<float>::infinity()) {
  *m = s[0];
  for (int64_t j = 1; j < n; ++j) *m = s[j] > *m ? s[j] : *m;
  const bool has_sink = sink != -std::numeric_limits<float>::infinity();
  if (has_sink && sink > *m) *m = sink;
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - *m);
    sum += s[j];
  }
  return has_sink ? sum + std::exp(sink - *m) : sum;
}

template <class E, class Keys>
float softmax_pv(float* s, const View4<const E>& v, int64_t b, int64_t hk, const Keys& keys, float* o,
                 bool round_p = false, float sink = -std::numeric_limits<float>::infinity()) {
  const int64_t n = key_count(keys);
  for (int64_t d = 0; d < v.dim; ++d) o[d] = 0.f;
  if (n == 0) return sink;
  float m = 0.f;
  const float sum = exp_shifted(s, n, &m, sink);
  const float inv = 1.f / sum;
  for (int64_t j = 0; j < n; ++j) {
    const float p = (round_p ? round_to(DType::BF16, s[j]) : s[j]) * inv;
    const E* vr = v.row(b, hk, key_at(keys, j));
    for (int64_t d = 0; d < v.dim; ++d) o[d] += p * to_float(vr[d]);
  }
  return m + std::log(sum);
}

// Both steps for query row (b, h, i) of typed inputs; o gets head_dim_v floats.
template <class E, class Keys>
float row(const Problem& p, const TypedInputs<E>& in, int64_t b, int64_t h, int64_t i, const Keys& keys, float* s,
          float* o, bool round_p = false) {
  const int64_t hk = p.kv_head_of(h);
  scores(in.q.row(b, h, i), in.k, b, hk, keys, p.effective_scale(), s);
  modify(p.score_mod(b, h, i), keys, s);
  return softmax_pv(s, in.v, b, hk, keys, o, round_p, p.sink_logit(h));
}

// The backward of query row (b, h, i) (backward.hpp's formulas) in float32, from the forward's
// O row and LSE (natural log): recomputes the row's scores into s, then
//   P_x = exp(S_x - lse), D = dO . O, dS_x = P_x (dO . V_x - D) (times softcap's derivative),
//   dq = scale sum_x dS_x K_x (written), dk_x += scale dS_x q, dv_x += P_x dO (accumulated),
//   *dsink -= exp(b_h - lse) D (a sink logit; dsink nullptr: none).
// A row that sees no key gets dq = 0 and adds nothing (its sink has P = 1 and D = 0).
template <class E, class Keys>
void backward_row(const Problem& p, const TypedInputs<E>& in, int64_t b, int64_t h, int64_t i, const Keys& keys,
                  const float* o, float lse, const float* d_o, float* s, float* dq, const View4<float>& dk,
                  const View4<float>& dv, float* dsink = nullptr) {
  const int64_t hk = p.kv_head_of(h), n = key_count(keys), d_n = p.head_dim, dv_n = p.dim_v();
  const float scale = p.effective_scale();
  for (int64_t d = 0; d < d_n; ++d) dq[d] = 0.f;
  if (n == 0) return;
  const E* q = in.q.row(b, h, i);
  scores(q, in.k, b, hk, keys, scale, s);
  float big_d = 0.f;
  for (int64_t d = 0; d < dv_n; ++d) big_d += d_o[d] * o[d];
  if (dsink) *dsink -= std::exp(p.sink_logit(h) - lse) * big_d;
  const ScoreMod mod = p.score_mod(b, h, i);
  for (int64_t x = 0; x < n; ++x) {
    const int64_t j = key_at(keys, x);
    const float pj = std::exp((mod.on() ? mod(s[x], j) : s[x]) - lse);
    const E* vr = in.v.row(b, hk, j);
    float dp = 0.f;
    for (int64_t d = 0; d < dv_n; ++d) dp += d_o[d] * to_float(vr[d]);
    const float ds = pj * (dp - big_d) * mod.derivative(s[x]);
    const E* kr = in.k.row(b, hk, j);
    float* dkr = dk.row(b, hk, j);
    float* dvr = dv.row(b, hk, j);
    for (int64_t d = 0; d < d_n; ++d) {
      dq[d] += scale * ds * to_float(kr[d]);
      dkr[d] += scale * ds * to_float(q[d]);
    }
    for (int64_t d = 0; d < dv_n; ++d) dvr[d] += pj * d_o[d];
  }
}

}  // namespace attnlab::textbook
