// flash_int8 (src/cpu/kernels/flash_int8.cpp) beyond the shared grids (test_agreement, test_pattern and
// test_extreme run it on every mask, pattern, odd size and special value): the Int8Products
// tolerance on a dense problem rejects the bugs an int8 kernel can make (a test-only kernel of the
// same arithmetic with one planted), the vpmaddubsw path, what smoothing buys on keys with a large
// shared channel, the edges of the rounding (all-equal keys: zero scales), and that the kernel
// really multiplies in integers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "attnlab/isa.hpp"
#include "attnlab/kernel.hpp"
#include "attnlab/kv_quant.hpp"
#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"
#include "attnlab/verify.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

using test::runnable;

// flash_int8 and flash_int8_amx (where this CPU has AMX-INT8 and the OS grants the tile state).
std::vector<const Kernel*> int8_kernels() {
  std::vector<const Kernel*> out = runnable("flash_int8");
  for (const Kernel* k : runnable("flash_int8_amx")) out.push_back(k);
  return out;
}

KernelCheck check(const Kernel& k, const Problem& p, const Tensors& t, int threads = 2) {
  return test::check_all_rows(k, p, t, threads);
}

// flash_int8's arithmetic, written plainly (Q per row, K - mean per key, exact integer sums, the
// scales after, q.mean added back), with one bug planted.
enum class Bug { None, NoSmoothingTerm, KeyScaleTwice, KeyScaleOffByOne, CorrectionDropped, QScaleOfNextRow };

class PlantedInt8 final : public Kernel {
 public:
  explicit PlantedInt8(Bug bug) : bug_(bug) {}
  std::string_view name() const override { return "planted_int8"; }
  std::string_view description() const override { return "test-only int8 kernel with one planted bug"; }
  const Capabilities& capabilities() const override {
    static constexpr Capabilities k{.arithmetic = Arithmetic::Int8Products};
    return k;
  }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext&) const override {
    const int64_t d = p.head_dim;
    std::vector<int8_t> qc(static_cast<size_t>(d)), qn(static_cast<size_t>(d));
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t n = p.kv_len_of(b);
      for (int64_t hk = 0; hk < p.kv_heads; ++hk) {
        std::vector<float> mean(static_cast<size_t>(d)), ks(static_cast<size_t>(n));
        std::vector<int8_t> kc(static_cast<size_t>(n * d));
        ASSERT_TRUE(key_mean(in.k.row(b, hk, 0), in.k.stride_s, n, d, mean.data()));
        for (int64_t j = 0; j < n; ++j)
          ASSERT_TRUE(round_smoothed_key(in.k.row(b, hk, j), mean.data(), d, &kc[j * d], &ks[j]));
        for (int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h) {
          for (int64_t i = 0; i < p.q_len; ++i) {
            float qs = 0, qs_next = 0;
            ASSERT_TRUE(round_q_row(KvDType::Same, in.q.row(b, h, i), d, qc.data(), &qs));
            ASSERT_TRUE(
                round_q_row(KvDType::Same, in.q.row(b, h, std::min(i + 1, p.q_len - 1)), d, qn.data(), &qs_next));
            if (bug_ == Bug::QScaleOfNextRow) qs = qs_next;
            float qm = 0;
            for (int64_t x = 0; x < d; ++x) qm += static_cast<float>(qc[x]) * mean[x];
            const Interval iv = p.mask_for_batch(b).row(i);
            std::vector<double> s;
            double m = -INFINITY;
            for (int64_t j = iv.lo; j < iv.hi; ++j) {
              int32_t dot = 0, ksum = 0;
              for (int64_t x = 0; x < d; ++x) dot += qc[x] * kc[j * d + x], ksum += kc[j * d + x];
              if (bug_ == Bug::CorrectionDropped) dot += 128 * ksum;  // vpdpbusd's q + 128 not taken back
              float k_scale = ks[j];
              if (bug_ == Bug::KeyScaleTwice) k_scale *= ks[j];
              if (bug_ == Bug::KeyScaleOffByOne) k_scale = ks[std::min(j + 1, n - 1)];
              float sc = static_cast<float>(dot) * k_scale * qs;
              if (bug_ != Bug::NoSmoothingTerm) sc += qm * qs;
              s.push_back(sc * p.effective_scale());
              m = std::max(m, s.back());
            }
            float* o = out.o.row(b, h, i);
            std::fill(o, o + p.dim_v(), 0.f);
            double l = 0;
            std::vector<double> acc(static_cast<size_t>(p.dim_v()), 0.0);
            for (size_t x = 0; x < s.size(); ++x) {
              const double w = std::exp(s[x] - m);
              l += w;
              const float* v = in.v.row(b, hk, iv.lo + static_cast<int64_t>(x));
              for (int64_t c = 0; c < p.dim_v(); ++c) acc[c] += w * v[c];
            }
            for (int64_t c = 0; c < p.dim_v() && l > 0; ++c) o[c] = static_cast<float>(acc[c] / l);
            out.lse[(b * p.q_heads + h) * p.q_len + i] = s.empty() ? -INFINITY : static_cast<float>(m + std::log(l));
          }
        }
      }
    }
  }

 private:
  Bug bug_;
};

// Keys with a shared offset (a mean worth smoothing) under a causal mask, GQA 2.
Tensors offset_inputs(const Problem& p, uint64_t seed, int64_t channel, float offset) {
  Tensors t = random_tensors(p, seed);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.kv_heads; ++h)
      for (int64_t j = 0; j < p.kv_len; ++j) const_cast<float*>(t.inputs.k.row(b, h, j))[channel] += offset;
  return t;
}

TEST(FlashInt8, PlantedBugsFailUnderTheInt8Tolerance) {
  Problem p = test::shape(1, 4, 2, 48, 96, 64);
  p.causal = CausalAlign::BottomRight;
  const Tensors t = offset_inputs(p, 17, 3, 2.f);
  for (Bug bug : {Bug::None, Bug::NoSmoothingTerm, Bug::KeyScaleTwice, Bug::KeyScaleOffByOne, Bug::CorrectionDropped,
                  Bug::QScaleOfNextRow}) {
    const KernelCheck c = check(PlantedInt8(bug), p, t);
    if (bug == Bug::None) {
      EXPECT_EQ(c.verdict, Verdict::Pass) << c.reason;
    } else {
      EXPECT_EQ(c.verdict, Verdict::Fail)
          << "bug " << static_cast<int>(bug) << " passed (O err " << c.errors.o_rel << ", LSE err " << c.errors.lse
          << ", tol " << c.tol.o_rel << ", " << c.tol.lse << ")";
    }
  }
  for (const Kernel* k : int8_kernels()) EXPECT_EQ(check(*k, p, t).verdict, Verdict::Pass) << k->isa();
}

// Every target's flash_int8 multiplies what the plain int8 kernel does: one rule for the rounding,
// the same integers - only the float32 epilogue's order differs.
TEST(FlashInt8, EveryTargetScoresTheRulesIntegers) {
  Problem p = test::shape(2, 6, 2, 70, 133, 72);
  p.window_left = 50, p.window_right = 3;
  const Tensors t = offset_inputs(p, 5, 0, -3.f);
  const Tensors plain = allocate_outputs(p);
  RunContext ctx;
  PlantedInt8(Bug::None).run(p, t.inputs, plain.outputs, ctx);
  int ran = 0;
  for (const Kernel* k : runnable("flash_int8")) {
    const Tensors out = allocate_outputs(p);
    Session(*k, p, 2).run(t.inputs, out.outputs);
    double worst = 0;
    for (int64_t x = 0; x < p.o_elems(); ++x) worst = std::max(worst, std::fabs(double{out.o[x]} - plain.o[x]));
    EXPECT_LT(worst, 1e-5) << k->isa() << ": not the rule's integers";
    ++ran;
  }
  EXPECT_GT(ran, 0);
}

// It does multiply in integers: its error against float64 is the int8 class's, far above flash's.
TEST(FlashInt8, MultipliesInIntegers) {
  const Problem p = test::shape(1, 4, 4, 64, 64, 64);
  const Tensors t = random_tensors(p, 3);
  const KernelCheck f = check(*find_kernel("flash"), p, t);
  for (const Kernel* k : int8_kernels()) {
    const KernelCheck c = check(*k, p, t);
    EXPECT_EQ(c.verdict, Verdict::Pass) << c.reason;
    EXPECT_GT(c.errors.o_rel, 100 * f.errors.o_rel) << k->isa() << " computed as float32 flash does";
  }
}

// Without VNNI the avx2 and avx512 targets sum with vpmaddubsw + vpmaddwd (|k| and Q with k's
// sign); ATTN_NO_VNNI=1 takes that path on a CPU that has VNNI. d 70: a word of two codes and
// padding; codes +-127 (each row's largest value).
TEST(FlashInt8, WithoutVnniAgreesToo) {
  const bool vnni = cpu_runs_isa("avx512_vnni") || cpu_runs_isa("avx_vnni");
  for (const char* env : {"1", "0"}) {
    if (!vnni && env[0] == '0') continue;
    ASSERT_EQ(setenv("ATTN_NO_VNNI", env, 1), 0);
    for (int64_t kv_heads : {1, 3}) {
      Problem p = test::shape(1, 3, kv_heads, 37, 150, 70);
      p.causal = CausalAlign::BottomRight;
      const Tensors t = offset_inputs(p, 9, 69, 1.5f);
      for (const Kernel* k : int8_kernels()) {
        const KernelCheck c = check(*k, p, t);
        EXPECT_EQ(c.verdict, Verdict::Pass) << "ATTN_NO_VNNI=" << env << " " << k->isa() << ": " << c.reason;
      }
    }
  }
  unsetenv("ATTN_NO_VNNI");
}

// What smoothing buys: keys sharing one channel offset by 8 (a large-mean channel, SageAttention's
// case) round with a per-key scale set by that channel, so the other channels lose their bits;
// smoothed, the offset is gone before rounding. Both pass their own (derived) tolerance - the
// baseline rounds the same way - and smoothing is several times more accurate against float64.
TEST(FlashInt8, SmoothingRescuesALargeMeanChannel) {
  const Problem p = test::shape(1, 4, 2, 64, 256, 64);
  const Tensors t = offset_inputs(p, 23, 7, 8.f);
  for (const Kernel* k : int8_kernels()) {
    ASSERT_EQ(setenv("ATTN_I8_SMOOTH", "0", 1), 0);
    ASSERT_FALSE(int8_smoothing());
    const KernelCheck off = check(*k, p, t);
    unsetenv("ATTN_I8_SMOOTH");
    const KernelCheck on = check(*k, p, t);
    EXPECT_EQ(off.verdict, Verdict::Pass) << off.reason;
    EXPECT_EQ(on.verdict, Verdict::Pass) << on.reason;
    EXPECT_GT(off.errors.o_rel, 3 * on.errors.o_rel)
        << k->isa() << ": smoothing on " << on.errors.o_rel << ", off " << off.errors.o_rel;
  }
}

// Rounding's edges: every key equal (smoothed to zero: zero scales, scores q.mean alone - a uniform
// softmax), and a Q row of zeros (zero scale: scores 0).
TEST(FlashInt8, ZeroScalesAtTheEdges) {
  Problem p = test::shape(1, 2, 1, 20, 70, 32);
  p.causal = CausalAlign::BottomRight;
  Tensors t = random_tensors(p, 4);
  for (int64_t j = 1; j < p.kv_len; ++j) {
    std::copy(t.inputs.k.row(0, 0, 0), t.inputs.k.row(0, 0, 0) + p.head_dim,
              const_cast<float*>(t.inputs.k.row(0, 0, j)));
  }
  std::fill(const_cast<float*>(t.inputs.q.row(0, 1, 5)), const_cast<float*>(t.inputs.q.row(0, 1, 5)) + p.head_dim, 0.f);
  for (const Kernel* k : int8_kernels()) {
    const KernelCheck c = check(*k, p, t);
    EXPECT_EQ(c.verdict, Verdict::Pass) << k->isa() << ": " << c.reason;
  }
}

// flash_int8_amx runs its whole tiles on the tile unit: P and V rounded to bf16 there, so its O
// differs from flash_int8's (same integers, float32 P.V) - and both pass, each under its own
// arithmetic; on a causal problem its partial (diagonal) tiles are flash_int8's panels.
TEST(FlashInt8, AmxTilesRun) {
  const std::vector<const Kernel*> amx = runnable("flash_int8_amx");
  if (amx.empty()) GTEST_SKIP() << "no AMX-INT8 here: " << find_kernel("flash_int8_amx")->available().reason;
  for (const CausalAlign causal : {CausalAlign::None, CausalAlign::BottomRight}) {
    Problem p = test::shape(1, 4, 2, 200, 256, 96);  // 16-row blocks of 2 x 100 rows, d 96: 24 words in 32
    p.causal = causal;
    const Tensors t = offset_inputs(p, 8, 1, 1.f);
    const Tensors a = allocate_outputs(p), b = allocate_outputs(p);
    Session(*runnable("flash_int8").front(), p, 2).run(t.inputs, a.outputs);
    Session(*amx.front(), p, 2).run(t.inputs, b.outputs);
    int64_t differ = 0;
    for (int64_t x = 0; x < p.o_elems(); ++x) differ += a.o[x] != b.o[x];
    EXPECT_GT(differ, p.o_elems() / 2) << "flash_int8_amx computed what flash_int8 does: the tile unit never ran";
    const KernelCheck c = check(*amx.front(), p, t);
    EXPECT_EQ(c.verdict, Verdict::Pass) << c.reason;
    EXPECT_EQ(amx.front()->arithmetic(), Arithmetic::Int8Bf16Products);
  }
}

// What it does not run it refuses by the field, naming the kernel that runs it instead.
TEST(FlashInt8, RefusesWhatItDoesNotRoundNamingTheField) {
  const Kernel* k = find_kernel("flash_int8");
  ASSERT_NE(k, nullptr);
  const auto refused = [&](const Problem& p, const std::string& field) {
    const Support s = k->supports(p);
    EXPECT_FALSE(s) << field;
    EXPECT_EQ(s.reason.rfind(field, 0), 0u) << s.reason;
  };
  Problem p = test::shape(1, 2, 1, 64, 64, 32);
  EXPECT_TRUE(k->supports(p));
  p.dtype = DType::BF16;
  refused(p, "dtype: flash_int8 rounds float32 inputs, not bf16");
  p.dtype = DType::F32;
  p.kv_dtype = KvDType::Q8_0;
  refused(p, "kv_dtype / kv_block: flash_int8");
  p.kv_dtype = KvDType::Same;
  p.window_left = 8, p.window_right = 0, p.dilation = 2;
  refused(p, "dilation 2: flash_int8");
}

}  // namespace
}  // namespace attnlab
