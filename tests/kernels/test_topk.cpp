// Query-aware sparse decode (Problem::topk_tokens; include/attnlab/kv_summary.hpp's topk_pages) through
// decode and decode_i8: a budget covering every page is dense decode bit for bit; a smaller one is
// exact attention over the chosen pages (the agreement rule against the float64 reference of the
// problem masked to those pages); special values in skipped and chosen pages; a needle found end to
// end; the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "attnlab/isa.hpp"
#include "attnlab/kernel.hpp"
#include "attnlab/kv_summary.hpp"
#include "attnlab/verify.hpp"
#include "cpu/dispatch/isa_internal.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// O and LSE of kernel k on p (its own tensors' inputs), 2 threads.
struct KernelRun {
  Tensors out;
};
KernelRun run_kernel(const Kernel& k, const Problem& p, const Inputs& in) {
  KernelRun r{allocate_outputs(p)};
  Session s(k, p, 2);
  s.run(in, r.out.outputs);
  return r;
}

bool bitwise_equal(const Problem& p, const KernelRun& a, const KernelRun& b) {
  for (int64_t x = 0; x < p.batch; ++x)
    for (int64_t h = 0; h < p.q_heads; ++h)
      for (int64_t i = 0; i < p.q_len; ++i) {
        if (std::memcmp(a.out.outputs.o.row(x, h, i), b.out.outputs.o.row(x, h, i), sizeof(float) * p.dim_v()))
          return false;
      }
  return std::memcmp(a.out.outputs.lse, b.out.outputs.lse, sizeof(float) * p.lse_elems()) == 0;
}

struct CacheCase {
  KvDType kv;
  DType dtype;
  int64_t block;
};
const CacheCase kCaches[] = {{KvDType::Same, DType::F32, 0},  {KvDType::Same, DType::BF16, 64},
                             {KvDType::Same, DType::F16, 0},  {KvDType::U8, DType::F32, 0},
                             {KvDType::Q4_0, DType::F32, 32}, {KvDType::Fp8E5M2, DType::F32, 0}};

// Decode's shape: 3 new rows of 8 query heads on 2 kv heads, two sequences of different lengths,
// bottom-right causal; a budget of 640 keys with the first 64 and the last 100 always.
Problem topk_problem(const CacheCase& c, int64_t tokens) {
  Problem p = test::shape(2, 8, 2, 3, 5000, 64);
  p.kv_dtype = c.kv, p.dtype = c.dtype, p.kv_block = c.block, p.kv_lens = {5000, 2100};
  p.causal = CausalAlign::BottomRight;
  p.topk_tokens = tokens, p.topk_sinks = 64, p.topk_recent = 100;
  p.validate();
  return p;
}

// f(kernel, problem) for every kernel variant that states topk and every cache of `caches` it runs, at
// budget `tokens`; how many pairs ran.
template <class F>
int for_each_topk_case(int64_t tokens, const std::vector<CacheCase>& caches, const F& f) {
  int ran = 0;
  for (const Kernel* k : variants()) {
    if (!k->capabilities().topk || !k->available()) continue;
    for (const CacheCase& c : caches) {
      const Problem p = topk_problem(c, tokens);
      if (!supports_problem(*k, p)) continue;
      f(*k, p);
      ++ran;
    }
  }
  return ran;
}
const std::vector<CacheCase> kAllCaches(std::begin(kCaches), std::end(kCaches));

TEST(TopkDecode, BudgetCoveringEveryPageIsDenseDecodeBitForBit) {
  EXPECT_GT(
      for_each_topk_case(5000, kAllCaches,
                         [](const Kernel& k, const Problem& p) {
                           Problem dense = p;
                           dense.topk_tokens = dense.topk_sinks = dense.topk_recent = 0;
                           const Tensors t = random_tensors(p, 4);
                           EXPECT_TRUE(bitwise_equal(p, run_kernel(k, p, t.inputs), run_kernel(k, dense, t.inputs)))
                               << test::variant_name(k) << " " << p.describe();
                         }),
      0);
}

// The float kernel (decode): exact attention over the chosen pages, by the agreement rule of the masked
// problem (its float64 reference and float32 tolerance).
TEST(TopkDecode, ChosenPagesAgreeWithTheReferenceOverThem) {
  const Kernel& decode = kernel_or_throw("decode");
  for (const CacheCase& c : kCaches) {
    const Problem p = topk_problem(c, 640);
    const Tensors t = random_tensors(p, 6);
    const Problem m = masked_to_pages(p, t.inputs);
    const Agreement a = prepare_agreement(m, t.inputs, all_rows(m));
    const KernelRun r = run_kernel(decode, p, t.inputs);
    const Errors e = measure(a.ref, as_const(r.out.outputs.o), r.out.outputs.lse, m);
    EXPECT_TRUE(a.tol.passes(e)) << p.describe() << ": O " << e.o_rel << " LSE " << e.lse;
    // And it is not dense decode: the dense reference is further off than the tolerance.
    Problem dense = p;
    dense.topk_tokens = dense.topk_sinks = dense.topk_recent = 0;
    const Agreement ad = prepare_agreement(dense, t.inputs, all_rows(dense));
    EXPECT_FALSE(ad.tol.passes(measure(ad.ref, as_const(r.out.outputs.o), r.out.outputs.lse, dense))) << p.describe();
  }
}

// Every kernel that states topk, on every cache: exact attention over the pages topk_pages chose (a
// chunk merge off by a page, or a page list cut short, moves O by more than the tolerance), judged by
// check_topk - which also measures what the choice costs: random keys spread the softmax, so an eighth
// of the keys holds well under all the mass and O moves from dense by more than the exact part's error.
TEST(TopkDecode, EveryTopkKernelIsExactOverTheChosenPages) {
  EXPECT_GT(for_each_topk_case(640, kAllCaches,
                               [](const Kernel& k, const Problem& p) {
                                 const Tensors t = random_tensors(p, 8);
                                 const TopkCheck r = check_topk(k, p, t.inputs, all_rows(p), 2);
                                 EXPECT_EQ(r.exact.verdict, Verdict::Pass)
                                     << test::variant_name(k) << " " << p.describe() << ": " << r.exact.reason;
                                 EXPECT_GT(r.recall_min, 0.0);
                                 EXPECT_LE(r.recall_min, r.recall_mean);
                                 EXPECT_LT(r.recall_mean, 0.9) << p.describe();
                                 EXPECT_GT(r.err_dense, 10 * r.exact.errors.o_rel) << p.describe();
                               }),
            0);
}

// At a budget covering every page check_topk's recall is 1 and its dense error the exact part's.
TEST(TopkDecode, CheckTopkAtAFullBudgetIsTheAgreementRule) {
  const Problem p = topk_problem(kCaches[3], 5000);
  const Tensors t = random_tensors(p, 9);
  const TopkCheck r = check_topk(kernel_or_throw("decode_i8"), p, t.inputs, all_rows(p), 2);
  EXPECT_EQ(r.exact.verdict, Verdict::Pass) << r.exact.reason;
  EXPECT_DOUBLE_EQ(r.recall_min, 1.0);
  EXPECT_DOUBLE_EQ(r.err_dense, r.exact.errors.o_rel);
}

// The pages are chosen per (sequence, kv head) and their chunks merged in a fixed order: the bits do not
// depend on the thread count.
TEST(TopkDecode, BitsDoNotDependOnTheThreadCount) {
  EXPECT_GT(for_each_topk_case(640, {kCaches[0], kCaches[3]},
                               [](const Kernel& k, const Problem& p) {
                                 const Tensors t = random_tensors(p, 12);
                                 KernelRun one{allocate_outputs(p)}, three{allocate_outputs(p)};
                                 Session(k, p, 1).run(t.inputs, one.out.outputs);
                                 Session(k, p, 3).run(t.inputs, three.out.outputs);
                                 EXPECT_TRUE(bitwise_equal(p, one, three))
                                     << test::variant_name(k) << " " << p.describe();
                               }),
            0);
}

// A NaN key in a page the budget skips does not reach O; one in a chosen page makes the rows that see it
// NaN, as dense attention over the chosen keys says.
TEST(TopkDecode, ANanKeyLeaksOnlyFromAChosenPage) {
  const Kernel& decode = kernel_or_throw("decode");
  // 200 keys: the sinks' page and the recent keys' pages only (sequence 0: page 0, and 76, 77 and the
  // 8 keys of 78; sequence 1: page 0, 31 and the 52 keys of 32).
  Problem p = topk_problem(kCaches[0], 200);
  Tensors t = random_tensors(p, 2);
  const_cast<float*>(t.inputs.k.row(0, 0, 2500))[7] = kNan;  // a middle page of sequence 0, kv head 0
  attach_summary(p, t);
  const std::vector<int64_t> skipped = topk_pages(p, t.inputs, 0, 0);
  ASSERT_TRUE(std::find(skipped.begin(), skipped.end(), 2500 / kSummaryPageKeys) == skipped.end());
  const KernelRun r = run_kernel(decode, p, t.inputs);
  for (int64_t h = 0; h < p.q_heads; ++h)
    for (int64_t i = 0; i < p.q_len; ++i)
      for (int64_t d = 0; d < p.dim_v(); ++d) ASSERT_TRUE(std::isfinite(r.out.outputs.o.row(0, h, i)[d])) << h;
  // A budget with room for one more page takes the NaN page first (its bound is NaN): kv head 0's rows
  // are NaN, kv head 1's and sequence 1's stay finite.
  p.topk_tokens = 264;
  attach_summary(p, t);
  const std::vector<int64_t> chosen = topk_pages(p, t.inputs, 0, 0);
  ASSERT_TRUE(std::find(chosen.begin(), chosen.end(), 2500 / kSummaryPageKeys) != chosen.end());
  const KernelRun n = run_kernel(decode, p, t.inputs);
  EXPECT_TRUE(std::isnan(n.out.outputs.o.row(0, 0, 0)[0]));
  EXPECT_TRUE(std::isfinite(n.out.outputs.o.row(0, 4, 0)[0]));  // kv head 1 (heads 4..7)
  EXPECT_TRUE(std::isfinite(n.out.outputs.o.row(1, 0, 0)[0]));  // sequence 1
}

// A needle at several depths of an 8k cache, through the kernel: with an eighth of the keys it gives
// nearly dense O, and topk_pages' choice holds the needle's page.
TEST(TopkDecode, ANeedleAtAnyDepthIsRetrievedEndToEnd) {
  const Kernel& decode = kernel_or_throw("decode");
  Problem p = test::shape(1, 8, 2, 1, 8192, 64);
  p.causal = CausalAlign::BottomRight;
  p.topk_tokens = 1024, p.topk_sinks = 64, p.topk_recent = 64;
  Problem dense = p;
  dense.topk_tokens = dense.topk_sinks = dense.topk_recent = 0;
  for (const int64_t depth : {int64_t{100}, int64_t{4000}, int64_t{8000}}) {
    Tensors t = random_tensors(p, 31);
    for (int64_t hk = 0; hk < p.kv_heads; ++hk) {
      const float* q = t.inputs.q.row(0, hk * p.group() + 1, 0);
      float* k = const_cast<float*>(t.inputs.k.row(0, hk, depth));
      for (int64_t x = 0; x < p.head_dim; ++x) k[x] = 8.f * q[x];
    }
    attach_summary(p, t);
    const std::vector<int64_t> pages = topk_pages(p, t.inputs, 0, 0);
    EXPECT_TRUE(std::find(pages.begin(), pages.end(), depth / kSummaryPageKeys) != pages.end()) << depth;
    const SelectionAccuracy acc = selection_accuracy(p, t.inputs, {0, 1, 0}, pages);
    EXPECT_GE(acc.recall, 0.95) << depth;
    const KernelRun a = run_kernel(decode, p, t.inputs), b = run_kernel(decode, dense, t.inputs);
    double diff = 0, norm = 0;
    for (int64_t d = 0; d < p.dim_v(); ++d) {
      const double u = a.out.outputs.o.row(0, 1, 0)[d], v = b.out.outputs.o.row(0, 1, 0)[d];
      diff += (u - v) * (u - v), norm += v * v;
    }
    EXPECT_LT(std::sqrt(diff / norm), 0.1) << depth;
  }
}

// Every target's page scorer (the kernels') gives the reference's bits - on head dims that are and are not
// multiples of the 16 lanes, one query and a group, with a NaN, an infinity and an empty page's
// +inf/-inf among the summaries - so a kernel chooses the pages topk_pages names on any target.
TEST(TopkDecode, EveryTargetsPageScorerIsTheReferenceBitForBit) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (const std::string& isa : runnable_isas()) {
    const TargetTable& t = *target_table_for(isa);
    ASSERT_NE(t.probes.page_scores, nullptr) << isa;
    for (const int64_t d : {int64_t{16}, int64_t{33}, int64_t{80}, int64_t{128}, int64_t{256}}) {
      for (const int64_t group : {int64_t{1}, int64_t{4}}) {
        const int64_t pages = group == 1 ? 3 * kSummaryBlockPages + 5 : 5 * kSummaryBlockPages + 7;
        std::vector<float> q(static_cast<size_t>(d)), split(static_cast<size_t>(2 * group * d));
        for (int64_t g = 0; g < group; ++g) {
          for (float& x : q) x = u(rng);
          split_query(q.data(), d, split.data() + 2 * g * d, split.data() + (2 * g + 1) * d);
        }
        KvSummary s;  // 6 blocks: the scorers' runs of 4 blocks and the single ones after, a short last block
        s.batch = s.kv_heads = 1, s.pages = 6 * kSummaryBlockPages, s.dim = d;
        s.own = alloc_floats(s.floats());
        for (int64_t x = 0; x < s.pages; ++x)
          for (int64_t y = 0; y < d; ++y) {
            const float a = u(rng), b = u(rng);
            s.lo(0, 0, x, y) = std::min(a, b), s.hi(0, 0, x, y) = std::max(a, b);
          }
        s.lo(0, 0, 3, d / 2) = kNan;                                           // page 3: a NaN key
        s.hi(0, 0, 5, 1) = std::numeric_limits<float>::infinity();             // page 5: an infinite one
        for (int64_t y = 0; y < d; ++y) s.lo(0, 0, 7, y) = -s.hi(0, 0, 7, y);  // page 7: +-
        for (int64_t y = 0; y < d; ++y) s.lo(0, 0, 70, y) = 1.f / 0.f, s.hi(0, 0, 70, y) = -1.f / 0.f;  // empty
        std::vector<float> want(static_cast<size_t>(pages)), got(static_cast<size_t>(pages), 1.f);
        page_scores_reference(split.data(), group, d, s.block(0, 0, 0), pages, want.data());
        t.probes.page_scores(split.data(), group, d, s.block(0, 0, 0), pages, got.data());
        for (int64_t x = 0; x < pages; ++x) {
          const bool same = std::isnan(want[x]) ? std::isnan(got[x]) : std::memcmp(&want[x], &got[x], 4) == 0;
          EXPECT_TRUE(same) << isa << " d " << d << " group " << group << " page " << x << ": " << want[x] << " vs "
                            << got[x];
        }
        EXPECT_TRUE(std::isnan(got[3])) << isa;
      }
    }
  }
}

// FLOPs and bytes count the budget's keys (and the summaries), the dense problem's when it covers them.
TEST(TopkDecode, FlopsAndBytesCountTheBudget) {
  Problem p = test::shape(1, 8, 2, 1, 5000, 64);  // one row, sees all 5000 keys
  Problem dense = p;
  p.topk_tokens = 5000;
  EXPECT_EQ(p.visible_pairs(), dense.visible_pairs());
  p.topk_tokens = 640, p.topk_sinks = 4, p.topk_recent = 100;
  // The sinks' page (64) and the last 100 keys' pages (76 .. 78: 136 keys) fit in 640.
  EXPECT_EQ(p.topk_keys(0), 640);
  EXPECT_EQ(p.visible_pairs(), 640 * 8);
  EXPECT_DOUBLE_EQ(p.forward_flops(), 2.0 * 128 * 640 * 8);
  const double row = 2 * 64 * 4, summaries = 79 * 2 * 64 * 4;  // 79 pages of min and max
  EXPECT_DOUBLE_EQ(p.kv_bytes(), 2 * (640 * row + summaries));
  p.topk_tokens = 100;  // less than the pages that are always read: those
  EXPECT_EQ(p.topk_keys(0), 200);
}

TEST(TopkDecode, RefusalsNameTheFieldAndTheKernels) {
  Problem p = topk_problem(kCaches[0], 640);
  const Support s = supports_problem(kernel_or_throw("flash"), p);
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason.find("topk_tokens 640"), std::string::npos) << s.reason;
  EXPECT_NE(s.reason.find("decode"), std::string::npos) << s.reason;
  // No summaries in the inputs.
  Tensors t = random_tensors(p, 1);
  t.inputs.summary = nullptr;
  try {
    run_kernel(kernel_or_throw("decode"), p, t.inputs);
    ADD_FAILURE() << "ran without summaries";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("page summaries"), std::string::npos) << e.what();
  }
  // The agreement rule is not an approximation's judge.
  EXPECT_THROW(prepare_agreement(p, t.inputs, all_rows(p)), InvalidInput);
  const auto fails_with = [](const std::function<void(Problem&)>& f, const std::string& field) {
    Problem q = test::shape(1, 4, 2, 1, 500, 32);
    q.topk_tokens = 128;
    f(q);
    try {
      q.validate();
      ADD_FAILURE() << "accepted: " << field;
    } catch (const InvalidInput& e) {
      EXPECT_EQ(std::string(e.what()).rfind(field, 0), 0u) << e.what();
    }
  };
  fails_with([](Problem& q) { q.topk_tokens = -1; }, "topk_tokens");
  fails_with([](Problem& q) { q.topk_recent = -5; }, "topk_recent");
  fails_with([](Problem& q) { q.topk_tokens = 0, q.topk_sinks = 4; }, "topk_sinks");
  fails_with([](Problem& q) { q.sinks = 4, q.window_left = 64, q.window_right = 0; }, "topk_tokens");
  fails_with([](Problem& q) { q.softcap = 30.f; }, "topk_tokens");
}

}  // namespace
}  // namespace attnlab
