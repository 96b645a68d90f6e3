// Extreme values, for every registered kernel:
//  - scores of magnitude ~1e4 stay finite and agree with the reference;
//  - NaN behaviour (defined here): a NaN/Inf in Q, K or V propagates to exactly the rows
//    whose visible keys (or own query) hold it, and nowhere else; a NaN in a masked
//    position (beyond kv_lens, or outside the causal/window interval) never leaks.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "attnlab/kernel.hpp"
#include "attnlab/verify.hpp"
#include "test_util.hpp"

namespace attnlab {

// Test names and messages show the kernel's name, not its address.
void PrintTo(const Kernel* k, std::ostream* os) { *os << k->name(); }

namespace {

class Extreme : public ::testing::TestWithParam<const Kernel*> {
 protected:
  void SetUp() override {
    const Kernel& k = *GetParam();
    if (Support a = k.available(); !a) GTEST_SKIP() << a.reason;
  }
  // Runs the kernel on t's inputs; O and LSE come back in t's outputs. False when the
  // kernel does not support the shape (the caller then skips).
  bool run(const Problem& p, Tensors& t) {
    if (!GetParam()->supports(p)) return false;
    Session s(*GetParam(), p, 2);
    s.run(t.inputs, t.outputs);
    return true;
  }
};

TEST_P(Extreme, HugeScoresStayFiniteAndCorrect) {
  Problem p = test::shape(1, 4, 2, 9, 70, 32);
  p.causal = CausalAlign::BottomRight;
  p.scale = 1.0f;
  Tensors t = random_tensors(p, 11);
  // |q.k| up to ~1e4: q and k entries of magnitude ~20.
  for (int64_t n = 0; n < p.q_elems(); ++n) t.q[n] *= 20.f;
  for (int64_t n = 0; n < p.kv_elems(); ++n) t.k[n] *= 20.f;
  const Agreement a = prepare_agreement(p, t.inputs, all_rows(p));
  double max_abs_lse = 0;
  for (double l : a.ref.lse) max_abs_lse = std::max(max_abs_lse, std::fabs(l));
  ASSERT_GT(max_abs_lse, 1000.0);  // the test really reaches large scores
  const KernelCheck c = check_kernel(*GetParam(), p, t.inputs, a, 2);
  if (c.verdict == Verdict::Skip) GTEST_SKIP() << c.reason;
  EXPECT_EQ(c.verdict, Verdict::Pass) << c.reason;
}

TEST_P(Extreme, NanInVisibleKeyPoisonsExactlyTheRowsThatSeeIt) {
  Problem p = test::shape(1, 2, 1, 8, 8, 16);
  p.causal = CausalAlign::BottomRight;
  Tensors t = random_tensors(p, 5);
  const int64_t bad_key = 5;
  const_cast<float*>(t.inputs.k.row(0, 0, bad_key))[3] = std::nanf("");
  if (!run(p, t)) GTEST_SKIP() << GetParam()->supports(p).reason;
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 8; ++i) {
      const float* o = t.outputs.o.row(0, h, i);
      const bool sees = p.visible(0, i).hi > bad_key;
      for (int64_t d = 0; d < 16; ++d) EXPECT_EQ(std::isnan(o[d]), sees) << "h " << h << " row " << i;
      EXPECT_EQ(std::isnan(t.outputs.lse[h * 8 + i]), sees) << "h " << h << " row " << i;
    }
}

TEST_P(Extreme, NanInPartlyVisibleValueRowReachesOnlyTheRowsThatSeeIt) {
  // Causal, 100 x 100: key 70 sits inside a tile that is only partly visible to the rows
  // around the diagonal (tiled kernels must clip per row, not per tile). A NaN in one V
  // component poisons only that output component of the rows that see key 70.
  Problem p = test::shape(1, 2, 1, 100, 100, 24);
  p.causal = CausalAlign::BottomRight;
  Tensors t = random_tensors(p, 9);
  const int64_t bad_key = 70;
  const_cast<float*>(t.inputs.v.row(0, 0, bad_key))[5] = std::nanf("");
  if (!run(p, t)) GTEST_SKIP() << GetParam()->supports(p).reason;
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < p.q_len; ++i) {
      const bool sees = p.visible(0, i).hi > bad_key;
      EXPECT_EQ(std::isnan(t.outputs.o.row(0, h, i)[5]), sees) << "h " << h << " row " << i;
      EXPECT_FALSE(std::isnan(t.outputs.o.row(0, h, i)[4])) << "h " << h << " row " << i;
      EXPECT_FALSE(std::isnan(t.outputs.lse[h * p.q_len + i])) << "h " << h << " row " << i;
    }
}

TEST_P(Extreme, NanInMaskedPositionsNeverLeaks) {
  Problem p = test::shape(2, 2, 2, 5, 40, 16);
  p.kv_lens = {17, 0};
  p.window_left = 3, p.window_right = 0;
  Tensors t = random_tensors(p, 6);
  const float nan = std::nanf("");
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t j = 0; j < p.kv_len; ++j) {
        const MaskSpec m = p.mask_for_batch(b);
        if (j >= m.rows(0, p.q_len).lo && j < m.rows(0, p.q_len).hi) continue;
        for (int64_t d = 0; d < 16; ++d) {
          const_cast<float*>(t.inputs.k.row(b, h, j))[d] = nan;
          const_cast<float*>(t.inputs.v.row(b, h, j))[d] = nan;
        }
      }
  if (!run(p, t)) GTEST_SKIP() << GetParam()->supports(p).reason;
  const Agreement a = prepare_agreement(p, t.inputs, all_rows(p));
  const Errors e = measure(a.ref, as_const(t.outputs.o), t.outputs.lse, p);
  EXPECT_TRUE(a.tol.passes(e)) << a.tol.why_failed(e);
  for (int64_t i = 0; i < p.q_len; ++i) EXPECT_EQ(t.outputs.o.row(1, 0, i)[0], 0.f);  // kv_lens 0
}

INSTANTIATE_TEST_SUITE_P(Kernels, Extreme, ::testing::ValuesIn(registry()),
                         [](const ::testing::TestParamInfo<const Kernel*>& info) {
                           return std::string(info.param->name());
                         });

}  // namespace
}  // namespace attnlab
