// The tolerance policy rejects planted bugs, at every storage dtype. One test-only kernel
// with a switchable bug (not in the registry): wrong scale, causal interval off by one,
// kv_lens ignored, GQA mapping dropped, and two that only 16-bit storage allows: P rounded
// to bf16 before P*V (a lower precision regime than the documented float32 compute) and
// 16-bit storage read as the other 16-bit format. The bug-free variant must pass at every
// dtype, so the test can fail both ways.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "attnlab/kernel.hpp"
#include "attnlab/blocks/textbook.hpp"
#include "attnlab/verify.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

enum class Bug {
  None,
  WrongScale,
  CausalOffByOne,
  IgnoresKvLens,
  DropsGqaMapping,
  RoundsPToBf16,
  MisreadsStorage,
  RoundsPTo3Bits  // P with 3 significant bits: below even the bf16-products regime (bf16 has 8)
};

// x with its significand rounded to `bits` bits (nearest even), by the float32 adder.
float round_significand(float x, int bits) {
  if (x == 0 || !std::isfinite(x)) return x;
  const float c = std::ldexp(1.0f, std::ilogb(x) + 24 - bits);  // x + c keeps `bits` bits of x
  return (x + c) - c;
}

// The other 16-bit format's reading of the same bits (the MisreadsStorage bug).
View4<const f16> swapped(const View4<const bf16>& v) { return retype<f16>(v); }
View4<const bf16> swapped(const View4<const f16>& v) { return retype<bf16>(v); }

class Planted final : public Kernel {
 public:
  explicit Planted(Bug bug, Arithmetic arithmetic = Arithmetic::F32) : bug_(bug), caps_{.arithmetic = arithmetic} {}
  std::string_view name() const override { return "planted"; }
  std::string_view description() const override { return "test-only kernel with one planted bug"; }
  // Declared, not done: a kernel declaring bf16 products and computing the textbook float32
  // still passes (its error is below the wider tolerance); one rounding P to bf16 is correct then.
  const Capabilities& capabilities() const override { return caps_; }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext&) const override {
    visit_inputs(in, [&]<class E>(const TypedInputs<E>& t) {
      if constexpr (!std::is_same_v<E, float>) {
        using Other = std::conditional_t<std::is_same_v<E, bf16>, f16, bf16>;
        if (bug_ == Bug::MisreadsStorage)
          return run_typed(p, TypedInputs<Other>{swapped(t.q), swapped(t.k), swapped(t.v), t.pages}, out);
      }
      run_typed(p, t, out);
    });
  }

 private:
  template <class E>
  void run_typed(const Problem& p, const TypedInputs<E>& in, const Outputs& out) const {
    std::vector<float> s(static_cast<size_t>(p.kv_len) + 1);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.q_heads; ++h)
        for (int64_t i = 0; i < p.q_len; ++i) {
          Problem q = p;
          if (bug_ == Bug::IgnoresKvLens) q.kv_lens.clear();
          Interval iv = q.visible(b, i);
          if (bug_ == Bug::CausalOffByOne) iv.hi = std::min(iv.hi + 1, p.kv_len_of(b));
          const float scale = bug_ == Bug::WrongScale ? 1.0f / static_cast<float>(p.head_dim) : p.effective_scale();
          const int64_t hk = bug_ == Bug::DropsGqaMapping ? h % p.kv_heads : p.kv_head_of(h);
          textbook::scores(in.q.row(b, h, i), in.k, b, hk, iv, scale, s.data());
          float* o = out.o.row(b, h, i);
          float lse;
          if (bug_ == Bug::RoundsPToBf16 || bug_ == Bug::RoundsPTo3Bits) {  // weights rounded before P*V
            float m = -std::numeric_limits<float>::infinity(), l = 0;
            for (int64_t j = 0; j < iv.size(); ++j) m = std::max(m, s[j]);
            std::fill(o, o + p.head_dim, 0.f);
            for (int64_t j = 0; j < iv.size(); ++j) {
              const float e = std::exp(s[j] - m);
              l += e;
              const float pj = bug_ == Bug::RoundsPToBf16 ? to_float(to_bf16(e)) : round_significand(e, 3);
              for (int64_t d = 0; d < p.head_dim; ++d) o[d] += pj * to_float(in.v.row(b, hk, iv.lo + j)[d]);
            }
            for (int64_t d = 0; d < p.head_dim; ++d) o[d] /= l;
            lse = m + std::log(l);
          } else {
            lse = textbook::softmax_pv(s.data(), in.v, b, hk, iv, o);
          }
          out.lse[(b * p.q_heads + h) * p.q_len + i] = lse;
        }
  }

  Bug bug_;
  Capabilities caps_;
};

Problem bug_revealing_shape() {
  Problem p = test::shape(2, 6, 2, 17, 33, 32);
  p.causal = CausalAlign::BottomRight;
  p.kv_lens = {33, 20};
  return p;
}

std::string bug_name(const ::testing::TestParamInfo<std::tuple<Bug, DType>>& info) {
  static const char* const kNames[] = {"none",
                                       "wrong_scale",
                                       "causal_off_by_one",
                                       "ignores_kv_lens",
                                       "drops_gqa_mapping",
                                       "rounds_p_to_bf16",
                                       "misreads_storage",
                                       "rounds_p_to_3_bits"};
  return std::string(kNames[static_cast<int>(std::get<0>(info.param))]) + "_" + to_string(std::get<1>(info.param));
}

class PlantedBug : public ::testing::TestWithParam<std::tuple<Bug, DType>> {};

TEST_P(PlantedBug, IsRejectedAndTheCorrectKernelPasses) {
  const auto [bug, dtype] = GetParam();
  Problem p = bug_revealing_shape();
  p.dtype = dtype;
  Tensors t = random_tensors(p, 3);
  const Agreement a = prepare_agreement(p, t.inputs, all_rows(p));
  const KernelCheck c = check_kernel(Planted(bug), p, t.inputs, a, 1);
  if (bug == Bug::None) {
    EXPECT_EQ(c.verdict, Verdict::Pass) << c.reason;
  } else {
    EXPECT_EQ(c.verdict, Verdict::Fail);
    // Not a near miss: the error is far beyond the tolerance.
    EXPECT_GT(c.errors.o_rel, 100 * a.tol.o_rel);
  }
}

INSTANTIATE_TEST_SUITE_P(Bugs, PlantedBug,
                         ::testing::Combine(::testing::Values(Bug::None, Bug::WrongScale, Bug::CausalOffByOne,
                                                              Bug::IgnoresKvLens, Bug::DropsGqaMapping,
                                                              Bug::RoundsPToBf16),
                                            ::testing::Values(DType::F32, DType::BF16, DType::F16)),
                         bug_name);
// Misreading 16-bit storage as the other 16-bit format: only 16-bit storage has another reading
// (a case per machine that always skipped, float32, is not instantiated).
INSTANTIATE_TEST_SUITE_P(Storage, PlantedBug,
                         ::testing::Combine(::testing::Values(Bug::MisreadsStorage),
                                            ::testing::Values(DType::BF16, DType::F16)),
                         bug_name);

// The same bugs in a kernel that declares bf16 products (flash_bf16's arithmetic): it is held to
// the textbook's error with P rounded to bf16 (tolerance_for), a wider tolerance that must
// still reject every semantic bug and a coarser P; rounding P to bf16 is no bug there.
class PlantedBugBf16Products : public ::testing::TestWithParam<Bug> {};

TEST_P(PlantedBugBf16Products, IsRejectedUnderItsOwnArithmetic) {
  const Bug bug = GetParam();
  Problem p = bug_revealing_shape();
  p.dtype = DType::BF16;
  Tensors t = random_tensors(p, 3);
  const Agreement a = prepare_agreement(p, t.inputs, all_rows(p));
  const KernelCheck c = check_kernel(Planted(bug, Arithmetic::Bf16Products), p, t.inputs, a, 1);
  EXPECT_GT(c.tol.o_rel, 10 * a.tol.o_rel) << "the bf16-products baseline is the wider one";
  if (bug == Bug::None || bug == Bug::RoundsPToBf16) {
    EXPECT_EQ(c.verdict, Verdict::Pass) << c.reason;
  } else {
    EXPECT_EQ(c.verdict, Verdict::Fail);
    // Measured: 28x (wrong scale) to 237x (misread storage); 3-bit P ~4x.
    EXPECT_GT(c.errors.o_rel, (bug == Bug::RoundsPTo3Bits ? 2 : 10) * c.tol.o_rel);
  }
}

INSTANTIATE_TEST_SUITE_P(Bugs, PlantedBugBf16Products,
                         ::testing::Values(Bug::None, Bug::WrongScale, Bug::CausalOffByOne, Bug::IgnoresKvLens,
                                           Bug::DropsGqaMapping, Bug::RoundsPToBf16, Bug::MisreadsStorage,
                                           Bug::RoundsPTo3Bits),
                         [](const ::testing::TestParamInfo<Bug>& info) {
                           return bug_name({std::make_tuple(info.param, DType::BF16), info.index});
                         });

TEST(ToleranceRule, FactorOfBaselinePlusFloor) {
  Errors baseline;
  baseline.o_rel = 1e-6, baseline.lse = 2e-6, baseline.lse_checked = true;
  const Tolerance t = Tolerance::from_baseline(baseline);
  EXPECT_DOUBLE_EQ(t.o_rel, 4e-6 + Tolerance::kFloor);
  EXPECT_DOUBLE_EQ(t.lse, 8e-6 + Tolerance::kFloor);
  Errors e = baseline;
  e.o_rel = t.o_rel * 0.99;
  EXPECT_TRUE(t.passes(e));
  e.o_rel = t.o_rel * 1.01;
  EXPECT_FALSE(t.passes(e));
  EXPECT_NE(t.why_failed(e).find("O error"), std::string::npos);
}

TEST(ToleranceRule, UnwrittenOutputsFail) {
  // A kernel that writes nothing leaves the NaN the check pre-fills: it must fail.
  struct Lazy final : Kernel {
    std::string_view name() const override { return "lazy"; }
    std::string_view description() const override { return "writes nothing"; }
    void run(const Problem&, const Inputs&, const Outputs&, RunContext&) const override {}
  };
  const Problem p = test::shape(1, 1, 1, 3, 3, 16);
  Tensors t = random_tensors(p, 1);
  const Agreement a = prepare_agreement(p, t.inputs, all_rows(p));
  EXPECT_EQ(check_kernel(Lazy(), p, t.inputs, a, 1).verdict, Verdict::Fail);
}

}  // namespace
}  // namespace attnlab
