// The visible-interval rule and Problem::validate().
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "attnlab/problem.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

using test::shape;

// Keep-matrix of a mask, row by row, as '1'/'0' strings.
std::vector<std::string> keep(const MaskSpec& m) {
  std::vector<std::string> rows;
  for (int64_t i = 0; i < m.q_len; ++i) {
    std::string r;
    const Interval iv = m.row(i);
    for (int64_t j = 0; j < m.kv_len; ++j) r += (j >= iv.lo && j < iv.hi) ? '1' : '0';
    rows.push_back(r);
  }
  return rows;
}

TEST(Interval, BottomRightVsTopLeftShortQuery) {
  // attention-kernels.md 1.4, Sq = 2, Sk = 5.
  EXPECT_EQ(keep({2, 5, CausalAlign::TopLeft, -1, -1}), (std::vector<std::string>{"10000", "11000"}));
  EXPECT_EQ(keep({2, 5, CausalAlign::BottomRight, -1, -1}), (std::vector<std::string>{"11110", "11111"}));
}

TEST(Interval, BottomRightLongQueryHasFullyMaskedRows) {
  // Sq = 5, Sk = 2: rows 0..2 see nothing under bottom-right alignment.
  EXPECT_EQ(keep({5, 2, CausalAlign::BottomRight, -1, -1}),
            (std::vector<std::string>{"00", "00", "00", "10", "11"}));
  EXPECT_EQ(keep({5, 2, CausalAlign::TopLeft, -1, -1}),
            (std::vector<std::string>{"10", "11", "11", "11", "11"}));
}

TEST(Interval, WindowIsInclusiveAndBottomRightAligned) {
  EXPECT_EQ(keep({4, 6, CausalAlign::None, 1, 0}),
            (std::vector<std::string>{"011000", "001100", "000110", "000011"}));
  EXPECT_EQ(keep({3, 3, CausalAlign::None, 0, 1}), (std::vector<std::string>{"110", "011", "001"}));
  // Causal clips a window's right side to 0.
  EXPECT_EQ(keep({3, 3, CausalAlign::BottomRight, 1, 2}), (std::vector<std::string>{"100", "110", "011"}));
}

TEST(Interval, ZeroKvLengthMasksEverything) {
  for (auto c : {CausalAlign::None, CausalAlign::BottomRight, CausalAlign::TopLeft}) {
    const MaskSpec m{3, 0, c, -1, -1};
    for (int64_t i = 0; i < 3; ++i) EXPECT_TRUE(m.row(i).empty());
    EXPECT_TRUE(m.rows(0, 3).empty());
  }
}

TEST(Interval, RowsIsTheUnionOfRowIntervals) {
  for (int64_t left : {-1, 0, 3}) {
    for (auto c : {CausalAlign::None, CausalAlign::BottomRight, CausalAlign::TopLeft}) {
      const MaskSpec m{20, 13, c, left, c == CausalAlign::None ? 2 : -1};
      for (int64_t i0 = 0; i0 < 20; i0 += 4) {
        const Interval u = m.rows(i0, i0 + 4);
        for (int64_t j = 0; j < 13; ++j) {
          bool any = false;
          for (int64_t i = i0; i < i0 + 4; ++i) any |= (j >= m.row(i).lo && j < m.row(i).hi);
          EXPECT_EQ(any, j >= u.lo && j < u.hi) << "left " << left << " rows " << i0 << " key " << j;
        }
      }
    }
  }
}

TEST(Problem, FlopsCountVisiblePairsOnly) {
  Problem p = shape(1, 2, 1, 4, 4, 8);
  EXPECT_EQ(p.visible_pairs(), 2 * 16);
  EXPECT_DOUBLE_EQ(p.flops(), 4.0 * 8 * 32);
  p.causal = CausalAlign::BottomRight;
  EXPECT_EQ(p.visible_pairs(), 2 * (1 + 2 + 3 + 4));
  p.kv_lens = {0};
  EXPECT_EQ(p.visible_pairs(), 0);
  EXPECT_DOUBLE_EQ(p.kv_bytes(), 0.0);
}

TEST(Problem, KvBytesCountEachKvHeadOnce) {
  Problem mha = shape(1, 8, 8, 1, 1000, 64), gqa = shape(1, 8, 2, 1, 1000, 64);
  EXPECT_DOUBLE_EQ(mha.kv_bytes(), 2.0 * 4 * 8 * 1000 * 64);
  EXPECT_DOUBLE_EQ(gqa.kv_bytes(), mha.kv_bytes() / 4);
}

void expect_invalid(const Problem& p, const std::string& field, const std::string& allowed) {
  try {
    p.validate();
    FAIL() << "accepted " << p.describe();
  } catch (const InvalidInput& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(field + ":", 0), 0u) << msg;
    EXPECT_NE(msg.find("allowed: " + allowed), std::string::npos) << msg;
  }
}

TEST(Problem, ValidateNamesFieldAndAllowedValues) {
  EXPECT_NO_THROW(shape(2, 8, 2, 3, 5, 80).validate());
  expect_invalid(shape(0, 1, 1, 1, 1, 8), "batch", "an integer >= 1");
  expect_invalid(shape(1, 0, 1, 1, 1, 8), "q_heads", "an integer >= 1");
  expect_invalid(shape(1, 6, 4, 1, 1, 8), "kv_heads", "a divisor of q_heads");
  expect_invalid(shape(1, 1, 1, -3, 1, 8), "q_len", "an integer >= 1");
  expect_invalid(shape(1, 1, 1, 1, 0, 8), "kv_len", "an integer >= 1");
  expect_invalid(shape(1, 1, 1, 1, 1, 0), "head_dim", "1 to 512");
  expect_invalid(shape(1, 1, 1, 1, 1, 1024), "head_dim", "1 to 512");
  Problem p = shape(2, 1, 1, 1, 10, 8);
  p.window_left = -2;
  expect_invalid(p, "window_left", "-1 (unbounded) or an integer >= 0");
  p.window_left = -1;
  p.window_right = -5;
  expect_invalid(p, "window_right", "-1 (unbounded)");
  p.window_right = -1;
  p.kv_lens = {3};
  expect_invalid(p, "kv_lens", "exactly batch (2) entries");
  p.kv_lens = {3, 11};
  expect_invalid(p, "kv_lens[1]", "0 to kv_len (10)");
  p.kv_lens = {0, 10};
  EXPECT_NO_THROW(p.validate());
  p.scale = std::numeric_limits<float>::infinity();
  expect_invalid(p, "scale", "a finite number");
  p.scale = std::nanf("");
  expect_invalid(p, "scale", "a finite number");
}

TEST(Problem, LayoutParsing) {
  EXPECT_EQ(parse_layout("bshd"), Layout::BSHD);
  EXPECT_THROW(parse_layout("bhds"), InvalidInput);
}

}  // namespace
}  // namespace attnlab
