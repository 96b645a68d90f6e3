// Needle workloads (include/attnlab/workload.hpp): the planted keys hold the softmax mass asked for,
// whatever the context length and the cache's storage; a query-aware sparse decode whose budget covers
// the needles' pages recalls that mass and no more; bad settings are refused naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "attnlab/kernel.hpp"
#include "attnlab/kv_summary.hpp"
#include "attnlab/workload.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

// The softmax mass of row (b, h, i)'s `top` highest-scoring keys under dense attention (float64, the
// cache's values as read).
double top_mass(const Problem& p, const Inputs& in, const RowId& r, int64_t top) {
  const int64_t hk = p.kv_head_of(r.h), d = p.head_dim;
  const Interval iv = p.visible(r.b, r.i);
  std::vector<float> q(static_cast<size_t>(d)), k(static_cast<size_t>(d));
  std::copy(in.q.row(r.b, r.h, r.i), in.q.row(r.b, r.h, r.i) + d, q.begin());  // Q float32 in these cases
  std::vector<double> s;
  for (int64_t j = iv.lo; j < iv.hi; ++j) {
    read_key(p, in, r.b, hk, j, k.data());
    double dot = 0;
    for (int64_t x = 0; x < d; ++x) dot += static_cast<double>(q[x]) * k[x];
    s.push_back(p.effective_scale() * dot);
  }
  const double m = *std::max_element(s.begin(), s.end());
  double all = 0;
  for (double& x : s) all += (x = std::exp(x - m));
  std::sort(s.begin(), s.end(), std::greater<>());
  double mass = 0;
  for (int64_t x = 0; x < top; ++x) mass += s[x];
  return mass / all;
}

TEST(Workload, NeedlesHoldTheMassAskedForAtAnyLengthAndStorage) {
  for (const KvDType kv : {KvDType::Same, KvDType::U8, KvDType::Q4_0}) {
    for (const int64_t n : {int64_t{3000}, int64_t{40000}}) {
      for (const double mass : {0.5, 0.9}) {
        Problem p = test::shape(1, 4, 2, 1, n, 64);
        p.kv_dtype = kv, p.causal = CausalAlign::BottomRight;
        p.validate();
        const Tensors t = workload_tensors(p, 5, {2, mass});
        double sum = 0;
        for (int64_t h = 0; h < p.q_heads; ++h) sum += top_mass(p, t.inputs, {0, h, 0}, 2);
        // Noise keys among the top two hold nearly nothing; the storage's rounding moves the scores a little.
        EXPECT_NEAR(sum / static_cast<double>(p.q_heads), mass, 0.06) << to_string(kv) << " " << n << " " << mass;
      }
    }
  }
  // No needles: random_tensors' values.
  const Problem p = test::shape(1, 4, 2, 1, 500, 64);
  const Tensors a = workload_tensors(p, 3, {}), b = random_tensors(p, 3);
  EXPECT_TRUE(std::equal(a.k.get(), a.k.get() + p.kv_elems(), b.k.get()));
}

// A budget with room for every row's needles recalls their mass (the noise pages add their little
// share); the sparse decode's O is then close to dense, where random keys' was not.
TEST(Workload, SparseDecodeRecallsTheNeedlesMass) {
  Problem p = test::shape(1, 8, 2, 1, 20000, 64);
  p.kv_dtype = KvDType::U8, p.causal = CausalAlign::BottomRight;
  // 4 heads x 2 needles per kv head: 8 pages, with the sinks' and the recent keys' 2 in 12.
  p.topk_tokens = 12 * kSummaryPageKeys, p.topk_sinks = 4, p.topk_recent = 64;
  p.validate();
  const Tensors t = workload_tensors(p, 7, {2, 0.95});
  const TopkCheck c = check_topk(kernel_or_throw("decode_i8"), p, t.inputs, all_rows(p), 2);
  EXPECT_EQ(c.exact.verdict, Verdict::Pass) << c.exact.reason;
  EXPECT_GE(c.recall_min, 0.9);
  EXPECT_LT(c.err_dense, 0.05);
  // The same budget on the noise alone: the mass is spread, and 768 of 20000 keys hold little of it.
  const Tensors noise = random_tensors(p, 7);
  EXPECT_LT(check_topk(kernel_or_throw("decode_i8"), p, noise.inputs, all_rows(p), 2).recall_mean, 0.2);
}

TEST(Workload, BadSettingsNameTheField) {
  const auto fails_with = [](const Problem& p, const Needles& n, const std::string& field) {
    try {
      workload_tensors(p, 1, n);
      ADD_FAILURE() << "accepted " << field;
    } catch (const InvalidInput& e) {
      EXPECT_EQ(std::string(e.what()).rfind(field, 0), 0u) << e.what();
    }
  };
  const Problem p = test::shape(1, 4, 1, 1, 100, 32);
  fails_with(p, {-1, 0.9}, "needles.per_row");
  fails_with(p, {1, 1.0}, "needles.mass");
  fails_with(p, {1, 0.0}, "needles.mass");
  fails_with(p, {30, 0.9}, "needles.per_row");  // 4 rows x 30 needles in 100 keys
}

}  // namespace
}  // namespace attnlab
