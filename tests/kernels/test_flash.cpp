// flash-specific checks the registry-wide suites do not make:
//  - the K-tile packing (16x16 in-register transposes, ragged d and key counts) against a
//    plain transpose;
//  - shapes whose lengths straddle the tile sizes (64 keys, 24..240 query rows) with masks;
//  - bitwise identical results for any thread count;
//  - workspace independent of the sequence lengths (and under 64 MiB at 32k x 32k).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "attnlab/kernel.hpp"
#include "attnlab/verify.hpp"
#include "attnlab/isa.hpp"
#include "cpu/dispatch/isa_internal.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

const Kernel& flash() { return kernel_or_throw("flash"); }

// flash's variants this CPU runs (one per built target: tiles of 4 vectors of its width).
std::vector<const Kernel*> runnable_flash() {
  std::vector<const Kernel*> ks;
  for (const std::string& isa : kernel_isas("flash")) {
    if (const Kernel& k = kernel_or_throw("flash", isa); k.available()) ks.push_back(&k);
  }
  return ks;
}

// Every built target this CPU runs (its pack_k_transposed, through src/cpu/dispatch/target.hpp).
// flash_amx really runs its whole tiles on the tile unit (a different summation than
// flash_bf16's vdpbf16ps, so some output differs in its last bits), and its partial tiles
// (causal diagonal, the short last tile) through flash_bf16's panels; both pass.
TEST(FlashAmx, WholeTilesRunOnTheTileUnit) {
  const Kernel* amx = find_kernel("flash_amx");
  const Kernel* dot = find_kernel("flash_bf16");
  ASSERT_TRUE(amx && dot);
  if (Support a = amx->available(); !a) GTEST_SKIP() << a.reason;
  for (const CausalAlign causal : {CausalAlign::None, CausalAlign::BottomRight}) {
    Problem p = test::shape(1, 4, 2, 150, 300, 72);
    p.causal = causal;
    p.dtype = DType::BF16;
    Tensors t = random_tensors(p, 5);
    Tensors u = random_tensors(p, 5);
    const Agreement a = prepare_agreement(p, t.inputs, sample_rows(p, 256, 1));
    EXPECT_EQ(check_kernel(*amx, p, t.inputs, a, 2).verdict, Verdict::Pass);
    Session(*amx, p, 2).run(t.inputs, t.outputs);
    Session(*dot, p, 2).run(u.inputs, u.outputs);
    int64_t differ = 0;
    for (int64_t n = 0; n < p.q_elems(); ++n) differ += t.o[n] != u.o[n];
    EXPECT_GT(differ, 0) << "flash_amx computed exactly what flash_bf16 does: the tile unit never ran";
  }
}

// The bf16-product kernels refuse other storage dtypes with the field and the way out, before
// any allocation (their tiling would refuse them: workspace_bytes answers 0 instead).
TEST(FlashBf16, OtherDtypesAreRefusedWithTheReason) {
  for (const char* name : {"flash_bf16", "flash_amx"}) {
    const Kernel* k = find_kernel(name);
    ASSERT_NE(k, nullptr) << name;
    for (const DType d : {DType::F32, DType::F16}) {
      Problem p = test::shape(1, 2, 1, 20, 20, 16);
      p.dtype = d;
      const Support s = supports_problem(*k, p);
      if (k->available()) {
        EXPECT_FALSE(s) << name;
        EXPECT_NE(s.reason.find("dtype"), std::string::npos) << s.reason;
        EXPECT_NE(s.reason.find("--dtype bf16"), std::string::npos) << s.reason;
        EXPECT_EQ(k->workspace_bytes(p, 2), 0u);
      }
      EXPECT_THROW(Session(*k, p, 2), InvalidInput) << name;
    }
  }
}

TEST(Flash, PackKTransposedMatchesPlainTranspose) {
  for (const std::string& isa : runnable_isas()) {
    const TargetTable& t = *target_table_for(isa);
    const int tile = t.probes.tile_keys;
    for (int64_t d : {1, 7, 16, 17, 64, 80, 129}) {
      for (int nk : {1, 5, 16, 33, tile}) {
        if (nk > tile) continue;
        const int64_t ldk = d + 3;  // a row stride that is not the row length (BSHD-like)
        std::vector<float> k(static_cast<size_t>(nk * ldk), std::nanf(""));
        for (int j = 0; j < nk; ++j)
          for (int64_t c = 0; c < d; ++c) k[j * ldk + c] = static_cast<float>(1000 * j + c);
        const int64_t dp = (d + t.lanes - 1) / t.lanes * t.lanes;
        auto kt = alloc_floats(static_cast<size_t>(dp * tile));
        t.probes.pack_k_transposed(k.data(), ldk, nk, d, kt.get());
        const int packed = (nk + t.probes.block_keys - 1) / t.probes.block_keys * t.probes.block_keys;  // whole blocks
        for (int64_t c = 0; c < d; ++c)
          for (int j = 0; j < packed; ++j) {
            const float want = j < nk ? static_cast<float>(1000 * j + c) : 0.f;
            const int64_t at = (j / t.probes.block_keys) * dp * t.probes.block_keys + c * t.probes.block_keys +
                               j % t.probes.block_keys;
            ASSERT_EQ(kt[at], want) << isa << " d " << d << " nk " << nk << " k " << c << " key " << j;
          }
      }
    }
  }
}

// Query tiles of up to 240 rows where the problem has 64 tasks of them, else down to 120 (the
// tests' 1 MiB L2, CMakeLists.txt, fits both): the tile flash picks (its block map's br), and
// agreement at lengths around the 240-row tile with a causal mask and GQA.
TEST(Flash, LargeQueryTilesWhereTasksAreMany) {
  const auto br_of = [](Problem p) {
    // A pattern (sinks + window), so flash's plan is its block map.
    p.causal = CausalAlign::BottomRight, p.window_left = 100, p.window_right = 0, p.sinks = 4;
    const auto plan = std::dynamic_pointer_cast<const BlockPlan>(flash().make_plan(p));
    return plan ? plan->map.br : int64_t{-1};
  };
  EXPECT_EQ(br_of(test::shape(4, 8, 8, 480, 480, 24)), 240);  // 4 x 8 x 2 = 64 tasks
  EXPECT_EQ(br_of(test::shape(4, 8, 8, 481, 481, 24)), 162);  // 3 tiles of 240 rows, evened out
  EXPECT_EQ(br_of(test::shape(2, 8, 8, 480, 480, 24)), 120);  // 2 x 8 x 2 = 32 tasks: 120 rows
  EXPECT_EQ(br_of(test::shape(1, 2, 1, 480, 480, 24)), 120);  // never below 120 for the floor
  for (const Kernel* kp : runnable_flash())
    for (int64_t sq : {479, 480}) {
      if (test::small_mode() && sq != 480) continue;  // sanitizer builds: one length
      Problem p = test::shape(4, 16, 8, sq, sq + 1, 16);
      p.causal = CausalAlign::BottomRight;
      Tensors t = random_tensors(p, 23);
      const KernelCheck c = check_kernel(*kp, p, t.inputs, prepare_agreement(p, t.inputs, all_rows(p)), 2);
      EXPECT_EQ(c.verdict, Verdict::Pass) << kp->isa() << " " << p.describe() << ": " << c.reason;
    }
}

TEST(Flash, LengthsAroundTileBoundariesAgree) {
  for (const Kernel* kp : runnable_flash())
    for (int64_t sq : {23, 24, 25, 119, 120, 121, 241})
      for (int64_t sk : {63, 64, 65, 129, 200}) {
        Problem p = test::shape(1, 4, 2, sq, sk, 48);
        p.causal = CausalAlign::BottomRight;
        Tensors t = random_tensors(p, 17);
        const KernelCheck c = check_kernel(*kp, p, t.inputs, prepare_agreement(p, t.inputs, all_rows(p)), 2);
        EXPECT_EQ(c.verdict, Verdict::Pass) << kp->isa() << " " << p.describe() << ": " << c.reason;
      }
}

std::vector<float> run_flash(const Kernel& k, const Problem& p, int threads, std::vector<float>* lse) {
  Tensors t = random_tensors(p, 123);
  Session s(k, p, threads);
  s.run(t.inputs, t.outputs);
  lse->assign(t.lse.get(), t.lse.get() + p.lse_elems());
  return {t.o.get(), t.o.get() + p.q_elems()};
}

TEST(Flash, BitwiseIdenticalForAnyThreadCount) {
  Problem p = test::shape(2, 6, 2, 250, 300, 80);  // GQA 3:1, several query tiles per head
  p.causal = CausalAlign::BottomRight;
  p.kv_lens = {300, 130};
  for (const Kernel* k : runnable_flash()) {
    std::vector<float> lse1, lse_n;
    const std::vector<float> one = run_flash(*k, p, 1, &lse1);
    for (int threads : {2, 3}) {
      const std::vector<float> many = run_flash(*k, p, threads, &lse_n);
      EXPECT_EQ(std::memcmp(one.data(), many.data(), one.size() * sizeof(float)), 0)
          << k->isa() << " " << threads << " threads";
      EXPECT_EQ(std::memcmp(lse1.data(), lse_n.data(), lse1.size() * sizeof(float)), 0)
          << k->isa() << " " << threads << " threads";
    }
  }
}

TEST(Flash, WorkspaceDoesNotGrowWithSequenceLength) {
  // Query tiles evened out over q_len are at most the cap (4096: 18 tiles of 228 rows; 32k and
  // 128k: 240).
  Problem small = test::shape(1, 8, 8, 4096, 4096, 128);
  Problem big = test::shape(1, 8, 8, 32768, 32768, 128);
  Problem bigger = test::shape(1, 8, 8, 131072, 131072, 128);
  const auto per_thread = [](const Problem& p) {
    return flash().workspace_bytes(p, 3) - flash().workspace_bytes(p, 2);
  };
  const auto shared = [&](const Problem& p) { return flash().workspace_bytes(p, 2) - 2 * per_thread(p); };
  // Per thread: bounded by the tile cap, whatever the lengths.
  EXPECT_LE(per_thread(small), per_thread(big));
  EXPECT_EQ(per_thread(big), per_thread(bigger));
  EXPECT_LT(per_thread(big), size_t{1} << 20);
  // Shared: every head's packed K^T (d 128: K's own bytes) while it fits 64 MiB (tiles.hpp:
  // Tiling::kMaxSharedKt; 4096 keys x 8 heads: 16 MiB), else none - each task packs its tiles.
  EXPECT_EQ(shared(small), static_cast<size_t>(small.kv_elems()) * sizeof(float));
  EXPECT_EQ(shared(big), 0u);
  EXPECT_EQ(shared(bigger), 0u);
  // A single query tile per head shares nothing: no K^T packed for nothing.
  EXPECT_EQ(shared(test::shape(1, 8, 8, 64, 4096, 128)), 0u);
}

}  // namespace
}  // namespace attnlab
