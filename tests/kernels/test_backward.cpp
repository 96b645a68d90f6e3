// The backward pass (backward.hpp): the float64 reference gradients against central finite
// differences of the float64 forward (masks, GQA, kv_lens, d_v != d, a sparse pattern), the naive
// kernel's backward against the reference over odd sizes, masks, GQA/MQA, layouts and dtypes, NaN
// in Q, K, V and dO following the reference, planted bugs failing, and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attnlab/backward.hpp"
#include "attnlab/kernel.hpp"
#include "attnlab/blocks/textbook.hpp"
#include "attnlab/verify.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

// Inputs on a grid of 2^-6 in [-1, 1), so x +- 2^-10 is exact in float32 (finite differences).
void on_grid(float* x, int64_t n, uint64_t seed) {
  fill_uniform(x, n, seed);
  for (int64_t i = 0; i < n; ++i) x[i] = std::round(x[i] * 64.f) / 64.f;
}

struct Case {
  Problem p;
  Tensors t;
  std::vector<float> d_o;
  ConstView d_o_view;
};
Case make_case(Problem p, uint64_t seed) {
  p.validate();
  Case c{p, random_tensors(p, seed), std::vector<float>(static_cast<size_t>(p.o_elems())), {}};
  if (p.dtype == DType::F32) {
    on_grid(c.t.q.get(), p.q_elems(), seed + 1);
    on_grid(c.t.k.get(), p.kv_elems(), seed + 2);
    on_grid(c.t.v.get(), p.v_elems(), seed + 3);
  }
  on_grid(c.d_o.data(), p.o_elems(), seed + 4);
  c.d_o_view = make_view<const float>(c.d_o.data(), p.batch, p.q_heads, p.q_len, p.dim_v(), p.layout);
  return c;
}

// L = sum dO * O over every row, O the float64 reference forward.
double loss(const Case& c) {
  const Reference r = reference(c.p, c.t.inputs);
  double l = 0;
  for (size_t x = 0; x < r.rows.size(); ++x) {
    const float* go = c.d_o_view.row(r.rows[x].b, r.rows[x].h, r.rows[x].i);
    for (int64_t d = 0; d < r.dim; ++d) l += go[d] * r.o[x * r.dim + d];
  }
  return l;
}

Problem small(int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d, int64_t dv = 0) {
  Problem p = test::shape(b, hq, hkv, sq, sk, d);
  p.head_dim_v = dv;
  return p;
}

TEST(Backward, ReferenceIsTheGradientOfTheForward) {
  std::vector<Problem> ps;
  ps.push_back(small(1, 2, 2, 4, 6, 5));        // MHA, no mask
  ps.push_back(small(2, 4, 2, 5, 7, 4, 3));     // GQA 2, d_v != d
  ps.back().causal = CausalAlign::BottomRight;  // and kv_lens cutting one sequence
  ps.back().kv_lens = {7, 4};
  ps.push_back(small(1, 3, 1, 6, 6, 4));  // MQA, a window
  ps.back().window_left = 2, ps.back().window_right = 1;
  ps.push_back(small(1, 2, 1, 6, 9, 4));  // StreamingLLM: sinks + window (a sparse pattern)
  ps.back().sinks = 2, ps.back().window_left = 2, ps.back().window_right = 0;
  ps.push_back(small(2, 2, 2, 3, 5, 4));  // a fully masked sequence: kv_lens 0
  ps.back().kv_lens = {5, 0};
  const float eps = 1.f / 1024;
  for (const Problem& p : ps) {
    Case c = make_case(p, 11);
    const ReferenceGrads g = reference_backward(p, c.t.inputs, c.d_o_view);
    const auto check = [&](float* x, int64_t n, const std::vector<double>& want, const View4<float>& view,
                           const char* what) {
      // want is (b, h, s, d) ordered; x is in the problem's layout: walk the view to pair them.
      int64_t at = 0;
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t h = 0; h < view.heads; ++h)
          for (int64_t s = 0; s < view.seq; ++s)
            for (int64_t d = 0; d < view.dim; ++d, ++at) {
              float* e = view.row(b, h, s) + d;
              const float keep = *e;
              *e = keep + eps;
              const double up = loss(c);
              *e = keep - eps;
              const double down = loss(c);
              *e = keep;
              const double fd = (up - down) / (2.0 * eps);
              ASSERT_NEAR(fd, want[static_cast<size_t>(at)], 2e-5 + 1e-4 * std::fabs(fd))
                  << what << " (b=" << b << ", h=" << h << ", s=" << s << ", d=" << d << ") of " << p.describe();
            }
      ASSERT_EQ(at, n);
    };
    const auto mut = [&](float* data, int64_t heads, int64_t seq, int64_t dim) {
      return make_view(data, p.batch, heads, seq, dim, p.layout);
    };
    check(c.t.q.get(), p.q_elems(), g.dq, mut(c.t.q.get(), p.q_heads, p.q_len, p.head_dim), "dQ");
    check(c.t.k.get(), p.kv_elems(), g.dk, mut(c.t.k.get(), p.kv_heads, p.kv_len, p.head_dim), "dK");
    check(c.t.v.get(), p.v_elems(), g.dv, mut(c.t.v.get(), p.kv_heads, p.kv_len, p.dim_v()), "dV");
  }
}

// The kernel's forward, then its backward, against the reference (verify.hpp's check_backward).
BackwardCheck check(const Kernel& k, const Case& c, int threads = 2) {
  return check_backward(k, c.p, c.t.inputs, c.d_o_view, prepare_backward_agreement(c.p, c.t.inputs, c.d_o_view),
                        threads);
}

std::vector<Problem> grid() {
  std::vector<Problem> ps;
  for (Layout layout : {Layout::BHSD, Layout::BSHD})
    for (int mask = 0; mask < 6; ++mask)
      for (auto [hq, hkv] : {std::pair{4, 4}, std::pair{6, 2}, std::pair{3, 1}}) {
        Problem p = small(2, hq, hkv, 13, 37, 24, mask == 3 ? 20 : 0);
        p.layout = layout;
        switch (mask) {
          case 1: p.causal = CausalAlign::BottomRight; break;
          case 2: p.causal = CausalAlign::TopLeft; break;
          case 3: p.window_left = 5, p.window_right = 2; break;  // and d_v != d
          case 4: p.causal = CausalAlign::BottomRight, p.kv_lens = {29, 0}; break;
          case 5: p.sinks = 3, p.window_left = 6, p.window_right = 0; break;
        }
        ps.push_back(p);
      }
  return ps;
}

// Sparse patterns over several 64-row and 64-key tiles, so flash's backward meets empty, full and
// partial tile pairs of each (Pattern::classify): documents, Longformer (a window, global
// positions), BigBird blocks, a dilated window, a mask file (a random third of the pairs).
std::vector<Problem> sparse_tiles() {
  std::vector<Problem> ps;
  Problem p = small(1, 4, 2, 150, 150, 24);
  p.causal = CausalAlign::BottomRight, p.doc_lens = {40, 75, 35};
  ps.push_back(p);
  p = small(2, 2, 2, 140, 140, 16, 8);
  p.window_left = p.window_right = 20, p.globals = {3, 90};
  ps.push_back(p);
  p = small(1, 3, 1, 130, 130, 16);
  p.window_left = p.window_right = 8, p.bigbird = BigBird{16, 2, 5};
  ps.push_back(p);
  p = small(1, 2, 1, 160, 160, 16);
  p.causal = CausalAlign::BottomRight, p.window_left = 60, p.dilation = 3;
  ps.push_back(p);
  p = small(1, 2, 2, 100, 130, 16);
  auto m = std::make_shared<BoolMask>();
  m->q_len = 100, m->kv_len = 130, m->source = "test";
  uint64_t x = 7;
  for (int64_t e = 0; e < 100 * 130; ++e) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    m->data.push_back((x >> 33) % 3 == 0);
  }
  p.mask = m;
  ps.push_back(p);
  return ps;
}

// Every kernel variant with a backward pass that this CPU runs (naive; flash per target).
std::vector<const Kernel*> backward_kernels() {
  std::vector<const Kernel*> out;
  for (const Kernel* k : variants())
    if (k->capabilities().backward && k->available()) out.push_back(k);
  return out;
}

TEST(Backward, EveryKernelAgreesWithTheReference) {
  std::vector<Problem> ps = grid();
  ps.push_back(small(1, 4, 2, 130, 200, 64));  // several 64-row and 64-key tiles, causal
  ps.back().causal = CausalAlign::BottomRight;
  ps.push_back(small(1, 2, 1, 70, 65, 128, 96));  // q_len > kv_len, top-left: rows with no key
  ps.back().causal = CausalAlign::TopLeft, ps.back().layout = Layout::BSHD;
  for (Problem p : sparse_tiles()) ps.push_back(p);
  for (const Kernel* k : backward_kernels())
    for (DType dtype : {DType::F32, DType::BF16, DType::F16})
      for (Problem p : ps) {
        p.dtype = dtype;
        if (!k->backward_supports(p)) continue;  // flash: interval masks only
        const Case c = make_case(p, 5);
        const BackwardCheck r = check(*k, c);
        EXPECT_EQ(r.verdict, Verdict::Pass) << test::variant_name(*k) << " " << p.describe() << ": " << r.reason;
        EXPECT_LT(r.errors.dq, 1e-5) << test::variant_name(*k) << " " << p.describe();  // small, not zero
      }
}

// A sparse pattern's partial tile pair: a NaN in a key, value, query or dO that a hidden pair
// inside the row's hull touches must not leak (masked_axpys multiplies only visible pairs).
TEST(Backward, NanBehindASparsePatternsHoleStaysOut) {
  Problem p = small(1, 2, 1, 70, 70, 16);
  p.causal = CausalAlign::BottomRight, p.doc_lens = {30, 40};  // rows 30.. do not see keys < 30
  for (const Kernel* k : backward_kernels())
    for (int where = 0; where < 3; ++where) {
      Case c = make_case(p, 4);
      const float nan = std::numeric_limits<float>::quiet_NaN();
      if (where == 0) c.t.k.get()[16 * 10 + 2] = nan;  // key 10: hidden from document 2's rows
      if (where == 1) c.t.v.get()[16 * 12 + 5] = nan;
      if (where == 2) c.t.q.get()[16 * 20 + 1] = nan;  // row 20 of head 0: its dK only for keys <= 20
      const BackwardCheck r = check(*k, c);
      EXPECT_EQ(r.verdict, Verdict::Pass) << test::variant_name(*k) << ", NaN " << where << ": " << r.reason;
    }
}

TEST(Backward, NanInAnyInputFollowsTheReference) {
  Problem p = small(1, 4, 2, 9, 21, 16);
  p.causal = CausalAlign::BottomRight;
  for (const Kernel* k : backward_kernels())
    for (int where = 0; where < 5; ++where) {
      Case c = make_case(p, 9);
      const float nan = std::numeric_limits<float>::quiet_NaN();
      if (where == 0) c.t.q.get()[5] = nan;
      if (where == 1) c.t.k.get()[16 * 7 + 3] = nan;  // key 7 of kv head 0: seen by later rows only
      if (where == 2) c.t.v.get()[16 * 20 + 1] = nan;
      if (where == 3) c.d_o[16 * 4 + 2] = nan;
      if (where == 4) c.t.k.get()[16 * 20 + 1] = nan;  // key 20: seen by the last row only
      const BackwardCheck r = check(*k, c);
      EXPECT_EQ(r.verdict, Verdict::Pass) << test::variant_name(*k) << ", NaN in input " << where << ": " << r.reason;
    }
}

// Every gradient element has one owner summing in a fixed order: any thread count, the same bits.
// With 4 (batch, kv head) pairs flash runs its fused pass at 1 and 2 threads and the two passes
// at 3 (backward_tiles.cpp, fused()): the same bits either way.
TEST(Backward, FlashIsBitwiseTheSameForAnyThreadCount) {
  Problem p = small(2, 6, 2, 150, 180, 40, 24);
  p.causal = CausalAlign::BottomRight, p.kv_lens = {180, 77};
  const Case c = make_case(p, 2);
  for (const Kernel* k : backward_kernels()) {
    std::vector<std::vector<float>> runs;
    for (int threads : {1, 2, 3}) {
      Tensors out = allocate_outputs(p);
      Session s(*k, p, threads, true);
      s.run(c.t.inputs, out.outputs);
      GradientTensors g = allocate_gradients(p);
      s.run_backward(c.t.inputs, {c.d_o_view, as_const(out.outputs.o), out.outputs.lse}, g.grads);
      std::vector<float> all(g.dq.get(), g.dq.get() + p.q_elems());
      all.insert(all.end(), g.dk.get(), g.dk.get() + p.kv_elems());
      all.insert(all.end(), g.dv.get(), g.dv.get() + p.v_elems());
      runs.push_back(std::move(all));
    }
    for (size_t x = 1; x < runs.size(); ++x)
      EXPECT_EQ(0, std::memcmp(runs[0].data(), runs[x].data(), runs[0].size() * sizeof(float)))
          << test::variant_name(*k);
  }
}

// flash's backward reads a sparse pattern's rule from its session's plan (made outside the timed
// call, counted in plan_bytes); handed none (a wrapper without make_backward_plan), it builds the
// rule inside the call - the same gradients, bit for bit.
class WithoutBackwardPlan final : public test::Wrapped {
 public:
  using Wrapped::Wrapped;
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    inner_.run(p, in, out, ctx);
  }
  void run_backward(const Problem& p, const Inputs& in, const BackwardInputs& bw, const Gradients& g,
                    RunContext& ctx) const override {
    EXPECT_EQ(ctx.plan, nullptr);
    inner_.run_backward(p, in, bw, g, ctx);
  }
};

TEST(Backward, ThePatternIsTheSessionsPlanAndTheSameBitsWithout) {
  Problem p = small(1, 4, 2, 150, 150, 24);
  p.window_left = p.window_right = 20, p.globals = {3, 90};
  const Case c = make_case(p, 5);
  int flash_variants = 0;
  for (const Kernel* k : backward_kernels()) {
    if (k->name() != "flash") continue;
    ++flash_variants;
    const WithoutBackwardPlan bare(*k);
    EXPECT_GT(Session(*k, p, 2, true).plan_bytes(), Session(*k, p, 2).plan_bytes()) << test::variant_name(*k);
    std::vector<float> grads[2];
    for (int x = 0; x < 2; ++x) {
      Tensors out = allocate_outputs(p);
      Session s(x ? static_cast<const Kernel&>(bare) : *k, p, 2, true);
      s.run(c.t.inputs, out.outputs);
      GradientTensors g = allocate_gradients(p);
      s.run_backward(c.t.inputs, {c.d_o_view, as_const(out.outputs.o), out.outputs.lse}, g.grads);
      grads[x].assign(g.dq.get(), g.dq.get() + p.q_elems());
      grads[x].insert(grads[x].end(), g.dk.get(), g.dk.get() + p.kv_elems());
      grads[x].insert(grads[x].end(), g.dv.get(), g.dv.get() + p.v_elems());
    }
    EXPECT_EQ(0, std::memcmp(grads[0].data(), grads[1].data(), grads[0].size() * sizeof(float)))
        << test::variant_name(*k);
  }
  EXPECT_GT(flash_variants, 0);
}

// A bug planted in the textbook backward (one switch, the test's own copy of the row rule).
enum class Bug { DFromUnnormalizedO, DkMissingScale, GqaWrongKvHead, MaskedPairLeaks };
class Planted final : public test::Wrapped {
 public:
  Planted(const Kernel& inner, Bug bug) : Wrapped(inner), bug_(bug) {}
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    inner_.run(p, in, out, ctx);
  }
  void run_backward(const Problem& p, const Inputs& in, const BackwardInputs& bw, const Gradients& g,
                    RunContext&) const override {
    for (const MutView* t : {&g.dk, &g.dv})
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t h = 0; h < p.kv_heads; ++h)
          for (int64_t s = 0; s < p.kv_len; ++s) std::fill(t->row(b, h, s), t->row(b, h, s) + t->dim, 0.f);
    const TypedInputs<float> x = typed<float>(in);
    const float scale = p.effective_scale();
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.q_heads; ++h)
        for (int64_t i = 0; i < p.q_len; ++i) {
          Interval iv = p.visible(b, i);
          if (bug_ == Bug::MaskedPairLeaks && iv.hi < p.kv_len && !iv.empty()) ++iv.hi;  // one hidden key
          const int64_t hk = (p.kv_head_of(h) + (bug_ == Bug::GqaWrongKvHead && h % p.group() == 1)) % p.kv_heads;
          const float* q = x.q.row(b, h, i);
          const float* o = bw.o.row(b, h, i);
          const float* go = bw.d_o.row(b, h, i);
          const float lse = bw.lse[(b * p.q_heads + h) * p.q_len + i];
          float* dq = g.dq.row(b, h, i);
          std::fill(dq, dq + p.head_dim, 0.f);
          float big_d = 0.f;
          for (int64_t d = 0; d < p.dim_v(); ++d) big_d += go[d] * o[d];
          // D from O before its division by the softmax sum l_i = sum_j exp(S_ij - m_i): a shift m_i
          // below the LSE gives l_i > 1 (here m_i = LSE - log n, so l_i = n, the row's key count).
          if (bug_ == Bug::DFromUnnormalizedO) big_d *= static_cast<float>(iv.size());
          for (int64_t j = iv.lo; j < iv.hi; ++j) {
            const float* k = x.k.row(b, p.kv_head_of(h), j);
            const float* v = x.v.row(b, p.kv_head_of(h), j);
            float dot = 0.f, dp = 0.f;
            for (int64_t d = 0; d < p.head_dim; ++d) dot += q[d] * k[d];
            for (int64_t d = 0; d < p.dim_v(); ++d) dp += go[d] * v[d];
            const float pj = std::exp(scale * dot - lse), ds = pj * (dp - big_d);
            const float ks = bug_ == Bug::DkMissingScale ? 1.f : scale;
            for (int64_t d = 0; d < p.head_dim; ++d) {
              dq[d] += scale * ds * k[d];
              g.dk.row(b, hk, j)[d] += ks * ds * q[d];
            }
            for (int64_t d = 0; d < p.dim_v(); ++d) g.dv.row(b, hk, j)[d] += pj * go[d];
          }
        }
  }

 private:
  Bug bug_;
};

TEST(Backward, PlantedBugsFail) {
  const Kernel& naive = kernel_or_throw("naive");
  Problem p = small(2, 4, 2, 11, 19, 16);
  p.causal = CausalAlign::BottomRight;
  const Case c = make_case(p, 3);
  for (Bug bug : {Bug::DFromUnnormalizedO, Bug::DkMissingScale, Bug::GqaWrongKvHead, Bug::MaskedPairLeaks}) {
    const Planted planted(naive, bug);
    const BackwardCheck r = check(planted, c);
    EXPECT_EQ(r.verdict, Verdict::Fail) << "bug " << static_cast<int>(bug) << ": " << r.reason;
  }
}

// The sampled check (sweeps): with every row and key sampled its reference equals the full
// one's (its O and LSE are the kernel's float32 forward's: within float32 of float64's), it
// passes the kernels, and every planted bug fails it on a sample of a fifth of the rows and keys.
TEST(Backward, TheSampledCheckAgreesWithTheFullOneAndCatchesThePlantedBugs) {
  std::vector<Problem> ps = {small(2, 4, 2, 11, 19, 16), small(1, 2, 1, 70, 65, 128, 96), small(1, 6, 2, 33, 40, 24)};
  ps[0].causal = CausalAlign::BottomRight;
  ps[1].causal = CausalAlign::TopLeft, ps[1].layout = Layout::BSHD;  // rows with no key
  ps[2].window_left = 5, ps[2].window_right = 3;
  const Kernel& flash = kernel_or_throw("flash");
  for (const Problem& p : ps) {
    const Case c = make_case(p, 11);
    const ReferenceGrads full = reference_backward(p, c.t.inputs, c.d_o_view);
    Tensors out = allocate_outputs(p);
    Session(flash, p, 1).run(c.t.inputs, out.outputs);
    const GradSample every = sample_grads(p, 1 << 20, 1);
    ASSERT_EQ(every.rows.size(), static_cast<size_t>(p.batch * p.q_heads * p.q_len));
    ASSERT_EQ(every.keys.size(), static_cast<size_t>(p.batch * p.kv_heads * p.kv_len));
    const SampledGradAgreement a =
        prepare_sampled_backward(p, c.t.inputs, c.d_o_view, as_const(out.outputs.o), out.outputs.lse, every);
    // Both sample lists are in (b, h, s) order, as the full reference's rows.
    double worst = 0, size = 0;
    const auto compare = [&](const std::vector<double>& x, const std::vector<double>& y) {
      ASSERT_EQ(x.size(), y.size());
      for (size_t n = 0; n < x.size(); ++n) {
        worst = std::max(worst, std::fabs(x[n] - y[n]));
        size = std::max(size, std::fabs(y[n]));
      }
    };
    compare(a.dq, full.dq);
    compare(a.dk, full.dk);
    compare(a.dv, full.dv);
    EXPECT_LT(worst, 1e-5 * size) << p.describe();
    EXPECT_GT(size, 0) << p.describe();
    for (const Kernel* k : backward_kernels()) {
      if (!k->backward_supports(p)) continue;
      const BackwardCheck r = check_backward_sampled(*k, p, c.t.inputs, c.d_o_view, sample_grads(p, 20, 3), 2);
      EXPECT_EQ(r.verdict, Verdict::Pass) << test::variant_name(*k) << " " << p.describe() << ": " << r.reason;
    }
  }
  const Kernel& naive = kernel_or_throw("naive");
  const Case c = make_case(ps[0], 3);
  const GradSample fifth = sample_grads(ps[0], 20, 5);
  ASSERT_LT(fifth.rows.size(), static_cast<size_t>(ps[0].batch * ps[0].q_heads * ps[0].q_len) / 2);
  for (Bug bug : {Bug::DFromUnnormalizedO, Bug::DkMissingScale, Bug::GqaWrongKvHead, Bug::MaskedPairLeaks}) {
    const Planted planted(naive, bug);
    const BackwardCheck r = check_backward_sampled(planted, ps[0], c.t.inputs, c.d_o_view, fifth, 1);
    EXPECT_EQ(r.verdict, Verdict::Fail) << "bug " << static_cast<int>(bug) << ": " << r.reason;
  }
  Problem sparse = ps[0];
  sparse.sinks = 2, sparse.window_left = 2;
  const Case sc = make_case(sparse, 3);
  Tensors out = allocate_outputs(sparse);
  EXPECT_THROW(
      prepare_sampled_backward(sparse, sc.t.inputs, sc.d_o_view, as_const(out.outputs.o), out.outputs.lse, fifth),
      InvalidInput);
}

TEST(Backward, KernelsWithoutItAndInferenceCachesAreRefused) {
  const Problem p = small(1, 2, 2, 4, 8, 16);
  try {
    Session s(kernel_or_throw("decode"), p, 1, true);
    FAIL() << "decode has no backward pass";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("backward: decode has no backward pass; allowed: naive, flash"),
              std::string::npos)
        << e.what();
  }
  Problem sparse = p;
  sparse.sinks = 2, sparse.window_left = 2;
  EXPECT_NO_THROW(Session(kernel_or_throw("flash"), sparse, 1, true));  // patterns too
  EXPECT_NO_THROW(Session(kernel_or_throw("naive"), sparse, 1, true));
}

// The bound: flash's backward holds at most 64 MiB beside its inputs and outputs at 32k
// tokens (the training experiment's heads and head dims, 1 to 4 threads): O(n), never n^2.
TEST(Backward, FlashsExtraMemoryAt32kTokensIsAtMost64MiB) {
  const Kernel& flash = kernel_or_throw("flash");
  for (auto [hq, hkv] : {std::pair{8, 8}, std::pair{8, 2}, std::pair{32, 8}})
    for (int64_t d : {64, 128})
      for (int threads : {1, 2, 4}) {
        const Problem p = small(1, hq, hkv, 32768, 32768, d);
        EXPECT_LE(flash.backward_workspace_bytes(p, threads), size_t{64} << 20) << p.describe() << " t" << threads;
        EXPECT_GT(flash.backward_workspace_bytes(p, threads), static_cast<size_t>(p.lse_elems()) * 4);  // D at least
      }
}

// The memory budget counts a backward run's dO, dQ, dK, dV and its larger workspace.
TEST(Backward, TheMemoryBudgetCountsTheGradients) {
  const Problem p = small(1, 8, 8, 512, 512, 128);  // Q, K, V, O 2 MiB each; dO, dQ, dK, dV 8 MiB more
  const Kernel& flash = kernel_or_throw("flash");
  const int64_t forward = tensor_bytes(p) + static_cast<int64_t>(flash.workspace_bytes(p, 1));
  test::ScopedEnv budget("ATTN_MEMORY_BUDGET", std::to_string(forward + (1 << 20)));
  EXPECT_TRUE(can_run(flash, p, 1));
  const Support s = can_run(flash, p, 1, true);
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason.find("dO, dQ, dK, dV"), std::string::npos) << s.reason;
  EXPECT_THROW(Session(flash, p, 1, true), InvalidInput);
  Problem q = p;
  q.kv_dtype = KvDType::Q8_0;
  q.head_dim = 32;
  EXPECT_THROW(Session(kernel_or_throw("naive"), q, 1, true), InvalidInput);
}

}  // namespace
}  // namespace attnlab
