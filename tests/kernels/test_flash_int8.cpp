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
// pv: P.V as the VNNI path (pv_tile_u8), else in float32 (both inside the class's baseline).
enum class Bug {
  None,
  NoSmoothingTerm,
  KeyScaleTwice,
  KeyScaleOffByOne,
  CorrectionDropped,
  QScaleOfNextRow,
  VScaleOfNextChannel,  // the u8 P.V: the next channel's scale
  VCodesOfNextKey,      // a value tile's keys one off
  PQuantumOfLastTile,   // a row's P quantum kept from its previous tile
};

class PlantedInt8 final : public Kernel {
 public:
  explicit PlantedInt8(Bug bug, bool pv = true) : bug_(bug), pv_(pv) {}
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
        std::vector<int8_t> vc(static_cast<size_t>(n * p.dim_v()));
        std::vector<float> vs(static_cast<size_t>(p.dim_v()));
        ASSERT_TRUE(round_v_channels(in.v.row(b, hk, 0), in.v.stride_s, n, p.dim_v(), vc.data(), vs.data()));
        float last_quantum = 0.f;
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
            std::vector<float> w(s.size());
            for (size_t x = 0; x < s.size(); ++x) l += w[x] = static_cast<float>(std::exp(s[x] - m));
            for (size_t x = 0; x < s.size();) {
              const int64_t j = iv.lo + static_cast<int64_t>(x);
              int32_t pc[64];
              float quantum = 0.f;
              // A 64-key tile the row sees whole: P to u8 codes (round_p_tile), V's codes and channel scales.
              if (pv_ && j % 64 == 0 && j + 64 <= iv.hi && round_p_tile(&w[x], 64, false, pc, &quantum)) {
                if (bug_ == Bug::PQuantumOfLastTile && x > 0) quantum = last_quantum;
                last_quantum = quantum;
                for (int64_t y = 0; y < 64; ++y) {
                  const int64_t key = bug_ == Bug::VCodesOfNextKey ? std::min(j + y + 1, n - 1) : j + y;
                  for (int64_t c = 0; c < p.dim_v(); ++c) {
                    const int64_t ch = bug_ == Bug::VScaleOfNextChannel ? std::min(c + 1, p.dim_v() - 1) : c;
                    acc[c] += double{quantum} * pc[y] * vc[key * p.dim_v() + c] * vs[ch];
                  }
                }
                x += 64;
                continue;
              }
              const float* v = in.v.row(b, hk, j);
              for (int64_t c = 0; c < p.dim_v(); ++c) acc[c] += double{w[x]} * v[c];
              ++x;
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
  bool pv_;
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
  Problem p = test::shape(1, 4, 2, 48, 160, 64);  // rows see tile 0 whole, most of them tile 1 too
  p.causal = CausalAlign::BottomRight;
  Tensors t = offset_inputs(p, 17, 3, 2.f);
  for (int64_t h = 0; h < p.kv_heads; ++h)  // V's channels 1x .. 4x apart: each its own scale
    for (int64_t j = 0; j < p.kv_len; ++j)
      for (int64_t c = 0; c < p.dim_v(); ++c) const_cast<float*>(t.inputs.v.row(0, h, j))[c] *= 1.f + c % 4;
  for (Bug bug : {Bug::None, Bug::NoSmoothingTerm, Bug::KeyScaleTwice, Bug::KeyScaleOffByOne, Bug::CorrectionDropped,
                  Bug::QScaleOfNextRow, Bug::VScaleOfNextChannel, Bug::VCodesOfNextKey, Bug::PQuantumOfLastTile}) {
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
  PlantedInt8(Bug::None, false).run(p, t.inputs, plain.outputs, ctx);  // (a window of 54 keys: no whole tile)
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

// P.V in integers (pv_tile_u8) runs exactly where vpdpbusd does - avx512 with AVX512-VNNI, avx2 with
// AVX-VNNI, not with ATTN_NO_VNNI=1 - on the tiles a panel sees whole: there O moves off the float32
// P.V's (ATTN_I8_PV=0) by P's and V's rounding; elsewhere, and on a window that leaves no tile
// whole, the two are the same bits. Both pass.
TEST(FlashInt8, IntegerPvRunsWhereVnniDoes) {
  const auto run = [](const Kernel& k, const Problem& p, const Tensors& t, const char* pv) {
    if (pv) EXPECT_EQ(setenv("ATTN_I8_PV", pv, 1), 0);
    const Tensors out = allocate_outputs(p);
    Session(k, p, 2).run(t.inputs, out.outputs);
    unsetenv("ATTN_I8_PV");
    return std::vector<float>(out.o.get(), out.o.get() + p.o_elems());
  };
  Problem dense = test::shape(1, 4, 2, 60, 200, 64), window = dense;
  window.window_left = 40, window.window_right = 0;
  const Tensors t = random_tensors(dense, 31);
  for (const char* no_vnni : {"0", "1"}) {
    ASSERT_EQ(setenv("ATTN_NO_VNNI", no_vnni, 1), 0);
    for (const Kernel* k : runnable("flash_int8")) {
      const std::string unit = k->isa() == "avx512" ? "avx512_vnni" : k->isa() == "avx2" ? "avx_vnni" : "";
      const bool integer = !unit.empty() && cpu_runs_isa(unit) && std::string(no_vnni) == "0";
      const std::string at = std::string(k->isa()) + " ATTN_NO_VNNI=" + no_vnni;
      EXPECT_EQ(run(*k, window, t, nullptr), run(*k, window, t, "0")) << at << ": no whole tile, yet O moved";
      const std::vector<float> a = run(*k, dense, t, nullptr);
      const std::vector<float> b = run(*k, dense, t, "0");
      double moved = 0;
      for (size_t x = 0; x < a.size(); ++x) moved = std::max(moved, std::fabs(double{a[x]} - b[x]));
      if (integer) {
        EXPECT_GT(moved, 1e-5) << at << ": P.V did not round";
      } else {
        EXPECT_EQ(moved, 0.0) << at << ": P.V rounded without vpdpbusd";
      }
      EXPECT_EQ(check(*k, dense, t).verdict, Verdict::Pass) << at;
    }
  }
  unsetenv("ATTN_NO_VNNI");
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
// P.V in float32 (ATTN_I8_PV=0): its rounding of P and V, the same on and off, is not what this weighs.
TEST(FlashInt8, SmoothingRescuesALargeMeanChannel) {
  const Problem p = test::shape(1, 4, 2, 64, 256, 64);
  const Tensors t = offset_inputs(p, 23, 7, 8.f);
  ASSERT_EQ(setenv("ATTN_I8_PV", "0", 1), 0);
  const struct Restore {
    ~Restore() { unsetenv("ATTN_I8_PV"); }
  } restore;
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
