// Agreement with the float64 reference, and the tolerance policy (the only place it lives).
//
// Errors of a kernel's output against the reference, per row (b, h, i):
//   o_abs  = max |O - O_ref|
//   o_rel  = max |O - O_ref| / row_scale, row_scale = sum_j P_ij * max_d |V_jd|: the size of
//            the terms the row is a convex combination of, so cancellation cannot inflate it
//   lse    = max |LSE - LSE_ref| / max(1, |LSE_ref|)
// A NaN/Inf where the reference is finite (or a finite value where the reference is NaN,
// i.e. the inputs seen by that row hold NaN) counts as an infinite error.
//
// Tolerance policy (FlashAttention's test rule, with a floor): a kernel passes when
//   o_rel <= kFactor * baseline.o_rel + kFloor   and   lse <= kFactor * baseline.lse + kFloor
// where `baseline` is the error the textbook float32 algorithm (the `naive` kernel's
// arithmetic) makes against float64 on the same inputs and rows, kFactor = 4 and
// kFloor = 32 * FLT_EPSILON (~3.8e-6).
// A kernel of another arithmetic (Kernel::arithmetic: bf16 products, P rounded to bf16) is held
// to the textbook's error in that arithmetic (tolerance_for), with the O floor raised to
// kFloorBf16P = 2^-8: rounding P relative to a running max (the kernel) or to the row max (the
// baseline) rounds each weight differently, and in a row dominated by one term (one huge V
// element) the error is that one rounding, up to 2^-9 of the row scale for either, so a factor
// of the baseline's realization alone cannot bound it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab {

// Error of one value against the reference, with the NaN rules above: 0 when both are NaN or
// the same infinity, infinite for a non-finite/finite mismatch, else |got - want|.
double value_error(double got, double want);

struct RowId {
  int64_t b = 0, h = 0, i = 0;
};

// Reference values (double) for a list of rows: o is rows.size() x head_dim_v.
struct Reference {
  std::vector<RowId> rows;
  std::vector<double> o;
  std::vector<double> lse;
  std::vector<double> row_scale;
  int64_t dim = 0;
};

// Every row of the problem, in (b, h, i) order.
std::vector<RowId> all_rows(const Problem& p);
// All rows when there are at most max_rows; otherwise a deterministic sample that always
// includes the first and last row of every (b, h) (where masks bite) plus random rows.
std::vector<RowId> sample_rows(const Problem& p, size_t max_rows, uint64_t seed);

// The keys row r sees, ascending: its interval, or (sparse pattern) the element rule applied to
// every key of its hull -- the dense mask, independent of any block classification.
std::vector<int64_t> reference_keys(const Problem& p, const RowId& r);

// The float64 reference: the specification, computed row by row, never optimized.
double reference_row(const Problem& p, const Inputs& in, const RowId& r, double* o_row, double* row_scale);
Reference reference(const Problem& p, const Inputs& in, std::vector<RowId> rows);
inline Reference reference(const Problem& p, const Inputs& in) { return reference(p, in, all_rows(p)); }

struct Errors {
  double o_abs = 0, o_rel = 0, lse = 0;
  bool lse_checked = false;
  RowId worst;  // row of the largest o_rel
};

// o: the output view (q's shape and layout); lse may be nullptr (then not checked).
Errors measure(const Reference& ref, const ConstView& o, const float* lse, const Problem& p);

// The baseline: the textbook float32 algorithm's error on the reference rows; with
// Arithmetic::Bf16Products (kernel.hpp) its softmax weights are rounded to bf16 before P.V.
enum class Arithmetic;
Errors baseline_errors(const Problem& p, const Inputs& in, const Reference& ref, Arithmetic arithmetic);

struct Tolerance {
  static constexpr double kFactor = 4.0;
  static constexpr double kFloor = 32.0 * 1.1920928955078125e-07;
  static constexpr double kFloorBf16P = 1.0 / 256;
  double o_rel = 0, lse = 0;
  static Tolerance from_baseline(const Errors& baseline, double o_floor = kFloor);
  // When checking against outputs made elsewhere: allow their own error as well.
  Tolerance widened_by(const Errors& external) const;
  bool passes(const Errors& e) const;
  std::string why_failed(const Errors& e) const;  // empty when it passes
};

}  // namespace attnlab

#include "attnlab/kernel.hpp"

namespace attnlab {

// Reference, baseline error and tolerance for one problem and input set.
struct Agreement {
  Reference ref;
  Errors baseline;
  Tolerance tol;
  Errors widen;  // an external reference's own error, already in tol (tolerance_for adds it too)
};
Agreement prepare_agreement(const Problem& p, const Inputs& in, std::vector<RowId> rows);
// The tolerance kernel k is held to: a.tol for float32 arithmetic, else one from the baseline
// of the kernel's arithmetic (Kernel::arithmetic) on the same rows.
Tolerance tolerance_for(const Kernel& k, const Problem& p, const Inputs& in, const Agreement& a);
// The same for an arithmetic (a peer's that computes as a lab kernel does).
Tolerance tolerance_for(Arithmetic arithmetic, const Problem& p, const Inputs& in, const Agreement& a);

enum class Verdict { Pass, Fail, Skip };
const char* to_string(Verdict v);

struct KernelCheck {
  std::string kernel;
  Verdict verdict = Verdict::Skip;
  Errors errors;
  Tolerance tol;       // what it was held to (tolerance_for)
  std::string reason;  // why it failed or was skipped
};

// Runs the kernel (through a Session with `threads`) on outputs pre-filled with NaN, so a
// row the kernel forgets to write fails, and measures it against a.ref with a.tol.
// Allocates O and LSE (check_output_bytes) and the session's workspace.
KernelCheck check_kernel(const Kernel& k, const Problem& p, const Inputs& in, const Agreement& a, int threads);

// The backward pass's agreement (backward.hpp): reference gradients of every element, the
// textbook float32 backward's error as the baseline, the tolerance from it.
struct BackwardAgreement {
  ReferenceGrads ref;
  GradErrors baseline;
  GradTolerance tol;
};
BackwardAgreement prepare_backward_agreement(const Problem& p, const Inputs& in, const ConstView& d_o);

struct BackwardCheck {
  std::string kernel;
  Verdict verdict = Verdict::Skip;
  GradErrors errors;
  GradTolerance tol;   // what it was held to
  std::string reason;  // why it failed or was skipped
};
// The kernel's forward (its own O and LSE), then its backward, through a Session made for the
// backward with `threads`, on gradients pre-filled with NaN (an element never written fails);
// measured against a.ref with a.tol. Skipped (with the reason) when it cannot run the problem or
// has no backward pass.
BackwardCheck check_backward(const Kernel& k, const Problem& p, const Inputs& in, const ConstView& d_o,
                             const BackwardAgreement& a, int threads);

// A sampled check, for problems whose full reference takes minutes (a sweep's points): dQ on
// sampled query rows, dK and dV on sampled keys, each computed by the formulas of backward.hpp
// from Q, K, V, dO and the O and LSE the backward is given - the kernel's own forward, whose
// error the forward's check measures - in float64 (the reference) and in float32 (the baseline
// the tolerance scales, GradTolerance). A row's or key's cost is O(seq * d): the same budget as
// the forward's sampled rows. Interval masks only (a sparse pattern takes the full check).
struct GradSample {
  std::vector<RowId> rows;  // (b, h, i): query rows whose dQ is checked
  std::vector<RowId> keys;  // (b, kv head, j): keys whose dK and dV are checked
};
// Up to max_rows of each, as sample_rows picks rows (first and last of every head, then random).
GradSample sample_grads(const Problem& p, size_t max_rows, uint64_t seed);
struct SampledGradAgreement {
  GradSample sample;
  std::vector<double> dq, dk, dv;  // rows x head_dim, keys x head_dim, keys x head_dim_v
  GradErrors baseline;
  GradTolerance tol;
};
// o, lse: the forward's outputs the backward reads (BackwardInputs). Throws InvalidInput for a
// sparse problem.
SampledGradAgreement prepare_sampled_backward(const Problem& p, const Inputs& in, const ConstView& d_o,
                                              const ConstView& o, const float* lse, GradSample sample);
GradErrors measure_sampled_grads(const SampledGradAgreement& a, const Gradients& g, const Problem& p);
// check_backward with the sampled agreement, made from the kernel's own O and LSE.
BackwardCheck check_backward_sampled(const Kernel& k, const Problem& p, const Inputs& in, const ConstView& d_o,
                                     const GradSample& sample, int threads);

// Memory a verification allocates on top of the inputs it is given, an upper bound summed
// over its steps: sample_rows(p, rows, seed) (`rows` = the max_rows asked for),
// prepare_agreement on those rows (the reference rows and its row scratch), check_kernel's
// O and LSE and the session's workspace, plus kVerifyBookkeeping for small allocations
// (task arena, strings). The sweep's memory estimate is built on it.
constexpr size_t kVerifyBookkeeping = size_t{1} << 20;
size_t check_output_bytes(const Problem& p);
size_t verification_bytes(const Kernel& k, const Problem& p, size_t rows, int threads);

}  // namespace attnlab
