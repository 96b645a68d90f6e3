// The score modifications (include/attnlab/blocks/score_mod.hpp: softcap, ALiBi, sink logits):
// the float64 reference on hand-computed rows, every kernel that states it runs them
// (Capabilities::score_mods) against the reference over odd sizes, masks, GQA ratios, layouts,
// caches and decode's chunks, special values under them, the refusals of the others, and a planted
// bug per term that the agreement rule must catch.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attnlab/kernel.hpp"
#include "attnlab/verify.hpp"
#include "attnlab/blocks/textbook.hpp"
#include "cuda_emu.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

constexpr int kSoftcap = 1, kAlibi = 2, kSink = 4;  // which modifications a case sets

void set_mods(Problem& p, int mods) {
  p.softcap = mods & kSoftcap ? 4.f : 0.f;
  p.alibi = mods & kAlibi ? alibi_slopes(p.q_heads) : std::vector<float>{};
  p.sink_logits.clear();
  if (mods & kSink) {
    for (int64_t h = 0; h < p.q_heads; ++h) p.sink_logits.push_back(static_cast<float>(h % 3) - 0.75f);
  }
}

std::string mods_name(int mods) {
  std::string n;
  if (mods & kSoftcap) n += "softcap";
  if (mods & kAlibi) n += "alibi";
  if (mods & kSink) n += "sink";
  return n;
}

// ---- The reference, by hand ----

// One row, two keys, d 1: scores 1 and 3 before the modifications.
TEST(ScoreModReference, HandComputedRow) {
  Problem p = test::shape(1, 1, 1, 1, 2, 1);
  p.scale = 1.f;
  Tensors t = random_tensors(p, 1);
  const_cast<float*>(t.inputs.q.row(0, 0, 0))[0] = 1.f;
  const_cast<float*>(t.inputs.k.row(0, 0, 0))[0] = 1.f;
  const_cast<float*>(t.inputs.k.row(0, 0, 1))[0] = 3.f;
  const_cast<float*>(t.inputs.v.row(0, 0, 0))[0] = 10.f;
  const_cast<float*>(t.inputs.v.row(0, 0, 1))[0] = 20.f;
  const auto row = [&](const Problem& q) {
    double o = 0, scale = 0;
    const double lse = reference_row(q, t.inputs, {0, 0, 0}, &o, &scale);
    return std::pair{o, lse};
  };
  const auto expect = [](double s0, double s1, double sink) {
    const double e0 = std::exp(s0), e1 = std::exp(s1), z = e0 + e1 + std::exp(sink);
    return std::pair{(10 * e0 + 20 * e1) / z, std::log(z)};
  };
  const double ninf = -std::numeric_limits<double>::infinity();
  Problem cap = p;
  cap.softcap = 2.f;  // 2 tanh(s / 2)
  EXPECT_NEAR(row(cap).first, expect(2 * std::tanh(0.5), 2 * std::tanh(1.5), ninf).first, 1e-12);
  EXPECT_NEAR(row(cap).second, expect(2 * std::tanh(0.5), 2 * std::tanh(1.5), ninf).second, 1e-12);
  Problem alibi = p;
  alibi.alibi = {0.5f};  // the one row's diagonal is key 1 (bottom-right): distances -1 and 0
  EXPECT_NEAR(row(alibi).first, expect(1 - 0.5, 3, ninf).first, 1e-12);
  EXPECT_NEAR(row(alibi).second, expect(1 - 0.5, 3, ninf).second, 1e-12);
  Problem sink = p;
  sink.sink_logits = {2.f};
  EXPECT_NEAR(row(sink).first, expect(1, 3, 2).first, 1e-12);
  EXPECT_NEAR(row(sink).second, expect(1, 3, 2).second, 1e-12);
  Problem all = p;  // softcap first, then ALiBi
  all.softcap = 2.f, all.alibi = {0.5f}, all.sink_logits = {2.f};
  EXPECT_NEAR(row(all).first, expect(2 * std::tanh(0.5) - 0.5, 2 * std::tanh(1.5), 2).first, 1e-12);
  // A row that sees no key: O = 0 and LSE = the sink logit alone.
  Problem empty = sink;
  empty.kv_lens = {0};
  EXPECT_EQ(row(empty).first, 0.0);
  EXPECT_EQ(row(empty).second, 2.0);
}

// The standard slopes and one sink logit for every head are resolved against q_heads where they are
// read, so a term set before the sizes (a CLI's .npy files, Python's arrays) follows them.
TEST(ScoreModProblem, StandardSlopesAndOneLogitFollowTheHeads) {
  Problem p = test::shape(1, 2, 1, 3, 5, 8);
  p.alibi_standard = true, p.sink_logits = {0.5f};
  p.q_heads = 12;
  p.validate();
  for (int64_t h = 0; h < 12; ++h) {
    EXPECT_EQ(p.alibi_slope(h), alibi_slopes(12)[h]) << h;
    EXPECT_EQ(p.sink_logit(h), 0.5f) << h;
  }
  EXPECT_EQ(p.score_mod_name().rfind("alibi_sink", 0), 0u) << p.score_mod_name();
}

TEST(ScoreModReference, StandardAlibiSlopes) {
  const std::vector<float> eight = alibi_slopes(8);  // 2^-1 .. 2^-8
  for (int k = 0; k < 8; ++k) EXPECT_EQ(eight[k], std::exp2f(-static_cast<float>(k + 1))) << k;
  // 12 heads: the 8 of 8 heads, then 16 heads' odd slopes 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 (BLOOM's rule).
  const std::vector<float> twelve = alibi_slopes(12);
  ASSERT_EQ(twelve.size(), 12u);
  for (int k = 0; k < 4; ++k) EXPECT_NEAR(twelve[8 + k], std::exp2(-0.5 - k), 1e-7) << k;
}

TEST(ScoreModProblem, BadValuesNameTheField) {
  const auto fails_with = [](const std::function<void(Problem&)>& f, const std::string& field) {
    Problem p = test::shape(1, 4, 2, 3, 5, 8);
    f(p);
    try {
      p.validate();
      ADD_FAILURE() << "accepted: " << field;
    } catch (const InvalidInput& e) {
      EXPECT_EQ(std::string(e.what()).rfind(field, 0), 0u) << e.what();
    }
  };
  fails_with([](Problem& p) { p.softcap = -1.f; }, "softcap");
  fails_with([](Problem& p) { p.softcap = kInf; }, "softcap");
  fails_with([](Problem& p) { p.alibi = {1.f, 2.f}; }, "alibi");
  fails_with([](Problem& p) { p.alibi = {1.f, 2.f, kNan, 3.f}; }, "alibi[2]");
  fails_with([](Problem& p) { p.sink_logits = {1.f, 2.f}; }, "sink_logits");
  fails_with([](Problem& p) { p.alibi_standard = true, p.alibi = {1.f, 2.f, 3.f, 4.f}; }, "alibi");
  fails_with([](Problem& p) { p.sink_logits = {1.f, -kInf, 0.f, 0.f}; }, "sink_logits[1]");
}

// ---- Every kernel that runs them, against the reference ----

struct Case {
  Problem p;
  std::string name;
  int mods = 0;
};

// Small grids (sanitizer builds, test::small_mode): all three terms together only, and no shape past
// a few hundred keys.
std::vector<Case> grid() {
  std::vector<Case> out;
  const bool small = test::small_mode();
  const auto add = [&](Problem p, const std::string& name,
                       std::initializer_list<int> all = {kSoftcap, kAlibi, kSink, kSoftcap | kAlibi | kSink}) {
    if (small && p.kv_len > 1000) return;
    for (int mods : all) {
      if (small && mods != *(all.end() - 1)) continue;
      Problem q = p;
      set_mods(q, mods);
      out.push_back({q, name + "_" + mods_name(mods), mods});
    }
  };
  Problem p = test::shape(1, 4, 2, 37, 70, 40);  // prefill, odd sizes, GQA 2
  add(p, "gqa");
  p.causal = CausalAlign::BottomRight;
  add(p, "gqa_causal");
  p.causal = CausalAlign::TopLeft;
  add(p, "gqa_causal_tl");
  Problem w = test::shape(2, 6, 2, 130, 200, 64);  // two query tiles, windows, a zero kv length
  w.window_left = 40, w.window_right = 3, w.kv_lens = {200, 0};
  add(w, "window_kvlens");
  w.layout = Layout::BSHD, w.kv_lens = {150, 77}, w.window_left = -1, w.window_right = -1;
  w.causal = CausalAlign::BottomRight;
  add(w, "bshd_causal_kvlens");
  Problem wide = test::shape(1, 8, 8, 300, 600, 80);  // wide steps (whole 64-key tiles)
  if (!small) add(wide, "mha_wide");
  Problem bf = test::shape(1, 4, 1, 65, 300, 64);
  bf.dtype = DType::BF16, bf.causal = CausalAlign::BottomRight;
  add(bf, "mqa_bf16");
  for (int64_t sq : {1, 5, 16}) {  // decode: chunks merged, paged and quantized caches, a pattern
    Problem d = test::shape(2, 8, 2, sq, 4097, 64);
    d.kv_lens = {4097, 1500}, d.causal = CausalAlign::BottomRight;
    add(d, "decode" + std::to_string(sq));
  }
  Problem paged = test::shape(1, 8, 2, 3, 700, 64);
  paged.kv_block = 64, paged.window_left = 100, paged.window_right = 0;
  add(paged, "paged_window");
  for (KvDType t : {KvDType::Q8_0, KvDType::U4}) {  // decode_i8's integer scores and P.V too
    Problem quant = test::shape(1, 8, 4, 2, 900, 64);
    quant.kv_dtype = t;
    add(quant, to_string(t));
  }
  Problem big = test::shape(1, 4, 2, 200, 700, 64);  // flash_int8's whole rounded tiles and P.V
  big.causal = CausalAlign::BottomRight;
  add(big, "int8_tiles");
  Problem sinks = test::shape(1, 4, 2, 4, 900, 64);
  sinks.window_left = 64, sinks.window_right = 0, sinks.sinks = 4;
  add(sinks, "streaming_pattern");
  // flash's dilated phases take softcap and sink logits (ALiBi's distances are not a phase's: refused).
  Problem dilated = test::shape(1, 4, 2, 150, 150, 32);
  dilated.causal = CausalAlign::BottomRight, dilated.window_left = 60, dilated.dilation = 3;
  add(dilated, "dilated", {kSoftcap, kSink, kSoftcap | kSink});
  return out;
}

struct Param {
  const Kernel* kernel;
  Case c;
};
void PrintTo(const Param& p, std::ostream* os) { *os << test::variant_name(*p.kernel) << " " << p.c.p.describe(); }

// Every registry variant, then the CUDA kernels' device code under the host emulation (the registry's
// CUDA entries need a device; the emulation runs the same source here).
std::vector<const Kernel*> with_emulated_cuda() {
  std::vector<const Kernel*> ks = variants();
  for (const char* id : {"naive", "flash", "flash_bf16", "decode"}) ks.push_back(&test::emulated_cuda(id));
  return ks;
}

std::vector<Param> params() {
  std::vector<Param> out;
  for (const Kernel* k : with_emulated_cuda()) {
    if (!k->capabilities().score_mods) continue;
    const bool emulated = k->name().rfind("emu_cuda_", 0) == 0;
    for (Case c : grid()) {
      // The emulation runs a thread at a time (~100x a CPU kernel): each term alone on the small
      // shapes, the three together on every shape.
      if (emulated && c.p.kv_len > 300 && c.mods != (kSoftcap | kAlibi | kSink)) continue;
      const std::optional<DType> d = test::case_dtype(*k, c.p.dtype);
      if (!d) continue;
      c.p.dtype = *d;
      out.push_back({k, c});
    }
  }
  return out;
}

class ScoreModAgreement : public ::testing::TestWithParam<Param> {};

// A kernel that states it runs score modifications refuses a case only for a capability it lacks
// otherwise (a pattern, a cache, its q_len limit) - never for the modifications.
TEST_P(ScoreModAgreement, MatchesFloat64Reference) {
  const Kernel& k = *GetParam().kernel;
  const Problem& p = GetParam().c.p;
  if (Support a = k.available(); !a) GTEST_SKIP() << a.reason;
  if (Support s = supports_problem(k, p); !s) {
    EXPECT_EQ(s.reason.find("score modification"), std::string::npos) << s.reason;
    EXPECT_EQ(s.reason.find("alibi"), std::string::npos) << s.reason;
    GTEST_SKIP() << s.reason;
  }
  Tensors t = random_tensors(p, 11);
  const KernelCheck c = test::check_all_rows(k, p, t);
  EXPECT_EQ(c.verdict, Verdict::Pass) << p.describe() << ": " << c.reason;
}

INSTANTIATE_TEST_SUITE_P(Grid, ScoreModAgreement, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return test::variant_name(*info.param.kernel) + "_" + info.param.c.name;
                         });

// The kernels without the capability refuse, naming exactly the kernels that have it.
TEST(ScoreModRefusal, KernelsThatDoNotRunThemSayWhichDo) {
  Problem p = test::shape(1, 4, 2, 3, 70, 64);
  p.softcap = 30.f;
  for (const Kernel* k : variants()) {
    const Support s = supports_problem(*k, p);
    if (k->capabilities().score_mods) continue;
    ASSERT_FALSE(s) << k->name();
    EXPECT_NE(s.reason.find("score modifications softcap30"), std::string::npos) << s.reason;
    for (const Kernel* r : registry()) {
      const bool named = s.reason.find(std::string(r->name()) + ",") != std::string::npos ||
                         s.reason.find(std::string(r->name()) + " ") != std::string::npos;
      EXPECT_EQ(named, r->capabilities().score_mods) << r->name() << " in: " << s.reason;
    }
  }
  // The float kernels of the tile engine and the CUDA kernels run them; the AMX tiles do not (their
  // scores are unscaled).
  for (const char* name : {"naive", "blocked", "simd", "threaded", "flash", "decode", "flash_bf16", "flash_int8",
                           "decode_i8", "cuda_naive", "cuda_flash", "cuda_flash_bf16", "cuda_decode"}) {
    EXPECT_TRUE(kernel_or_throw(name).capabilities().score_mods) << name;
  }
}

// ALiBi needs each score's key position: the tile engine refuses global columns' gathered tile.
TEST(ScoreModRefusal, AlibiWithGlobalColumnsSaysWhatRunsIt) {
  Problem p = test::shape(1, 4, 2, 3, 700, 64);
  p.window_left = 64, p.window_right = 0, p.globals = {5, 300};
  p.alibi = alibi_slopes(4);
  const Support s = supports_problem(kernel_or_throw("decode"), p);
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason.find("alibi with global positions"), std::string::npos) << s.reason;
  EXPECT_TRUE(supports_problem(kernel_or_throw("naive"), p));
}

// ---- Special values under the modifications ----

// NaN and Inf planted in Q, K and V at a visible key of a prefill tile and of a decode chunk: the
// kernel's O and LSE match the reference's NaN rules (a NaN score under softcap stays NaN; an
// infinite score saturates at +-c, and the row stays finite, as the formula says).
TEST(ScoreModSpecialValues, FollowTheReference) {
  int checked = 0;
  for (const Kernel* k : with_emulated_cuda()) {
    if (!k->capabilities().score_mods || !k->available()) continue;
    // (Sanitizer builds: the emulated kernels' memory paths run in the grid above, as asan-test
    // leaves their special-value matrices to the plain suite.)
    if (test::small_mode() && k->name().rfind("emu_cuda_", 0) == 0) continue;
    for (int64_t sq : {1, 70}) {
      Problem p = test::shape(1, 4, 2, sq, 600, 32);
      p.causal = CausalAlign::BottomRight;
      set_mods(p, kSoftcap | kAlibi | kSink);
      if (const auto d = test::case_dtype(*k, p.dtype)) p.dtype = *d;
      if (!supports_problem(*k, p)) continue;
      for (float value : {kNan, kInf, -kInf}) {
        if (test::small_mode() && value == -kInf) continue;
        for (int target = 0; target < 3; ++target) {
          Tensors t = random_tensors(p, 5);
          const ConstView& view = target == 0 ? t.inputs.q : target == 1 ? t.inputs.k : t.inputs.v;
          const int64_t pos = target == 0 ? sq - 1 : 577;  // a row; a key the last rows see
          if (p.dtype == DType::F32) {
            const_cast<float*>(view.row(0, target == 0 ? 1 : 0, pos))[3] = value;
          } else {
            continue;  // (the 16-bit kernels' special values: test_extreme's SpecialValues16)
          }
          const KernelCheck c = test::check_all_rows(*k, p, t);
          EXPECT_EQ(c.verdict, Verdict::Pass)
              << test::variant_name(*k) << " q_len " << sq << " value " << value << " in "
              << "QKV"[target] << ": " << c.reason;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// An infinite score under softcap is c, so a row whose only large score is +inf stays finite: the
// reference says so, and so does every kernel.
TEST(ScoreModSpecialValues, SoftcapSaturatesAnInfiniteScore) {
  Problem p = test::shape(1, 1, 1, 1, 100, 16);
  p.softcap = 5.f;
  Tensors t = random_tensors(p, 3);
  float* q = const_cast<float*>(t.inputs.q.row(0, 0, 0));
  q[0] = std::fabs(q[0]) + 0.5f;
  const_cast<float*>(t.inputs.k.row(0, 0, 40))[0] = kInf;
  double o[16], scale = 0;
  const double lse = reference_row(p, t.inputs, {0, 0, 0}, o, &scale);
  EXPECT_TRUE(std::isfinite(lse));
  for (const Kernel* k : with_emulated_cuda()) {
    if (!k->capabilities().score_mods || !k->available() || !supports_problem(*k, p)) continue;
    const KernelCheck c = test::check_all_rows(*k, p, t);
    EXPECT_EQ(c.verdict, Verdict::Pass) << test::variant_name(*k) << ": " << c.reason;
  }
}

// ---- Planted bugs ----

enum class Bug { AlibiOffByOne, SinkInLseTwice, SoftcapAfterMask, AlibiSignFlipped };

// The textbook row with one bug planted, into o (head_dim_v floats); returns LSE.
float planted_row(const Problem& p, const TypedInputs<float>& in, int64_t b, int64_t h, int64_t i, Bug bug, float* o) {
  const int64_t hk = p.kv_head_of(h), n = p.kv_len;
  const Interval iv = p.visible(b, i);
  ScoreMod mod = p.score_mod(b, h, i);
  if (bug == Bug::AlibiOffByOne) mod.pos += 1;
  if (bug == Bug::AlibiSignFlipped) mod.slope = -mod.slope;
  const float sink = p.sink_logit(h);
  if (bug != Bug::SoftcapAfterMask) {
    std::vector<float> s(static_cast<size_t>(n));
    textbook::scores(in.q.row(b, h, i), in.k, b, hk, iv, p.effective_scale(), s.data());
    textbook::modify(mod, iv, s.data());
    const float lse = textbook::softmax_pv(s.data(), in.v, b, hk, iv, o, false, sink);
    return bug == Bug::SinkInLseTwice ? std::log(std::exp(lse) + std::exp(sink)) : lse;
  }
  // Every key scored, the masked ones -inf, then softcap: a masked key becomes -c, and is weighed.
  const Interval all{0, p.kv_len_of(b)};
  std::vector<float> s(static_cast<size_t>(n));
  textbook::scores(in.q.row(b, h, i), in.k, b, hk, all, p.effective_scale(), s.data());
  for (int64_t j = 0; j < all.hi; ++j) {
    if (j < iv.lo || j >= iv.hi) s[j] = -kInf;
    s[j] = mod(s[j], j);
  }
  return textbook::softmax_pv(s.data(), in.v, b, hk, all, o, false, sink);
}

TEST(ScoreModPlanted, EveryPlantedBugFailsTheAgreementRule) {
  Problem p = test::shape(1, 4, 2, 20, 90, 32);
  p.causal = CausalAlign::BottomRight;
  set_mods(p, kSoftcap | kAlibi | kSink);
  Tensors t = random_tensors(p, 9);
  const Agreement a = prepare_agreement(p, t.inputs, all_rows(p));
  const TypedInputs<float> in = typed<float>(t.inputs);
  for (Bug bug : {Bug::AlibiOffByOne, Bug::SinkInLseTwice, Bug::SoftcapAfterMask, Bug::AlibiSignFlipped}) {
    for (int64_t h = 0; h < p.q_heads; ++h)
      for (int64_t i = 0; i < p.q_len; ++i)
        t.outputs.lse[h * p.q_len + i] = planted_row(p, in, 0, h, i, bug, t.outputs.o.row(0, h, i));
    const Errors e = measure(a.ref, as_const(t.outputs.o), t.outputs.lse, p);
    EXPECT_FALSE(a.tol.passes(e)) << "bug " << static_cast<int>(bug) << " passed: O " << e.o_rel << " LSE " << e.lse;
  }
  // The same rows without a bug pass (the test's own row is the textbook's).
  for (int64_t h = 0; h < p.q_heads; ++h)
    for (int64_t i = 0; i < p.q_len; ++i) {
      std::vector<float> s(static_cast<size_t>(p.kv_len));
      t.outputs.lse[h * p.q_len + i] =
          textbook::row(p, in, 0, h, i, p.visible(0, i), s.data(), t.outputs.o.row(0, h, i));
    }
  EXPECT_TRUE(a.tol.passes(measure(a.ref, as_const(t.outputs.o), t.outputs.lse, p)));
}

}  // namespace
}  // namespace attnlab

// ---- The backward ----

namespace attnlab {
namespace {

// A random dO (O's shape) for p, kept with its view.
struct DoTensor {
  std::vector<float> data;
  ConstView view;
  explicit DoTensor(const Problem& p) : data(static_cast<size_t>(p.o_elems())) {
    uint32_t x = 12345;
    for (float& v : data) v = static_cast<float>((x = x * 1664525u + 1013904223u) >> 8) / 16777216.f * 2.f - 1.f;
    view = make_view<const float>(data.data(), p.batch, p.q_heads, p.q_len, p.dim_v(), p.layout);
  }
};

Problem backward_problem(int mods, Layout layout = Layout::BHSD) {
  Problem p = test::shape(2, 4, 2, 11, 19, 16);
  p.causal = CausalAlign::BottomRight, p.kv_lens = {19, 7}, p.layout = layout;
  set_mods(p, mods);
  p.pass = Pass::Backward;
  return p;
}

// Every backward that takes them (naive's, flash's: softcap's derivative on dS, the sink logits'
// gradient) against the float64 reference gradients, every element, dsink included.
TEST(ScoreModBackward, MatchesTheReference) {
  for (int mods : {kSoftcap, kAlibi, kSink, kSoftcap | kAlibi | kSink}) {
    for (Layout layout : {Layout::BHSD, Layout::BSHD}) {
      const Problem p = backward_problem(mods, layout);
      Tensors t = random_tensors(p, 21);
      const DoTensor d_o(p);
      const BackwardAgreement a = prepare_backward_agreement(p, t.inputs, d_o.view);
      EXPECT_EQ(a.ref.dsink.size(), mods & kSink ? 4u : 0u);
      for (const Kernel* k : variants()) {
        if (!k->capabilities().score_mods_backward || !k->available()) continue;
        const BackwardCheck c = check_backward(*k, p, t.inputs, d_o.view, a, 2);
        EXPECT_EQ(c.verdict, Verdict::Pass)
            << test::variant_name(*k) << " " << mods_name(mods) << " " << to_string(layout) << ": " << c.reason;
        if (mods & kSink) {
          EXPECT_LT(c.errors.dsink, 1e-5) << mods_name(mods);
        }
      }
    }
  }
}

// A kernel whose backward takes plain scores refuses, naming those whose backward takes them.
TEST(ScoreModBackward, OthersRefuseNamingThoseThatRunThem) {
  const Problem p = backward_problem(kSoftcap);
  for (const Kernel* k : variants()) {
    if (!k->capabilities().backward || k->capabilities().score_mods_backward) continue;
    const Support s = supports_problem(*k, p);
    ASSERT_FALSE(s) << k->name();
    EXPECT_NE(s.reason.find("their backward: naive, flash;"), std::string::npos) << s.reason;
  }
  EXPECT_TRUE(kernel_or_throw("naive").capabilities().score_mods_backward);
  EXPECT_TRUE(kernel_or_throw("flash").capabilities().score_mods_backward);
}

// Bugs planted around naive's backward: the softcap dropped from the backward's scores, the sink
// logits' gradient not written, or with its sign flipped - each fails the gradients' agreement.
enum class BackwardBug { SoftcapIgnored, DsinkUnwritten, DsinkSignFlipped };
class PlantedBackward final : public test::Wrapped {
 public:
  PlantedBackward(const Kernel& inner, BackwardBug bug) : Wrapped(inner), bug_(bug) {}
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    inner_.run(p, in, out, ctx);
  }
  void run_backward(const Problem& p, const Inputs& in, const BackwardInputs& bw, const Gradients& g,
                    RunContext& ctx) const override {
    Problem q = p;
    Gradients h = g;
    if (bug_ == BackwardBug::SoftcapIgnored) q.softcap = 0.f;
    if (bug_ == BackwardBug::DsinkUnwritten) h.dsink = nullptr;
    inner_.run_backward(q, in, bw, h, ctx);
    if (bug_ == BackwardBug::DsinkSignFlipped)
      for (int64_t x = 0; x < p.q_heads; ++x) g.dsink[x] = -g.dsink[x];
  }

 private:
  BackwardBug bug_;
};

TEST(ScoreModBackward, PlantedBugsFail) {
  const Problem p = backward_problem(kSoftcap | kSink);
  Tensors t = random_tensors(p, 22);
  const DoTensor d_o(p);
  const BackwardAgreement a = prepare_backward_agreement(p, t.inputs, d_o.view);
  for (BackwardBug bug : {BackwardBug::SoftcapIgnored, BackwardBug::DsinkUnwritten, BackwardBug::DsinkSignFlipped}) {
    const PlantedBackward planted(kernel_or_throw("naive"), bug);
    const BackwardCheck c = check_backward(planted, p, t.inputs, d_o.view, a, 2);
    EXPECT_EQ(c.verdict, Verdict::Fail) << "bug " << static_cast<int>(bug) << ": " << c.reason;
  }
}

}  // namespace
}  // namespace attnlab
