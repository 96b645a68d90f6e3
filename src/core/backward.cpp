// The backward pass's reference, agreement metric and tolerance (backward.hpp).
#include "attnlab/backward.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "attnlab/kernel.hpp"
#include "attnlab/blocks/score_mod.hpp"
#include "attnlab/blocks/textbook.hpp"
#include "attnlab/verify.hpp"

namespace attnlab {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

size_t index(int64_t heads, int64_t seq, int64_t dim, int64_t b, int64_t h, int64_t s) {
  return static_cast<size_t>(((b * heads + h) * seq + s) * dim);
}

template <class E>
void reference_typed(const Problem& p, const TypedInputs<E>& in, const ConstView& d_o, ReferenceGrads& g) {
  const int64_t d_n = p.head_dim, dv_n = p.dim_v();
  const double scale = p.effective_scale();
  std::vector<double> s(static_cast<size_t>(p.kv_len)), cap(static_cast<size_t>(p.kv_len)),
      o(static_cast<size_t>(dv_n));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.q_heads; ++h) {
      const int64_t hk = p.kv_head_of(h);
      for (int64_t i = 0; i < p.q_len; ++i) {
        const std::vector<int64_t> keys = reference_keys(p, {b, h, i});
        if (keys.empty()) continue;  // dQ_i = 0, nothing to dK, dV
        const E* q = in.q.row(b, h, i);
        const float* go = d_o.row(b, h, i);
        // The modified scores (score_mod.hpp) and softcap's derivative; a sink logit starts the max.
        const ScoreMod mod = p.score_mod(b, h, i);
        const double sink = p.sink_logit(h);
        double m = sink;
        for (size_t x = 0; x < keys.size(); ++x) {
          const E* k = in.k.row(b, hk, keys[x]);
          double dot = 0;
          for (int64_t d = 0; d < d_n; ++d) dot += static_cast<double>(to_float(q[d])) * to_float(k[d]);
          cap[x] = mod.derivative(scale * dot);
          s[x] = mod(scale * dot, keys[x]);
          if (!(s[x] <= m)) m = s[x];  // a NaN score makes the row NaN, as the forward reference
        }
        const double e_sink = sink == -kInf ? 0.0 : std::exp(sink - m);
        double l = e_sink;
        for (size_t x = 0; x < keys.size(); ++x) l += (s[x] = std::exp(s[x] - m));
        std::fill(o.begin(), o.end(), 0.0);
        for (size_t x = 0; x < keys.size(); ++x) {  // s becomes P; O = P V
          s[x] /= l;
          const E* v = in.v.row(b, hk, keys[x]);
          for (int64_t d = 0; d < dv_n; ++d) o[d] += s[x] * to_float(v[d]);
        }
        double big_d = 0;
        for (int64_t d = 0; d < dv_n; ++d) big_d += static_cast<double>(go[d]) * o[d];
        if (!g.dsink.empty()) g.dsink[static_cast<size_t>(h)] -= e_sink / l * big_d;
        double* dq = &g.dq[index(p.q_heads, p.q_len, d_n, b, h, i)];
        for (size_t x = 0; x < keys.size(); ++x) {
          const int64_t j = keys[x];
          const E* k = in.k.row(b, hk, j);
          const E* v = in.v.row(b, hk, j);
          double dp = 0;
          for (int64_t d = 0; d < dv_n; ++d) dp += static_cast<double>(go[d]) * to_float(v[d]);
          const double ds = s[x] * (dp - big_d) * cap[x];
          double* dk = &g.dk[index(p.kv_heads, p.kv_len, d_n, b, hk, j)];
          double* dv = &g.dv[index(p.kv_heads, p.kv_len, dv_n, b, hk, j)];
          for (int64_t d = 0; d < d_n; ++d) {
            dq[d] += scale * ds * to_float(k[d]);
            dk[d] += scale * ds * to_float(q[d]);
          }
          for (int64_t d = 0; d < dv_n; ++d) dv[d] += s[x] * go[d];
        }
      }
    }
  }
}

// max |g - ref| / max |ref| over one tensor (heads x seq rows of dim values per batch entry).
double tensor_error(const std::vector<double>& ref, const View4<float>& g, int64_t batch, int64_t heads, int64_t seq,
                    int64_t dim) {
  double worst = 0, size = 0;
  for (double r : ref)
    if (std::isfinite(r)) size = std::max(size, std::fabs(r));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t s = 0; s < seq; ++s) {
        const float* row = g.row(b, h, s);
        const double* want = &ref[index(heads, seq, dim, b, h, s)];
        for (int64_t d = 0; d < dim; ++d) worst = std::max(worst, value_error(row[d], want[d]));
      }
  if (worst == 0) return 0;
  return std::isinf(worst) ? kInf : worst / std::max(size, 1e-30);
}

}  // namespace

void check_backward_problem(const Problem& p) {
  if (p.kv_quantized() || p.kv_paged()) {
    throw InvalidInput("backward: kv_dtype " + std::string(to_string(p.kv_dtype)) + ", kv_block " +
                       std::to_string(p.kv_block) +
                       "; allowed: kv_dtype dtype and kv_block 0 (quantized and paged caches are inference "
                       "caches: the backward pass reads K and V as f32, bf16 or f16)");
  }
}

GradientTensors allocate_gradients(const Problem& p) {
  GradientTensors t;
  t.dq = alloc_floats(static_cast<size_t>(p.q_elems()));
  t.dk = alloc_floats(static_cast<size_t>(p.kv_elems()));
  t.dv = alloc_floats(static_cast<size_t>(p.v_elems()));
  t.grads.dq = make_view(t.dq.get(), p.batch, p.q_heads, p.q_len, p.head_dim, p.layout);
  t.grads.dk = make_view(t.dk.get(), p.batch, p.kv_heads, p.kv_len, p.head_dim, p.layout);
  t.grads.dv = make_view(t.dv.get(), p.batch, p.kv_heads, p.kv_len, p.dim_v(), p.layout);
  if (!p.sink_logits.empty()) {
    t.dsink = alloc_floats(static_cast<size_t>(p.q_heads));
    t.grads.dsink = t.dsink.get();
  }
  return t;
}

ReferenceGrads reference_backward(const Problem& p, const Inputs& in, const ConstView& d_o) {
  check_backward_problem(p);
  ReferenceGrads g;
  g.dq.assign(static_cast<size_t>(p.q_elems()), 0.0);
  g.dk.assign(static_cast<size_t>(p.kv_elems()), 0.0);
  g.dv.assign(static_cast<size_t>(p.v_elems()), 0.0);
  if (!p.sink_logits.empty()) g.dsink.assign(static_cast<size_t>(p.q_heads), 0.0);
  visit_inputs(in, [&](const auto& typed) { reference_typed(p, typed, d_o, g); });
  return g;
}

GradErrors measure_grads(const ReferenceGrads& ref, const Gradients& g, const Problem& p) {
  GradErrors e;
  e.dq = tensor_error(ref.dq, g.dq, p.batch, p.q_heads, p.q_len, p.head_dim);
  e.dk = tensor_error(ref.dk, g.dk, p.batch, p.kv_heads, p.kv_len, p.head_dim);
  e.dv = tensor_error(ref.dv, g.dv, p.batch, p.kv_heads, p.kv_len, p.dim_v());
  if (!ref.dsink.empty()) {
    const View4<float> heads{g.dsink, 1, 1, 1, p.q_heads, 0, 0, p.q_heads};  // one row of q_heads values
    e.dsink = g.dsink ? tensor_error(ref.dsink, heads, 1, 1, 1, p.q_heads) : kInf;
  }
  return e;
}

GradErrors textbook_backward_errors(const Problem& p, const Inputs& in, const ConstView& d_o,
                                    const ReferenceGrads& ref) {
  check_backward_problem(p);
  // The textbook forward's O and LSE, then its backward: what naive's backward computes.
  Tensors out = allocate_outputs(p);
  GradientTensors g = allocate_gradients(p);
  std::vector<float> s(static_cast<size_t>(p.kv_len));
  visit_inputs(in, [&](const auto& typed) {
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.q_heads; ++h)
        for (int64_t i = 0; i < p.q_len; ++i) {
          const std::vector<int64_t> keys = reference_keys(p, {b, h, i});
          const textbook::KeyList list{keys.data(), static_cast<int64_t>(keys.size())};
          float* o = out.outputs.o.row(b, h, i);
          const float lse = textbook::row(p, typed, b, h, i, list, s.data(), o);
          textbook::backward_row(p, typed, b, h, i, list, o, lse, d_o.row(b, h, i), s.data(), g.grads.dq.row(b, h, i),
                                 g.grads.dk, g.grads.dv, g.grads.dsink ? g.grads.dsink + h : nullptr);
        }
  });
  return measure_grads(ref, g.grads, p);
}

GradTolerance GradTolerance::from_baseline(const GradErrors& baseline) {
  // A NaN in the inputs makes a baseline infinite; keep the tolerance finite (verify.hpp).
  const auto tol = [](double e) { return Tolerance::kFactor * (std::isfinite(e) ? e : 0.0) + Tolerance::kFloor; };
  return {tol(baseline.dq), tol(baseline.dk), tol(baseline.dv), tol(baseline.dsink)};
}

std::string GradTolerance::why_failed(const GradErrors& e) const {
  std::ostringstream s;
  const auto check = [&](const char* name, double err, double tol) {
    if (err <= tol) return;
    if (s.tellp() > 0) s << "; ";
    s << name << " error " << err << " (relative to the tensor's largest reference value) > tolerance " << tol;
  };
  check("dQ", e.dq, dq);
  check("dK", e.dk, dk);
  check("dV", e.dv, dv);
  check("dsink", e.dsink, dsink);
  return s.str();
}

BackwardAgreement prepare_backward_agreement(const Problem& p, const Inputs& in, const ConstView& d_o) {
  BackwardAgreement a;
  a.ref = reference_backward(p, in, d_o);
  a.baseline = textbook_backward_errors(p, in, d_o, a.ref);
  a.tol = GradTolerance::from_baseline(a.baseline);
  return a;
}

namespace {

// A Session made for the backward: the kernel's forward, then its backward on gradients
// pre-filled with NaN, measured by `judge(out, grads, check)`.
template <class Judge>
BackwardCheck run_backward_check(const Kernel& k, const Problem& p, const Inputs& in, const ConstView& d_o, int threads,
                                 Judge judge) {
  BackwardCheck c;
  c.kernel = std::string(k.name());
  if (Support s = can_run(k, p, threads, true); !s) {
    c.reason = s.reason;
    return c;
  }
  Tensors out = allocate_outputs(p);
  Session session(k, p, threads, true);
  session.run(in, out.outputs);
  GradientTensors g = allocate_gradients(p);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::fill(g.dq.get(), g.dq.get() + p.q_elems(), nan);
  std::fill(g.dk.get(), g.dk.get() + p.kv_elems(), nan);
  std::fill(g.dv.get(), g.dv.get() + p.v_elems(), nan);
  if (g.dsink) std::fill(g.dsink.get(), g.dsink.get() + p.q_heads, nan);
  session.run_backward(in, {d_o, as_const(out.outputs.o), out.outputs.lse}, g.grads);
  judge(out.outputs, g.grads, c);
  c.reason = c.tol.why_failed(c.errors);
  c.verdict = c.reason.empty() ? Verdict::Pass : Verdict::Fail;
  return c;
}

// The sampled gradients in T (double: the reference; float: the baseline), by the formulas of
// backward.hpp given O and LSE. D_i for every row first (dK_j and dV_j read every row).
template <class T, class E>
void sampled_typed(const Problem& p, const TypedInputs<E>& in, const ConstView& d_o, const ConstView& o,
                   const float* lse, const GradSample& s, std::vector<T>& dq, std::vector<T>& dk, std::vector<T>& dv) {
  const int64_t d_n = p.head_dim, dv_n = p.dim_v();
  const T scale = static_cast<T>(p.effective_scale());
  std::vector<T> big_d(static_cast<size_t>(p.lse_elems()));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.q_heads; ++h)
      for (int64_t i = 0; i < p.q_len; ++i) {
        T sum = 0;
        for (int64_t d = 0; d < dv_n; ++d) sum += static_cast<T>(d_o.row(b, h, i)[d]) * o.row(b, h, i)[d];
        big_d[static_cast<size_t>((b * p.q_heads + h) * p.q_len + i)] = sum;
      }
  // P_ij and dS_ij of one visible pair.
  const auto pair = [&](int64_t b, int64_t h, int64_t i, int64_t j, T& pij, T& ds) {
    const int64_t hk = p.kv_head_of(h);
    const E* q = in.q.row(b, h, i);
    const E* k = in.k.row(b, hk, j);
    const E* v = in.v.row(b, hk, j);
    const float* go = d_o.row(b, h, i);
    T dot = 0, dp = 0;
    for (int64_t d = 0; d < d_n; ++d) dot += static_cast<T>(to_float(q[d])) * static_cast<T>(to_float(k[d]));
    for (int64_t d = 0; d < dv_n; ++d) dp += static_cast<T>(go[d]) * static_cast<T>(to_float(v[d]));
    const size_t r = static_cast<size_t>((b * p.q_heads + h) * p.q_len + i);
    pij = std::exp(scale * dot - static_cast<T>(lse[r]));
    ds = pij * (dp - big_d[r]);
  };
  dq.assign(s.rows.size() * static_cast<size_t>(d_n), T(0));
  for (size_t x = 0; x < s.rows.size(); ++x) {
    const RowId& r = s.rows[x];
    const Interval iv = p.visible(r.b, r.i);
    T* out = &dq[x * static_cast<size_t>(d_n)];
    for (int64_t j = iv.lo; j < iv.hi; ++j) {
      T pij, ds;
      pair(r.b, r.h, r.i, j, pij, ds);
      const E* k = in.k.row(r.b, p.kv_head_of(r.h), j);
      for (int64_t d = 0; d < d_n; ++d) out[d] += scale * ds * static_cast<T>(to_float(k[d]));
    }
  }
  dk.assign(s.keys.size() * static_cast<size_t>(d_n), T(0));
  dv.assign(s.keys.size() * static_cast<size_t>(dv_n), T(0));
  for (size_t x = 0; x < s.keys.size(); ++x) {
    const RowId& key = s.keys[x];  // (b, kv head, j)
    const MaskSpec mask = p.mask_for_batch(key.b);
    T* gk = &dk[x * static_cast<size_t>(d_n)];
    T* gv = &dv[x * static_cast<size_t>(dv_n)];
    for (int64_t h = key.h * p.group(); h < (key.h + 1) * p.group(); ++h)
      for (int64_t i = 0; i < p.q_len; ++i) {
        const Interval iv = mask.row(i);
        if (key.i < iv.lo || key.i >= iv.hi) continue;
        T pij, ds;
        pair(key.b, h, i, key.i, pij, ds);
        const E* q = in.q.row(key.b, h, i);
        const float* go = d_o.row(key.b, h, i);
        for (int64_t d = 0; d < d_n; ++d) gk[d] += scale * ds * static_cast<T>(to_float(q[d]));
        for (int64_t d = 0; d < dv_n; ++d) gv[d] += pij * static_cast<T>(go[d]);
      }
  }
}

// max |got - want| / max |want| over a sampled tensor (rows of `dim` values; got read by `row`).
template <class T, class Row>
double sampled_error(const std::vector<double>& want, const std::vector<RowId>& ids, int64_t dim, Row row) {
  double worst = 0, size = 0;
  for (double r : want)
    if (std::isfinite(r)) size = std::max(size, std::fabs(r));
  for (size_t x = 0; x < ids.size(); ++x) {
    const T* got = row(ids[x]);
    for (int64_t d = 0; d < dim; ++d)
      worst = std::max(worst, value_error(static_cast<double>(got[d]), want[x * static_cast<size_t>(dim) + d]));
  }
  if (worst == 0) return 0;
  return std::isinf(worst) ? kInf : worst / std::max(size, 1e-30);
}

}  // namespace

BackwardCheck check_backward(const Kernel& k, const Problem& p, const Inputs& in, const ConstView& d_o,
                             const BackwardAgreement& a, int threads) {
  return run_backward_check(k, p, in, d_o, threads, [&](const Outputs&, const Gradients& g, BackwardCheck& c) {
    c.errors = measure_grads(a.ref, g, p);
    c.tol = a.tol;
  });
}

GradSample sample_grads(const Problem& p, size_t max_rows, uint64_t seed) {
  GradSample s;
  s.rows = sample_rows(p, max_rows, seed);
  Problem keys = p;  // the keys as rows: (batch, kv heads, kv_len)
  keys.q_heads = p.kv_heads;
  keys.q_len = p.kv_len;
  s.keys = sample_rows(keys, max_rows, seed + 1);
  return s;
}

SampledGradAgreement prepare_sampled_backward(const Problem& p, const Inputs& in, const ConstView& d_o,
                                              const ConstView& o, const float* lse, GradSample sample) {
  check_backward_problem(p);
  if (p.sparse()) {
    throw InvalidInput("sampled backward check: a sparse pattern (" + p.pattern_name() +
                       "); allowed: interval masks (the full check, check_backward, takes every pattern)");
  }
  if (p.score_mods()) {
    throw InvalidInput("sampled backward check: score modifications (" + p.score_mod_name() +
                       "); allowed: none (the full check, check_backward, takes them)");
  }
  SampledGradAgreement a;
  a.sample = std::move(sample);
  std::vector<float> fq, fk, fv;
  visit_inputs(in, [&](const auto& typed) {
    sampled_typed<double>(p, typed, d_o, o, lse, a.sample, a.dq, a.dk, a.dv);
    sampled_typed<float>(p, typed, d_o, o, lse, a.sample, fq, fk, fv);
  });
  // The baseline's rows are stored in sample order: index them by position.
  const auto at = [](const std::vector<float>& v, int64_t dim) {
    return [&v, dim, x = size_t{0}](const RowId&) mutable { return v.data() + (x++) * static_cast<size_t>(dim); };
  };
  a.baseline.dq = sampled_error<float>(a.dq, a.sample.rows, p.head_dim, at(fq, p.head_dim));
  a.baseline.dk = sampled_error<float>(a.dk, a.sample.keys, p.head_dim, at(fk, p.head_dim));
  a.baseline.dv = sampled_error<float>(a.dv, a.sample.keys, p.dim_v(), at(fv, p.dim_v()));
  a.tol = GradTolerance::from_baseline(a.baseline);
  return a;
}

GradErrors measure_sampled_grads(const SampledGradAgreement& a, const Gradients& g, const Problem& p) {
  GradErrors e;
  e.dq = sampled_error<float>(a.dq, a.sample.rows, p.head_dim, [&](const RowId& r) { return g.dq.row(r.b, r.h, r.i); });
  e.dk = sampled_error<float>(a.dk, a.sample.keys, p.head_dim, [&](const RowId& r) { return g.dk.row(r.b, r.h, r.i); });
  e.dv = sampled_error<float>(a.dv, a.sample.keys, p.dim_v(), [&](const RowId& r) { return g.dv.row(r.b, r.h, r.i); });
  return e;
}

BackwardCheck check_backward_sampled(const Kernel& k, const Problem& p, const Inputs& in, const ConstView& d_o,
                                     const GradSample& sample, int threads) {
  return run_backward_check(k, p, in, d_o, threads, [&](const Outputs& out, const Gradients& g, BackwardCheck& c) {
    const SampledGradAgreement a = prepare_sampled_backward(p, in, d_o, as_const(out.o), out.lse, sample);
    c.errors = measure_sampled_grads(a, g, p);
    c.tol = a.tol;
  });
}

}  // namespace attnlab
