// Query-aware sparse decode's building blocks (include/attnlab/kv_summary.hpp): the page bound holds
// for every key of its page on every cache type (a planted bound that ignores q's sign does not),
// summaries kept row by row equal the ones read from the cache, the page choice keeps its sinks, its
// recent keys and its budget, a planted needle is found at any depth, and the accuracy of a choice
// is measured - dense when every page is chosen.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "attnlab/kv_summary.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

struct CacheCase {
  KvDType kv;
  DType dtype;
  int64_t block;
};

std::vector<CacheCase> cache_cases() {
  return {{KvDType::Same, DType::F32, 0},   {KvDType::Same, DType::F32, 64}, {KvDType::Same, DType::BF16, 0},
          {KvDType::Same, DType::F16, 16},  {KvDType::U8, DType::F32, 0},    {KvDType::Q4_0, DType::F32, 32},
          {KvDType::Fp8E4M3, DType::F32, 0}};
}

Problem cache_problem(const CacheCase& c) {
  Problem p = test::shape(2, 8, 2, 1, 300, 64);
  p.kv_dtype = c.kv, p.dtype = c.dtype, p.kv_block = c.block, p.kv_lens = {300, 131};
  p.causal = CausalAlign::BottomRight;
  p.validate();
  return p;
}

// Every key's q.k (double, the cache's values) against its page's bound, for every query row; returns
// how many exceeded it by more than float32 rounding of the bound's terms (d x 2^-23 x sum |terms|).
// bound: page_bound, or a planted one.
template <class Bound>
int violations(const Problem& p, const Inputs& in, const KvSummary& s, const Bound& bound) {
  int bad = 0;
  std::vector<float> q(static_cast<size_t>(p.head_dim)), k(static_cast<size_t>(p.head_dim));
  std::vector<float> lo(static_cast<size_t>(p.head_dim)), hi(static_cast<size_t>(p.head_dim));
  std::mt19937 rng(7);
  std::normal_distribution<float> n01;
  for (int trial = 0; trial < 6; ++trial) {
    for (float& x : q) x = n01(rng);  // mixed signs
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t hk = 0; hk < p.kv_heads; ++hk)
        for (int64_t j = 0; j < p.kv_len_of(b); ++j) {
          read_key(p, in, b, hk, j, k.data());
          double dot = 0;
          for (int64_t x = 0; x < p.head_dim; ++x) dot += static_cast<double>(q[x]) * k[x];
          const int64_t page = j / kSummaryPageKeys;
          page_extent(s, b, hk, page, lo.data(), hi.data());
          const float* mn = lo.data();
          const float* mx = hi.data();
          const double u = bound(q.data(), mn, mx, p.head_dim);
          double terms = 0;
          for (int64_t x = 0; x < p.head_dim; ++x)
            terms += std::fabs(q[x]) * std::max(std::fabs(mn[x]), std::fabs(mx[x]));
          if (!(dot <= u + p.head_dim * 0x1p-23 * terms)) ++bad;
        }
  }
  return bad;
}

TEST(KvSummary, BoundHoldsForEveryKeyOfItsPageOnEveryCache) {
  for (const CacheCase& c : cache_cases()) {
    const Problem p = cache_problem(c);
    const Tensors t = random_tensors(p, 3);
    const KvSummary s = summarize_keys(p, t.inputs);
    const auto bound = [](const float* q, const float* mn, const float* mx, int64_t d) {
      std::vector<float> pos(static_cast<size_t>(d)), neg(static_cast<size_t>(d));
      split_query(q, d, pos.data(), neg.data());
      return static_cast<double>(page_bound(pos.data(), neg.data(), mn, mx, d));
    };
    EXPECT_EQ(violations(p, t.inputs, s, bound), 0) << p.describe();
    // Planted: the bound of a query with nonnegative elements (q . max) - wrong for negative q.
    const auto planted = [](const float* q, const float*, const float* mx, int64_t d) {
      double u = 0;
      for (int64_t x = 0; x < d; ++x) u += static_cast<double>(q[x]) * mx[x];
      return u;
    };
    EXPECT_GT(violations(p, t.inputs, s, planted), 0) << p.describe();
  }
}

TEST(KvSummary, RowByRowEqualsReadFromTheCache) {
  for (const CacheCase& c : cache_cases()) {
    const Problem p = cache_problem(c);
    const Tensors t = random_tensors(p, 5);
    const KvSummary whole = summarize_keys(p, t.inputs);
    KvSummary grown = make_summary(p);
    std::vector<float> k(static_cast<size_t>(p.head_dim));
    // Appended token by token, sequences interleaved (the store path's order in a batch).
    for (int64_t j = 0; j < p.kv_len; ++j)
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t hk = 0; hk < p.kv_heads && j < p.kv_len_of(b); ++hk) {
          read_key(p, t.inputs, b, hk, j, k.data());
          summary_add_key(grown, b, hk, j, k.data());
        }
    EXPECT_TRUE(std::equal(grown.values(), grown.values() + grown.floats(), whole.values())) << p.describe();
    EXPECT_EQ(whole.bytes(), static_cast<size_t>(2 * 2 * 16 * 2 * 64 * sizeof(float)));  // 300 keys: 5 pages, a block
  }
}

TEST(KvSummary, ANanKeyMakesItsPageBoundNan) {
  Problem p = test::shape(1, 2, 1, 1, 200, 16);
  Tensors t = random_tensors(p, 9);
  const_cast<float*>(t.inputs.k.row(0, 0, 70))[5] = kNan;  // page 1
  const KvSummary s = summarize_keys(p, t.inputs);
  EXPECT_TRUE(std::isnan(s.lo(0, 0, 1, 5)));
  EXPECT_TRUE(std::isnan(s.hi(0, 0, 1, 5)));
  const std::vector<double> score = group_page_scores(p, t.inputs, s, 0, 0, 0);
  ASSERT_EQ(score.size(), 4u);
  EXPECT_TRUE(std::isnan(score[1]));
  EXPECT_FALSE(std::isnan(score[0]) || std::isnan(score[2]) || std::isnan(score[3]));
  // Ranked first: one page of budget takes it.
  EXPECT_EQ(choose_pages(score, 200, {64, 0, 0}), std::vector<int64_t>({1}));
}

TEST(KvSummary, BadKeyPositionNamesTheSummary) {
  Problem p = test::shape(1, 2, 1, 1, 100, 8);
  KvSummary s = make_summary(p);
  std::vector<float> k(8, 1.f);
  // 100 keys: 2 pages, stored as a block of 16 - room for 1024 keys.
  EXPECT_THROW(summary_add_key(s, 0, 0, 1024, k.data()), InvalidInput);
  EXPECT_THROW(summary_add_key(s, 1, 0, 5, k.data()), InvalidInput);
  EXPECT_THROW(summary_add_key(s, 0, 0, -1, k.data()), InvalidInput);
  EXPECT_NO_THROW(summary_add_key(s, 0, 0, 1023, k.data()));  // (the block's room)
}

// choose_pages orders only the head of the pages it can take: the same choice as the whole order (NaN
// first, then decreasing score, ties to the earlier page; a short last page taken wherever it ranks), over
// random scores with ties and NaNs, short and whole last pages, with and without sinks and recent keys.
TEST(KvSummary, ChoiceIsTheWholeOrdersGreedyChoice) {
  const auto whole_order = [](const std::vector<double>& score, int64_t n, const PageBudget& b) {
    const int64_t pages = summary_pages(n);
    std::vector<char> chosen(static_cast<size_t>(pages), 0);
    int64_t used = 0;
    const auto size = [&](int64_t x) { return std::min(kSummaryPageKeys, n - x * kSummaryPageKeys); };
    const AlwaysPages a = always_pages(n, b);
    for (int64_t x = 0; x < pages; ++x)
      if (x < a.sink_end || x >= a.recent_begin) chosen[x] = 1, used += size(x);
    std::vector<int64_t> order(static_cast<size_t>(pages));
    for (int64_t x = 0; x < pages; ++x) order[x] = x;
    const auto key = [&](int64_t x) {
      return std::isnan(score[x]) ? std::numeric_limits<double>::infinity() : score[x];
    };
    std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return key(x) > key(y); });
    for (const int64_t x : order)
      if (!chosen[x] && used + size(x) <= b.tokens) chosen[x] = 1, used += size(x);
    std::vector<int64_t> out;
    for (int64_t x = 0; x < pages; ++x)
      if (chosen[x]) out.push_back(x);
    return out;
  };
  std::mt19937 rng(11);
  int compared = 0;
  for (const int64_t n : {int64_t{64 * 50}, int64_t{64 * 50 + 17}, int64_t{200}}) {
    for (const PageBudget b : {PageBudget{256, 0, 0}, PageBudget{300, 10, 70}, PageBudget{1000, 64, 0},
                               PageBudget{64 * 49 + 20, 0, 5}, PageBudget{17, 0, 0}, PageBudget{81, 0, 0}}) {
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<double> score(static_cast<size_t>(summary_pages(n)));
        for (double& x : score) {
          x = static_cast<double>(rng() % 7);  // many ties
          if (rng() % 13 == 0) x = std::numeric_limits<double>::quiet_NaN();
        }
        EXPECT_EQ(choose_pages(score, n, b), whole_order(score, n, b)) << n << " " << b.tokens << " " << trial;
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 3 * 6 * 20);
}

TEST(KvSummary, ChoiceKeepsSinksRecentKeysAndTheBudget) {
  // 10 pages of 64 keys, the last one 20 keys (596 keys); scores favour pages 6 and 3.
  const std::vector<double> score = {0.1, 0.2, 0.3, 5.0, 0.4, 0.5, 9.0, 0.6, 0.7, 0.8};
  EXPECT_EQ(choose_pages(score, 596, {0, 0, 0}).size(), 10u);       // no budget: every page
  EXPECT_EQ(choose_pages(score, 596, {100000, 0, 0}).size(), 10u);  // a budget over the keys: every page
  EXPECT_EQ(choose_pages(score, 596, {128, 0, 0}), std::vector<int64_t>({3, 6}));
  // Sinks (the first 4 keys: page 0) and the last 30 keys (pages 8 and 9) always; the budget counts them:
  // 64 + 64 + 20 = 148 of 300 leave two more pages (6, then 3).
  EXPECT_EQ(choose_pages(score, 596, {300, 4, 30}), std::vector<int64_t>({0, 3, 6, 8, 9}));
  // A budget smaller than the sinks and recent pages still takes them.
  EXPECT_EQ(choose_pages(score, 596, {10, 4, 1}), std::vector<int64_t>({0, 9}));
  // Whole pages only: 100 tokens take one 64-key page, and then the 20-key page still fits.
  EXPECT_EQ(choose_pages(score, 596, {100, 0, 0}), std::vector<int64_t>({6, 9}));
  EXPECT_THROW(choose_pages(score, 700, {100, 0, 0}), InvalidInput);  // 11 pages, 10 scores
}

// A needle - one key aligned with the query among noise - at several depths of a long cache: a budget
// of an eighth of the pages (sinks and recent keys included) finds its page, and the chosen keys hold
// nearly all of the attention's mass.
TEST(KvSummary, APlantedNeedleIsFoundAtAnyDepth) {
  Problem p = test::shape(1, 4, 1, 1, 4096, 64);
  p.causal = CausalAlign::BottomRight;
  for (const int64_t depth : {int64_t{5}, int64_t{700}, int64_t{2047}, int64_t{3333}, int64_t{4000}}) {
    Tensors t = random_tensors(p, 21);
    // q of head 2 times 8 as the needle's key: a score of ~8 |q|^2 / sqrt(d) against noise ~N(0, |q|^2 / d).
    const float* q = t.inputs.q.row(0, 2, 0);
    float* k = const_cast<float*>(t.inputs.k.row(0, 0, depth));
    for (int64_t x = 0; x < p.head_dim; ++x) k[x] = 8.f * q[x];
    const KvSummary s = summarize_keys(p, t.inputs);
    const std::vector<double> score = group_page_scores(p, t.inputs, s, 0, 0, 0);
    const std::vector<int64_t> pages = choose_pages(score, p.kv_len, {512, 64, 64});
    EXPECT_LE(static_cast<int64_t>(pages.size()), 8);
    EXPECT_TRUE(std::find(pages.begin(), pages.end(), depth / kSummaryPageKeys) != pages.end()) << "depth " << depth;
    const SelectionAccuracy a = selection_accuracy(p, t.inputs, {0, 2, 0}, pages);
    EXPECT_GE(a.recall, 0.95) << "depth " << depth;
    EXPECT_LT(a.o_rel_error, 0.1) << "depth " << depth;
    // Planted: the page one off the needle's loses it.
    std::vector<int64_t> off = pages;
    for (int64_t& x : off)
      if (x == depth / kSummaryPageKeys) x = (x + 1) % summary_pages(p.kv_len);
    EXPECT_LT(selection_accuracy(p, t.inputs, {0, 2, 0}, off).recall, 0.5) << "depth " << depth;
  }
}

TEST(KvSummary, EveryPageChosenIsDenseAttention) {
  for (const CacheCase& c : cache_cases()) {
    const Problem p = cache_problem(c);
    const Tensors t = random_tensors(p, 13);
    std::vector<int64_t> all(static_cast<size_t>(summary_pages(p.kv_len)));
    for (size_t x = 0; x < all.size(); ++x) all[x] = static_cast<int64_t>(x);
    for (int64_t b = 0; b < p.batch; ++b) {
      const SelectionAccuracy a = selection_accuracy(p, t.inputs, {b, 3, 0}, all);
      EXPECT_DOUBLE_EQ(a.recall, 1.0) << p.describe();
      EXPECT_EQ(a.o_rel_error, 0.0) << p.describe();
    }
    // No page: no mass, and O = 0 is all of O's norm off.
    const SelectionAccuracy none = selection_accuracy(p, t.inputs, {0, 3, 0}, {});
    EXPECT_EQ(none.recall, 0.0);
    EXPECT_DOUBLE_EQ(none.o_rel_error, 1.0);  // O_pages = 0
  }
}

TEST(KvSummary, PatternsAndScoreModificationsAreRefusedNamingTheField) {
  Problem p = test::shape(1, 2, 1, 1, 200, 16);
  const Tensors t = random_tensors(p, 1);
  const KvSummary s = summarize_keys(p, t.inputs);
  Problem cap = p;
  cap.softcap = 30.f;
  try {
    group_page_scores(cap, t.inputs, s, 0, 0, 0);
    ADD_FAILURE() << "softcap accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("score modifications"), std::string::npos) << e.what();
  }
  Problem sinks = p;
  sinks.sinks = 4, sinks.window_left = 32, sinks.window_right = 0;
  EXPECT_THROW(selection_accuracy(sinks, t.inputs, {0, 0, 0}, {0}), InvalidInput);
}

}  // namespace
}  // namespace attnlab
