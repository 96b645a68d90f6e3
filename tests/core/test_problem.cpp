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
  EXPECT_EQ(keep({5, 2, CausalAlign::BottomRight, -1, -1}), (std::vector<std::string>{"00", "00", "00", "10", "11"}));
  EXPECT_EQ(keep({5, 2, CausalAlign::TopLeft, -1, -1}), (std::vector<std::string>{"10", "11", "11", "11", "11"}));
}

TEST(Interval, WindowIsInclusiveAndBottomRightAligned) {
  EXPECT_EQ(keep({4, 6, CausalAlign::None, 1, 0}), (std::vector<std::string>{"011000", "001100", "000110", "000011"}));
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

// The pass: the backward counts 2.5x the forward's FLOPs (both 3.5x) and reads O, dO besides the
// forward's inputs and writes dQ, dK, dV; quantized and paged caches refuse it; names round-trip.
TEST(Problem, PassScalesFlopsAndBytesAndRefusesInferenceCaches) {
  Problem p = shape(1, 4, 2, 6, 10, 8);
  const double f = p.flops(), bytes = p.bytes_moved();
  EXPECT_DOUBLE_EQ(p.forward_flops(), f);
  p.pass = Pass::Backward;
  EXPECT_DOUBLE_EQ(p.flops(), 2.5 * f);
  EXPECT_DOUBLE_EQ(p.forward_flops(), f);
  const double grads = 4.0 * (p.q_elems() + p.kv_elems() + p.v_elems());
  EXPECT_DOUBLE_EQ(p.bytes_moved(), bytes + 4.0 * p.o_elems() + grads);
  p.pass = Pass::ForwardBackward;
  EXPECT_DOUBLE_EQ(p.flops(), 3.5 * f);
  EXPECT_DOUBLE_EQ(p.bytes_moved(), 2 * bytes + 4.0 * p.o_elems() + grads);
  EXPECT_NE(p.describe().find("pass=forward_backward"), std::string::npos);
  p.head_dim = 32, p.kv_dtype = KvDType::Q8_0;
  EXPECT_THROW(p.validate(), InvalidInput);
  p.pass = Pass::Forward;
  EXPECT_NO_THROW(p.validate());
  for (Pass x : {Pass::Forward, Pass::Backward, Pass::ForwardBackward}) EXPECT_EQ(parse_pass(to_string(x)), x);
  try {
    parse_pass("sideways");
    FAIL();
  } catch (const InvalidInput& e) {
    EXPECT_STREQ(e.what(), "pass: 'sideways' is not a pass; allowed: forward, backward, forward_backward");
  }
}

TEST(Problem, KvBytesCountEachKvHeadOnce) {
  Problem mha = shape(1, 8, 8, 1, 1000, 64), gqa = shape(1, 8, 2, 1, 1000, 64);
  EXPECT_DOUBLE_EQ(mha.kv_bytes(), 2.0 * 4 * 8 * 1000 * 64);
  EXPECT_DOUBLE_EQ(gqa.kv_bytes(), mha.kv_bytes() / 4);
}

TEST(Problem, HeadDimVSplitsFlopsBytesAndShapes) {
  Problem p = shape(1, 4, 1, 3, 10, 192);
  EXPECT_EQ(p.dim_v(), 192);  // 0 = head_dim
  p.head_dim_v = 128;
  EXPECT_EQ(p.dim_v(), 128);
  EXPECT_DOUBLE_EQ(p.flops(), 2.0 * (192 + 128) * 4 * 3 * 10);  // q.k at 192, p.v at 128
  EXPECT_DOUBLE_EQ(p.kv_bytes(), 4.0 * 10 * (192 + 128));       // one kv head
  EXPECT_DOUBLE_EQ(p.bytes_moved(), 4.0 * (4 * 3 * 192 + 4 * 3 * 128 + 4 * 3) + p.kv_bytes());
  EXPECT_EQ(p.o_elems(), 4 * 3 * 128);
  EXPECT_EQ(p.v_elems(), 10 * 128);
  EXPECT_EQ(p.kv_elems(), 10 * 192);
  EXPECT_DOUBLE_EQ(p.kv_bytes_per_token(), 4.0 * (192 + 128));  // one kv head
  EXPECT_NE(p.describe().find("head_dim_v=128"), std::string::npos) << p.describe();
  p.head_dim_v = 192;  // the same as head_dim: not named
  EXPECT_EQ(p.describe().find("head_dim_v"), std::string::npos) << p.describe();
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
  expect_invalid(shape(1, 1, 1, 1, 1, 0), "head_dim", "1 to 576");
  expect_invalid(shape(1, 1, 1, 1, 1, 1024), "head_dim", "1 to 576");
  Problem p = shape(2, 1, 1, 1, 10, 8);
  p.head_dim_v = 577;
  expect_invalid(p, "head_dim_v", "1 to 576, or 0 (= head_dim)");
  p.head_dim_v = -1;
  expect_invalid(p, "head_dim_v", "1 to 576, or 0 (= head_dim)");
  p.head_dim_v = 0;
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

// Window bounds up to INT64_MAX: a bound past the first or last key is unbounded, for every
// alignment and row (row() never forms i + off + bound, which used to wrap).
TEST(Interval, HugeWindowBoundsMeanUnbounded) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (auto c : {CausalAlign::None, CausalAlign::BottomRight, CausalAlign::TopLeft}) {
    for (auto [sq, sk] : {std::pair<int64_t, int64_t>{5, 9}, {9, 5}, {1, 1}}) {
      for (int64_t big : {sk + sq, sk + sq + 1, kMax - 1, kMax}) {
        const MaskSpec none{sq, sk, c, -1, -1};
        EXPECT_EQ(keep({sq, sk, c, -1, big}), keep(none)) << "right " << big;
        EXPECT_EQ(keep({sq, sk, c, big, -1}), keep(none)) << "left " << big;
        EXPECT_EQ(keep({sq, sk, c, big, big}), keep(none)) << "both " << big;
        // One side huge, the other still counts.
        EXPECT_EQ(keep({sq, sk, c, 1, big}), keep({sq, sk, c, 1, -1})) << big;
        EXPECT_EQ(keep({sq, sk, c, big, 0}), keep({sq, sk, c, -1, 0})) << big;
      }
    }
  }
  // The reproduction: --window -1,INT64_MAX is no window at all, not every row masked.
  Problem p = shape(1, 1, 1, 2, 2, 8);
  p.window_left = -1, p.window_right = kMax;
  EXPECT_NO_THROW(p.validate());
  EXPECT_EQ(p.visible_pairs(), 4);
  p.window_left = kMax, p.window_right = -2;
  expect_invalid(p, "window_right", "-1 (unbounded) or an integer >= 0");
}

// visible_pairs() and kv_bytes() are computed per linear piece of the mask, not per row:
// they must equal the row-by-row sums for every mask kind.
TEST(Problem, PairAndKeyCountsMatchRowByRowSums) {
  uint64_t s = 12345;
  auto next = [&s](int64_t n) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(n));
  };
  const CausalAlign aligns[] = {CausalAlign::None, CausalAlign::BottomRight, CausalAlign::TopLeft};
  for (int trial = 0; trial < 3000; ++trial) {
    Problem p = shape(1 + next(3), 2, 1, 1 + next(70), 1 + next(70), 8);
    p.causal = aligns[next(3)];
    p.window_left = next(4) == 0 ? -1 : next(80);
    p.window_right = next(4) == 0 ? -1 : next(80);
    if (next(2)) {
      for (int64_t b = 0; b < p.batch; ++b) p.kv_lens.push_back(next(p.kv_len + 1));
    }
    int64_t pairs = 0;
    double keys = 0;
    for (int64_t b = 0; b < p.batch; ++b) {
      const MaskSpec m = p.mask_for_batch(b);
      for (int64_t i = 0; i < p.q_len; ++i) pairs += m.row(i).size();
      keys += static_cast<double>(m.rows(0, p.q_len).size());
    }
    ASSERT_EQ(p.visible_pairs(), pairs * p.q_heads) << p.describe();
    ASSERT_DOUBLE_EQ(p.kv_bytes(), 2.0 * 4 * keys * p.kv_heads * p.head_dim) << p.describe();
  }
}

TEST(Problem, CountsOfHugeProblemsAreClosedForm) {
  // 2^36 query rows: a row loop would take minutes; the piecewise sum is immediate.
  Problem p = shape(1, 1, 1, int64_t{1} << 36, 1000, 1);
  p.causal = CausalAlign::TopLeft;
  ASSERT_NO_THROW(p.validate());
  const int64_t n = int64_t{1} << 36;
  EXPECT_EQ(p.visible_pairs(), 1000 * 1001 / 2 + (n - 1000) * 1000);
  EXPECT_DOUBLE_EQ(p.kv_bytes(), 2.0 * 4 * 1000);
}

// Sizes that used to wrap (the SIGFPE of `verify --batch 4294967296 --q-heads 4294967296`)
// are rejected by name, with the limit.
TEST(Problem, OversizedShapesNameTheLimit) {
  expect_invalid(shape(int64_t{1} << 32, int64_t{1} << 32, 1, 2, 2, 8), "Q",
                 "at most 2^36 (68719476736) elements per tensor");
  expect_invalid(shape(1, 1, 1, int64_t{1} << 62, 1, 512), "Q", "at most 2^36");
  expect_invalid(shape(1, 1, 1, 1, std::numeric_limits<int64_t>::max(), 1), "K", "at most 2^36");
  expect_invalid(shape(1, 1, 1, int64_t{1} << 30, int64_t{1} << 30, 1), "attention pairs",
                 "at most 2^56 (72057594037927936) query-key pairs");
  try {
    shape(3, 5, 1, int64_t{1} << 40, 2, 8).validate();
    FAIL();
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("batch * q_heads * q_len * head_dim = 3 * 5 * 1099511627776 * 8"),
              std::string::npos)
        << e.what();
  }
  // The largest allowed tensor is accepted.
  EXPECT_NO_THROW(shape(1, 1, 1, int64_t{1} << 27, 1, 512).validate());
}

TEST(Problem, LayoutParsing) {
  EXPECT_EQ(parse_layout("bshd"), Layout::BSHD);
  EXPECT_THROW(parse_layout("bhds"), InvalidInput);
}

// The one rule from arrays to a problem's sizes (the CLI's .npy files and the Python module call
// it): sizes in either layout, and each refusal naming the array.
TEST(Problem, SizeFromArraysIsTheOneRule) {
  Problem p;
  size_from_arrays(p, {{2, 8, 5, 16}, {2, 4, 7, 16}, {2, 4, 7, 24}});
  EXPECT_EQ(std::vector<int64_t>({p.batch, p.q_heads, p.q_len, p.head_dim, p.head_dim_v, p.kv_heads, p.kv_len}),
            std::vector<int64_t>({2, 8, 5, 16, 24, 4, 7}));
  p.layout = Layout::BSHD;
  size_from_arrays(p, {{2, 5, 8, 16}, {2, 7, 4, 16}, {2, 7, 4, 16}});
  EXPECT_EQ(std::vector<int64_t>({p.batch, p.q_heads, p.q_len, p.head_dim, p.head_dim_v, p.kv_heads, p.kv_len}),
            std::vector<int64_t>({2, 8, 5, 16, 0, 4, 7}));
  const auto refused = [](const ArrayShapes& a) {
    Problem q;
    try {
      size_from_arrays(q, a);
    } catch (const InvalidInput& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(refused({{2, 8, 5}, {2, 4, 7, 16}, {2, 4, 7, 16}, "q.npy"}),
            "q.npy: shape (2, 8, 5) has 3 dimensions; allowed: 4, (batch, heads, seq, head_dim) for layout bhsd");
  EXPECT_EQ(refused({{2, 8, 5, 16}, {2, 0, 7, 16}, {2, 0, 7, 16}}),
            "k: shape (2, 0, 7, 16) has a zero dimension; allowed: all >= 1");
  EXPECT_EQ(refused({{2, 8, 5, 16}, {2, 4, 7, 16}, {2, 4, 6, 16}}),
            "v: shape (2, 4, 6, 16) differs from K's (2, 4, 7, 16); allowed: V has K's shape but for its last "
            "dimension (head_dim_v)");
  EXPECT_EQ(refused({{2, 8, 5, 16}, {3, 4, 7, 16}, {3, 4, 7, 16}}).substr(0, 31), "k: batch 3 differs from Q's bat");
  EXPECT_EQ(refused({{2, 8, 5, 16}, {2, 4, 7, 8}, {2, 4, 7, 8}}),
            "k: head_dim 8 differs from Q's head_dim 16; allowed: K's last dimension = Q's");
  // A pool's first dimension counts blocks; a raw cache's last one counts bytes.
  EXPECT_EQ(refused({{2, 8, 5, 16}, {9, 4, 7, 16}, {9, 4, 7, 16}, "q", "k", "v", false, true}), "accepted");
  EXPECT_EQ(refused({{2, 8, 5, 16}, {2, 4, 7, 18}, {2, 4, 7, 18}, "q", "k", "v", true}), "accepted");
  EXPECT_EQ(shape_text({5}), "(5,)");
}

}  // namespace
}  // namespace attnlab
