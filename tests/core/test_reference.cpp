// The float64 reference against cases worked out by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "attnlab/verify.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

using test::shape;

struct Hand {
  Problem p;
  Tensors t;
  explicit Hand(const Problem& prob) : p(prob), t(allocate_tensors(prob)) {}
  float& q(int64_t b, int64_t h, int64_t i, int64_t d = 0) { return const_cast<float*>(t.inputs.q.row(b, h, i))[d]; }
  float& k(int64_t b, int64_t h, int64_t j, int64_t d = 0) { return const_cast<float*>(t.inputs.k.row(b, h, j))[d]; }
  float& v(int64_t b, int64_t h, int64_t j, int64_t d = 0) { return const_cast<float*>(t.inputs.v.row(b, h, j))[d]; }
  // Reference (O row, LSE) of one row.
  std::pair<std::vector<double>, double> row(int64_t b, int64_t h, int64_t i) {
    std::vector<double> o(p.head_dim);
    double scale;
    const double lse = reference_row(p, t.inputs, {b, h, i}, o.data(), &scale);
    return {o, lse};
  }
};

TEST(Reference, TwoKeysByHand) {
  // q = ln 3, keys 0 and 1, scale 1: scores 0 and ln 3 -> p = (1/4, 3/4); V = (2, 6) -> O = 5.
  Problem p = shape(1, 1, 1, 1, 2, 1);
  p.scale = 1.0f;
  Hand h(p);
  h.q(0, 0, 0) = std::log(3.0f);
  h.k(0, 0, 0) = 0.f, h.k(0, 0, 1) = 1.f;
  h.v(0, 0, 0) = 2.f, h.v(0, 0, 1) = 6.f;
  auto [o, lse] = h.row(0, 0, 0);
  EXPECT_NEAR(o[0], 5.0, 1e-6);
  EXPECT_NEAR(lse, std::log(4.0), 1e-6);
}

TEST(Reference, DefaultScaleIsInverseSqrtHeadDim) {
  // d = 4, q = k = (1,1,1,1): score = 4 / 2 = 2 for the only key -> LSE = 2.
  Problem p = shape(1, 1, 1, 1, 1, 4);
  Hand h(p);
  for (int d = 0; d < 4; ++d) h.q(0, 0, 0, d) = h.k(0, 0, 0, d) = 1.f;
  EXPECT_NEAR(h.row(0, 0, 0).second, 2.0, 1e-6);
}

TEST(Reference, CausalBottomRightWithShortQuery) {
  // q_len 2 < kv_len 3, q = 0 so every visible key weighs the same.
  // Bottom-right: row 0 sees keys {0, 1}, row 1 sees {0, 1, 2}.
  Problem p = shape(1, 1, 1, 2, 3, 1);
  p.causal = CausalAlign::BottomRight;
  Hand h(p);
  h.v(0, 0, 0) = 1.f, h.v(0, 0, 1) = 2.f, h.v(0, 0, 2) = 6.f;
  EXPECT_NEAR(h.row(0, 0, 0).first[0], 1.5, 1e-12);
  EXPECT_NEAR(h.row(0, 0, 0).second, std::log(2.0), 1e-12);
  EXPECT_NEAR(h.row(0, 0, 1).first[0], 3.0, 1e-12);
  EXPECT_NEAR(h.row(0, 0, 1).second, std::log(3.0), 1e-12);
  // Top-left (PyTorch is_causal): row 0 sees key 0 only, row 1 keys {0, 1}.
  h.p.causal = CausalAlign::TopLeft;
  EXPECT_NEAR(h.row(0, 0, 0).first[0], 1.0, 1e-12);
  EXPECT_NEAR(h.row(0, 0, 1).first[0], 1.5, 1e-12);
}

TEST(Reference, FullyMaskedRowsGiveZeroAndMinusInf) {
  // q_len 3 > kv_len 1, bottom-right causal: rows 0 and 1 see nothing; row 2 sees key 0.
  Problem p = shape(1, 1, 1, 3, 1, 2);
  p.causal = CausalAlign::BottomRight;
  Hand h(p);
  h.v(0, 0, 0, 0) = 4.f, h.v(0, 0, 0, 1) = -4.f;
  for (int64_t i : {0, 1}) {
    auto [o, lse] = h.row(0, 0, i);
    EXPECT_EQ(o[0], 0.0);
    EXPECT_EQ(o[1], 0.0);
    EXPECT_TRUE(std::isinf(lse) && lse < 0);
  }
  auto [o, lse] = h.row(0, 0, 2);
  EXPECT_EQ(o[0], 4.0);
  EXPECT_EQ(o[1], -4.0);
  EXPECT_NEAR(lse, 0.0, 1e-12);
}

TEST(Reference, KvLensZeroMasksTheBatchEntry) {
  Problem p = shape(2, 1, 1, 2, 3, 1);
  p.kv_lens = {0, 2};
  Hand h(p);
  h.v(1, 0, 0) = 2.f, h.v(1, 0, 1) = 4.f, h.v(1, 0, 2) = 1000.f;  // key 2 is padding
  EXPECT_TRUE(std::isinf(h.row(0, 0, 1).second));
  EXPECT_EQ(h.row(0, 0, 1).first[0], 0.0);
  EXPECT_NEAR(h.row(1, 0, 0).first[0], 3.0, 1e-12);
}

TEST(Reference, WindowSeesOnlyItsKeys) {
  Problem p = shape(1, 1, 1, 5, 5, 1);
  p.window_left = 1, p.window_right = 0;
  Hand h(p);
  for (int j = 0; j < 5; ++j) h.v(0, 0, j) = static_cast<float>(j * j);
  EXPECT_NEAR(h.row(0, 0, 2).first[0], (1.0 + 4.0) / 2, 1e-12);  // keys 1, 2
  EXPECT_NEAR(h.row(0, 0, 0).first[0], 0.0, 1e-12);              // key 0 only
}

TEST(Reference, GqaMapsConsecutiveQueryHeadsToOneKvHead) {
  // 6 query heads over 2 kv heads: heads 0..2 -> kv 0, heads 3..5 -> kv 1.
  Problem p = shape(1, 6, 2, 1, 1, 1);
  Hand h(p);
  h.v(0, 0, 0) = 1.f, h.v(0, 1, 0) = 7.f;
  for (int64_t hq = 0; hq < 6; ++hq) EXPECT_EQ(h.row(0, hq, 0).first[0], hq < 3 ? 1.0 : 7.0) << hq;
}

TEST(Reference, LargeScoresStayFinite) {
  // Scores of +-1e4: the max subtraction keeps exp in range.
  Problem p = shape(1, 1, 1, 1, 2, 1);
  p.scale = 1.0f;
  Hand h(p);
  h.q(0, 0, 0) = 100.f;
  h.k(0, 0, 0) = 100.f, h.k(0, 0, 1) = -100.f;
  h.v(0, 0, 0) = 3.f, h.v(0, 0, 1) = 5.f;
  auto [o, lse] = h.row(0, 0, 0);
  EXPECT_EQ(o[0], 3.0);
  EXPECT_NEAR(lse, 1e4, 1e-9);
}

TEST(Measure, NanRulesAreStrict) {
  Problem p = shape(1, 1, 1, 1, 1, 1);
  Reference ref;
  ref.rows = {{0, 0, 0}};
  ref.dim = 1;
  ref.row_scale = {1.0};
  ref.lse = {0.0};
  ref.o = {1.0};
  float nan = std::nanf(""), one = 1.f, lse0 = 0.f;
  const ConstView v1 = make_view<const float>(&one, 1, 1, 1, 1, Layout::BHSD);
  const ConstView vn = make_view<const float>(&nan, 1, 1, 1, 1, Layout::BHSD);
  EXPECT_EQ(measure(ref, v1, &lse0, p).o_rel, 0.0);
  EXPECT_TRUE(std::isinf(measure(ref, vn, &lse0, p).o_rel));  // NaN where the reference is finite
  ref.o = {std::nan("")};
  EXPECT_EQ(measure(ref, vn, &lse0, p).o_rel, 0.0);           // NaN propagated as the reference does
  EXPECT_TRUE(std::isinf(measure(ref, v1, &lse0, p).o_rel));  // a NaN input silently hidden
}

}  // namespace
}  // namespace attnlab
