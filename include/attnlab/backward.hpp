// The attention backward pass: the gradients of O (and through it of a loss) with respect to Q,
// K and V, defined once here, a float64 reference for them, and their agreement metric and
// tolerance (the forward's policy, verify.hpp, applied per gradient).
//
// For O = softmax(scale Q K^T + mask) V with LSE_i = log sum_j exp(S_ij) over the keys row i sees
// (architecture.md's visible set: causal, windows, kv_lens, sparse patterns), and dO the gradient
// flowing into O:
//   P_ij  = exp(S_ij - LSE_i)                 (0 for a pair the mask hides)
//   D_i   = rowsum(dO_i * O_i)                (from the normalized O)
//   dV_j  = sum_i P_ij dO_i
//   dP_ij = dO_i . V_j
//   dS_ij = P_ij (dP_ij - D_i)
//   dQ_i  = scale sum_j dS_ij K_j
//   dK_j  = scale sum_i dS_ij Q_i
// Score modifications (score_mod.hpp): S_ij is the modified score, so with softcap
//   dS_ij = P_ij (dP_ij - D_i) (1 - tanh^2(s_ij / c))   (s_ij the scaled dot product before the cap)
// (ALiBi's bias is a constant of the inputs: no factor); a sink logit b_h is one more term of the
// softmax with no value row, so P_ij and LSE include it and
//   dsink_h = - sum_{b, i} P_sink,bhi D_bhi,  P_sink = exp(b_h - LSE_bhi)
// a gradient a model trains (gpt-oss's sinks), one per query head (Gradients::dsink).
// GQA/MQA: a kv head's dK and dV sum over the query heads of its group. A masked pair contributes
// nothing; a row that sees no key has dQ_i = 0 and adds nothing to dK, dV; a key no row sees has
// dK_j = dV_j = 0. d_v != d: dO, O and dV have head_dim_v columns. NaN/Inf in Q, K, V or dO reach
// the gradients as the float64 arithmetic of these formulas takes them (reference_backward).
// FLOPs: 2.5x the forward's (FlashAttention's convention: the five n^2 GEMMs of the backward
// against the forward's two): Problem::flops() of a problem whose pass is the backward.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab {

// What the backward reads besides Q, K, V: dO (Q's shape and layout with head_dim_v columns),
// and the forward's O and LSE (natural log, contiguous (batch, q_heads, q_len)).
struct BackwardInputs {
  ConstView d_o;
  ConstView o;
  const float* lse = nullptr;
};

// dQ, dK, dV: float32, Q's, K's and V's shapes in the problem's layout; dsink: q_heads floats when
// the problem has sink logits (else nullptr), written whole.
struct Gradients {
  MutView dq, dk, dv;
  float* dsink = nullptr;
};

// Owned gradient tensors for a problem (allocate_gradients), zero-initialised.
struct GradientTensors {
  std::unique_ptr<float[], AlignedFree> dq, dk, dv, dsink;
  Gradients grads;
};
GradientTensors allocate_gradients(const Problem& p);

// Throws InvalidInput for a problem the backward pass does not take: a quantized or paged KV
// cache (inference caches; naming the fields and what is allowed).
void check_backward_problem(const Problem& p);

// The float64 reference gradients of every element, in (b, h, s, d) order whatever the layout:
// its own float64 forward (P materialized per row), the formulas above, never optimized.
struct ReferenceGrads {
  std::vector<double> dq, dk, dv;
  std::vector<double> dsink;  // q_heads values with sink logits, else empty
};
ReferenceGrads reference_backward(const Problem& p, const Inputs& in, const ConstView& d_o);

// Errors of gradients against the reference, per tensor: max |g - g_ref| / max |g_ref| over the
// whole tensor (NaN/Inf rules of verify.hpp: a non-finite value where the reference is finite,
// or the reverse, is an infinite error).
struct GradErrors {
  double dq = 0, dk = 0, dv = 0;
  double dsink = 0;  // with sink logits: max |dsink - ref| / max |ref| over the heads
};
GradErrors measure_grads(const ReferenceGrads& ref, const Gradients& g, const Problem& p);

// The textbook float32 backward's error on the same inputs (its O and LSE from the textbook
// forward): the baseline the tolerance scales, as the forward's.
GradErrors textbook_backward_errors(const Problem& p, const Inputs& in, const ConstView& d_o,
                                    const ReferenceGrads& ref);

// Tolerance: kFactor x the baseline + kFloor per gradient (verify.hpp's constants).
struct GradTolerance {
  double dq = 0, dk = 0, dv = 0, dsink = 0;
  static GradTolerance from_baseline(const GradErrors& baseline);
  std::string why_failed(const GradErrors& e) const;  // empty when it passes
};

}  // namespace attnlab
