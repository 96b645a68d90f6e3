// The attnlab executable end to end: .npy round trips, exit codes, messages, and that
// nothing is written on failure.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>

#include <nlohmann/json.hpp>

#include "attnlab/backward.hpp"
#include "attnlab/isa.hpp"
#include "attnlab/kv_quant.hpp"
#include "attnlab/kernel.hpp"
#include "attnlab/npy.hpp"
#include "attnlab/verify.hpp"
#include "bench/sweep/bench_point.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

namespace fs = std::filesystem;

struct Result {
  int code = -1;
  std::string out;  // stdout and stderr together
};

// `prefix` goes before the executable: environment settings, a `timeout` bound.
Result attnlab(const std::string& args, const std::string& prefix = "") {
  const std::string cmd = prefix + std::string(ATTNLAB_EXE) + " " + args + " 2>&1";
  Result r;
  FILE* pipe = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe)) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class Cli : public ::testing::Test {
 protected:
  fs::path dir;
  void SetUp() override {
    dir = fs::temp_directory_path() / ("attn_cli_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  // Writes Q, K, V of p (random) in p's layout; returns the tensors.
  Tensors write_inputs(const Problem& p) {
    Tensors t = random_tensors(p, 9);
    const bool bhsd = p.layout == Layout::BHSD;
    auto shp = [&](int64_t h, int64_t s) {
      return bhsd ? std::vector<int64_t>{p.batch, h, s, p.head_dim} : std::vector<int64_t>{p.batch, s, h, p.head_dim};
    };
    write_npy(path("q.npy"), t.q.get(), shp(p.q_heads, p.q_len));
    write_npy(path("k.npy"), t.k.get(), shp(p.kv_heads, p.kv_len));
    write_npy(path("v.npy"), t.v.get(), shp(p.kv_heads, p.kv_len));
    return t;
  }
  std::string qkv() const { return "--q " + path("q.npy") + " --k " + path("k.npy") + " --v " + path("v.npy"); }
};

TEST_F(Cli, ListShowsEveryKernel) {
  const Result r = attnlab("list");
  EXPECT_EQ(r.code, 0) << r.out;
  for (const char* name : {"naive", "blocked"}) EXPECT_NE(r.out.find(name), std::string::npos);
  // The CPU and caches above the table; per kernel the targets built, run here, default.
  EXPECT_NE(r.out.find("CPU features: " + cpu_isa_features()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("caches: L1d "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("targets"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("runs here"), std::string::npos) << r.out;
  std::string built, runs;
  for (const auto& t : built_isas()) built += (built.empty() ? "" : ",") + t;
  for (const auto& t : runnable_isas()) runs += (runs.empty() ? "" : ",") + t;
  const std::regex flash_row("\\nflash +yes +" + built + " +" + runs + " +" + default_isa() + " ");
  EXPECT_TRUE(std::regex_search(r.out, flash_row)) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("\\nnaive +yes +baseline +baseline +baseline "))) << r.out;
  // Each kernel's precision: the storage dtypes it reads and what it computes in.
  EXPECT_TRUE(std::regex_search(r.out, std::regex("\\nflash .* f32/bf16/f16 in, widened exactly; f32 compute")))
      << r.out;
  // What each runs, from its declared capabilities (Kernel::capabilities).
  EXPECT_TRUE(std::regex_search(r.out, std::regex("\\nnaive .* sparse,dv,quant,paged,bwd "))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("\\ndecode_i8 .* sparse,dv,int-codes,paged,q<=16 "))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("\\nblocked .* dv "))) << r.out;
}

// --isa on run, verify, peak and sweep: a target is used and named in the output; one this
// build lacks or this CPU cannot run is exit 2 with a message naming what the CPU runs.
TEST_F(Cli, IsaFlagSelectsTargetsAndRefusesOthers) {
  const std::string shape = " --q-len 9 --kv-len 17 --head-dim 16 --q-heads 2 --kv-heads 1";
  const Result all = attnlab("verify --impl naive,flash --isa all" + shape);
  ASSERT_EQ(all.code, 0) << all.out;
  for (const auto& t : runnable_isas())
    EXPECT_NE(all.out.find("  flash[" + t + "] "), std::string::npos) << t << all.out;
  EXPECT_NE(all.out.find("  naive "), std::string::npos) << all.out;
  const size_t n = runnable_isas().size() + 1;
  EXPECT_NE(all.out.find("verified " + std::to_string(n) + " of " + std::to_string(n) + " kernels"), std::string::npos)
      << all.out;

  const Result scalar = attnlab("verify --impl flash,decode --isa scalar" + shape);
  EXPECT_EQ(scalar.code, 0) << scalar.out;
  EXPECT_NE(scalar.out.find("  flash[scalar] "), std::string::npos) << scalar.out;
  if (best_isa() != "scalar") {
    EXPECT_EQ(scalar.out.find("flash[" + best_isa() + "]"), std::string::npos) << scalar.out;
  }
  // ATTN_ISA does the same without the flag; --isa wins over it.
  EXPECT_NE(attnlab("verify --impl flash" + shape, "ATTN_ISA=scalar ").out.find("  flash[scalar] "), std::string::npos);
  EXPECT_NE(attnlab("verify --impl flash --isa " + best_isa() + shape, "ATTN_ISA=scalar ")
                .out.find("  flash[" + best_isa() + "] "),
            std::string::npos);

  Problem p = test::shape(1, 2, 1, 5, 9, 16);
  write_inputs(p);
  const Result run = attnlab("run --impl flash --isa scalar " + qkv() + " --out " + path("o.npy"));
  EXPECT_EQ(run.code, 0) << run.out;
  EXPECT_NE(run.out.find("flash[scalar]: "), std::string::npos) << run.out;

  const Result bogus = attnlab("verify --impl flash --isa avx1024" + shape);
  EXPECT_EQ(bogus.code, 2) << bogus.out;
  EXPECT_NE(bogus.out.find("isa: 'avx1024' is not a target of this build; allowed: "), std::string::npos) << bogus.out;
  const Result several = attnlab("run --impl flash --isa all " + qkv() + " --out " + path("o2.npy"));
  EXPECT_EQ(several.code, 2) << several.out;
  EXPECT_NE(several.out.find("names several targets"), std::string::npos) << several.out;
  EXPECT_FALSE(fs::exists(path("o2.npy")));

  // The environment's spellings are checked as strictly, and named in the error.
  const Result env_isa = attnlab("verify --impl flash" + shape, "ATTN_ISA=avx1024 ");
  EXPECT_EQ(env_isa.code, 2) << env_isa.out;
  EXPECT_NE(env_isa.out.find("ATTN_ISA: 'avx1024' is not a target of this build; allowed: "), std::string::npos)
      << env_isa.out;
  for (const char* l2 : {"12", "1M", "-1", "99999999999999"}) {
    const Result env_l2 = attnlab("list", std::string("ATTN_L2_BYTES=") + l2 + " ");
    EXPECT_EQ(env_l2.code, 2) << l2 << "\n" << env_l2.out;
    EXPECT_NE(env_l2.out.find(std::string("ATTN_L2_BYTES: '") + l2 + "' is not allowed; allowed: 65536 to "),
              std::string::npos)
        << env_l2.out;
  }
  EXPECT_EQ(attnlab("list", "ATTN_L2_BYTES=2097152 ").code, 0);

  // A target of this build that this CPU cannot run (avx512 on an AVX2 machine).
  std::string missing;
  for (const auto& t : built_isas()) {
    if (!cpu_runs_isa(t)) missing = t;
  }
  if (missing.empty()) GTEST_SKIP() << "this CPU runs every built target";
  for (const std::string& cmd :
       std::vector<std::string>{"verify --impl flash" + shape, "run --impl flash " + qkv() + " --out " + path("o3.npy"),
                                "peak --threads 1 --repeats 1", "sweep --experiment quick --dry-run"}) {
    const Result r = attnlab(cmd + " --isa " + missing);
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.out;
    EXPECT_NE(r.out.find("isa: this CPU cannot run " + missing + "; it runs "), std::string::npos) << cmd << "\n"
                                                                                                   << r.out;
    EXPECT_NE(r.out.find("CPU features: "), std::string::npos) << r.out;
  }
  EXPECT_FALSE(fs::exists(path("o3.npy")));
}

// attnlab peak measures every target this CPU runs (or the one --isa names), and --json
// records each target's peaks.
TEST_F(Cli, PeakMeasuresEveryTarget) {
  const std::string quick = "peak --threads 1 --repeats 1 --seconds 0.01 --buffer-mib 8 --json ";
  const Result all = attnlab(quick + path("all.json"));
  ASSERT_EQ(all.code, 0) << all.out;
  const auto j = nlohmann::json::parse(std::ifstream(path("all.json")));
  EXPECT_EQ(j["schema"], "attnlab-peak-2");
  std::vector<std::string> measured;
  for (const auto& t : j["targets"]) {
    measured.push_back(t["isa"]);
    EXPECT_GT(t["rows"][0]["fma_flops"].get<double>(), 0) << t.dump();
    EXPECT_NE(all.out.find(t["isa"].get<std::string>() + ": " + std::to_string(t["lanes"].get<int>()) + " float lanes"),
              std::string::npos)
        << all.out;
  }
  EXPECT_EQ(measured, runnable_isas());
  EXPECT_EQ(j["simd_arch"], default_isa());
  const Result one = attnlab(quick + path("scalar.json") + " --isa scalar");
  ASSERT_EQ(one.code, 0) << one.out;
  const auto s = nlohmann::json::parse(std::ifstream(path("scalar.json")));
  ASSERT_EQ(s["targets"].size(), 1u) << s.dump();
  EXPECT_EQ(s["targets"][0]["isa"], "scalar");
  EXPECT_EQ(s["simd_arch"], "scalar");
}

TEST_F(Cli, RunRoundTripMatchesReference) {
  Problem p = test::shape(2, 4, 2, 7, 19, 24);
  p.layout = Layout::BSHD;
  p.causal = CausalAlign::BottomRight;
  p.kv_lens = {19, 5};
  Tensors t = write_inputs(p);
  const Result r = attnlab("run --impl blocked " + qkv() + " --out " + path("o.npy") + " --lse " + path("lse.npy") +
                           " --layout bshd --causal --kv-lens 19,5 --threads 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("time "), std::string::npos) << r.out;
  NpyArray o = read_npy(path("o.npy"));
  NpyArray lse = read_npy(path("lse.npy"));
  EXPECT_EQ(o.shape, (std::vector<int64_t>{2, 7, 4, 24}));
  EXPECT_EQ(lse.shape, (std::vector<int64_t>{2, 4, 7}));
  const Agreement a = prepare_agreement(p, t.inputs, all_rows(p));
  const MutView ov = make_view<float>(o.data.data(), 2, 4, 7, 24, Layout::BSHD);
  const Errors e = measure(a.ref, as_const(ov), lse.data.data(), p);
  EXPECT_TRUE(a.tol.passes(e)) << a.tol.why_failed(e);
}

// run --backward: dQ, dK, dV from dO against the float64 reference gradients, from the kernel's
// own forward and from a given O and LSE (the same gradients); refusals name the option.
TEST_F(Cli, RunBackwardWritesGradientsThatMatchTheReference) {
  Problem p = test::shape(2, 4, 2, 7, 19, 24);
  p.layout = Layout::BSHD;
  p.causal = CausalAlign::BottomRight;
  p.kv_lens = {19, 5};
  Tensors t = write_inputs(p);
  std::vector<float> d_o(static_cast<size_t>(p.o_elems()));
  fill_uniform(d_o.data(), p.o_elems(), 4);
  write_npy(path("do.npy"), d_o.data(), {2, 7, 4, 24});
  const std::string flags = " --layout bshd --causal --kv-lens 19,5 --threads 2";
  const std::string grads =
      " --do " + path("do.npy") + " --dq " + path("dq.npy") + " --dk " + path("dk.npy") + " --dv " + path("dv.npy");
  const Result r = attnlab("run --impl flash --backward " + qkv() + grads + " --out " + path("o.npy") + " --lse " +
                           path("lse.npy") + flags);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("backward "), std::string::npos) << r.out;
  const ConstView dov = make_view<const float>(d_o.data(), 2, 4, 7, 24, Layout::BSHD);
  const BackwardAgreement a = prepare_backward_agreement(p, t.inputs, dov);
  const auto check = [&](const std::string& what) {
    NpyArray dq = read_npy(path("dq.npy")), dk = read_npy(path("dk.npy")), dv = read_npy(path("dv.npy"));
    ASSERT_EQ(dq.shape, (std::vector<int64_t>{2, 7, 4, 24})) << what;
    ASSERT_EQ(dk.shape, (std::vector<int64_t>{2, 19, 2, 24})) << what;
    const Gradients g{make_view<float>(dq.data.data(), 2, 4, 7, 24, Layout::BSHD),
                      make_view<float>(dk.data.data(), 2, 2, 19, 24, Layout::BSHD),
                      make_view<float>(dv.data.data(), 2, 2, 19, 24, Layout::BSHD)};
    const GradErrors e = measure_grads(a.ref, g, p);
    EXPECT_EQ(a.tol.why_failed(e), "") << what;
  };
  check("own forward");
  // The forward's O and LSE given instead (the files just written): the same gradients.
  const Result given = attnlab("run --impl naive --backward " + qkv() + grads + " --o " + path("o.npy") + " --lse " +
                               path("lse.npy") + flags);
  ASSERT_EQ(given.code, 0) << given.out;
  EXPECT_NE(given.out.find("O and LSE from"), std::string::npos) << given.out;
  check("given O and LSE");
  const std::pair<std::string, std::string> refused[] = {
      {"run --impl flash --backward " + qkv() + " --dq " + path("x.npy") + flags,
       "backward: --do, --dq, --dk and --dv"},
      {"run --impl flash --backward " + qkv() + grads + " --o " + path("o.npy") + flags, "o: --o given without --lse"},
      {"run --impl flash --backward " + qkv() + " --do " + path("lse.npy") + " --dq a --dk b --dv c" + flags,
       "do: " + path("lse.npy") + " has shape (2, 4, 7); allowed: (2, 7, 4, 24)"},
      {"run --impl flash " + qkv() + " --out " + path("y.npy") + " --dq " + path("x.npy"),
       "dq: given without --backward"},
      {"run --impl blocked --backward " + qkv() + grads + flags, "blocked has no backward pass; allowed: naive, flash"},
  };
  for (const auto& [args, message] : refused) {
    const Result bad = attnlab(args);
    EXPECT_EQ(bad.code, 2) << args << "\n" << bad.out;
    EXPECT_NE(bad.out.find(message), std::string::npos) << args << "\n" << bad.out;
  }
}

TEST_F(Cli, VerifyAgainstExpectedFile) {
  Problem p = test::shape(1, 6, 2, 5, 11, 16);
  write_inputs(p);
  ASSERT_EQ(attnlab("run --impl naive " + qkv() + " --out " + path("o.npy") + " --lse " + path("lse.npy")).code, 0);
  Result ok = attnlab("verify --impl all " + qkv() + " --expect " + path("o.npy") + " --expect-lse " + path("lse.npy"));
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("agrees"), std::string::npos) << ok.out;
  // Outputs made with a different mask disagree: exit 1.
  ASSERT_EQ(attnlab("run --impl naive " + qkv() + " --out " + path("oc.npy") + " --causal").code, 0);
  Result bad = attnlab("verify --impl naive " + qkv() + " --expect " + path("oc.npy"));
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find("FAIL"), std::string::npos) << bad.out;
  // --sample-rows: the float64 reference on sampled rows only (large shapes); still both verdicts.
  Result sampled = attnlab("verify --impl blocked --sample-rows 3 " + qkv() + " --expect " + path("o.npy"));
  EXPECT_EQ(sampled.code, 0) << sampled.out;
  Result sampled_bad = attnlab("verify --impl naive --sample-rows 3 " + qkv() + " --expect " + path("oc.npy"));
  EXPECT_EQ(sampled_bad.code, 1) << sampled_bad.out;
  Result negative = attnlab("verify --impl naive --sample-rows -1 " + qkv() + " --expect " + path("o.npy"));
  EXPECT_EQ(negative.code, 2) << negative.out;
  EXPECT_NE(negative.out.find("sample-rows"), std::string::npos) << negative.out;
}

// A NaN row in the inputs gives a NaN row in O; an expected file holding finite values there
// disagrees, element by element (a NaN relative error must not be dropped by a max).
TEST_F(Cli, VerifyExpectRefusesFiniteWhereTheReferenceIsNaN) {
  Problem p = test::shape(1, 4, 2, 9, 9, 16);
  Tensors t = random_tensors(p, 9);
  t.q.get()[(1 * p.q_len + 5) * p.head_dim + 3] = std::numeric_limits<float>::quiet_NaN();  // (h 1, i 5)
  const std::vector<int64_t> qs{1, 4, 9, 16}, kvs{1, 2, 9, 16};
  write_npy(path("q.npy"), t.q.get(), qs);
  write_npy(path("k.npy"), t.k.get(), kvs);
  write_npy(path("v.npy"), t.v.get(), kvs);
  const Reference ref = reference(p, t.inputs);
  std::vector<float> o(ref.o.begin(), ref.o.end()), lse(ref.lse.begin(), ref.lse.end());
  const size_t row = 1 * p.q_len + 5;  // all_rows' order is (b, h, i)
  ASSERT_TRUE(std::isnan(o[row * p.head_dim])) << "the reference row is NaN";
  write_npy(path("o_nan.npy"), o.data(), qs);
  write_npy(path("lse.npy"), lse.data(), {1, 4, 9});
  const Result same = attnlab("verify --impl naive,flash " + qkv() + " --expect " + path("o_nan.npy") +
                              " --expect-lse " + path("lse.npy"));
  EXPECT_EQ(same.code, 0) << "NaN where the reference is NaN agrees\n" << same.out;
  std::fill(o.begin() + row * p.head_dim, o.begin() + (row + 1) * p.head_dim, 0.25f);
  write_npy(path("o.npy"), o.data(), qs);
  const Result bad = attnlab("verify --impl naive,flash " + qkv() + " --expect " + path("o.npy"));
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find("DISAGREES"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("FAIL"), std::string::npos) << "the kernels' NaN row disagrees with 0.25\n" << bad.out;
  // LSE: a finite value where the reference's LSE is NaN.
  lse[row] = 1.5f;
  write_npy(path("lse_bad.npy"), lse.data(), {1, 4, 9});
  const Result bad_lse = attnlab("verify --impl naive " + qkv() + " --expect " + path("o_nan.npy") + " --expect-lse " +
                                 path("lse_bad.npy"));
  EXPECT_EQ(bad_lse.code, 1) << bad_lse.out;
}

// measure(): a finite output where the reference row is NaN is an infinite error, not a NaN one.
TEST(Measure, FiniteWhereReferenceIsNaNIsInfinite) {
  Problem p = test::shape(1, 1, 1, 2, 2, 4);
  Tensors t = random_tensors(p, 3);
  t.q.get()[4] = std::numeric_limits<float>::quiet_NaN();  // row i = 1
  const Reference ref = reference(p, t.inputs);
  std::vector<float> o(ref.o.begin(), ref.o.end());
  std::fill(o.begin() + 4, o.end(), 0.25f);
  const MutView ov = make_view<float>(o.data(), 1, 1, 2, 4, Layout::BHSD);
  const Errors e = measure(ref, as_const(ov), nullptr, p);
  EXPECT_TRUE(std::isinf(e.o_rel)) << e.o_rel;
  EXPECT_EQ(e.worst.i, 1);
  EXPECT_FALSE(Tolerance::from_baseline(Errors{}).passes(e));
}

TEST_F(Cli, VerifyRandomShapeAndDefaults) {
  Result one = attnlab(
      "verify --impl naive,blocked --batch 2 --q-heads 4 --kv-heads 1 --q-len 9 --kv-len 33 "
      "--head-dim 20 --window 4,1 --kv-lens 0,30 --layout bshd");
  EXPECT_EQ(one.code, 0) << one.out;
  EXPECT_NE(one.out.find("kv_lens=0,30"), std::string::npos) << one.out;
  Result all = attnlab("verify --impl naive");
  EXPECT_EQ(all.code, 0) << all.out;
  EXPECT_NE(all.out.find("causal=top-left"), std::string::npos) << all.out;
}

// Verifying nothing is not agreement: a named kernel that runs on no shape exits 3 with
// the reason; `all` skips it and counts what ran.
TEST_F(Cli, VerifyNamedKernelThatCannotRunExits3) {
  // Unavailable (built without CUDA, or no device); on a machine with a device this part
  // has nothing unavailable to name.
  if (Support a = kernel_or_throw("cuda_flash").available(); !a) {
    Result cuda = attnlab("verify --impl cuda_flash");
    EXPECT_EQ(cuda.code, 3) << cuda.out;
    EXPECT_NE(cuda.out.find("verified 0 of 1 kernels; not run: cuda_flash (" + a.reason + ")"), std::string::npos)
        << cuda.out;
    EXPECT_EQ(cuda.out.find("agree"), std::string::npos) << cuda.out;
    // One runnable and one not: still 3, and the one that ran is counted.
    Result pair = attnlab("verify --impl naive,cuda_flash --q-len 3 --kv-len 5 --head-dim 8");
    EXPECT_EQ(pair.code, 3) << pair.out;
    EXPECT_NE(pair.out.find("verified 1 of 2 kernels; not run: cuda_flash"), std::string::npos) << pair.out;
  }
  // Supported by decode for no shape: q_len 100 > 16. Named with its target: decode[avx2].
  const std::string label = kernel_label(kernel_or_throw("decode"));
  Result decode = attnlab("verify --impl decode --q-len 100 --kv-len 300 --head-dim 8");
  EXPECT_EQ(decode.code, 3) << decode.out;
  EXPECT_NE(decode.out.find("verified 0 of 1 kernels; not run: " + label + " (q_len 100 > 16"), std::string::npos)
      << decode.out;
  EXPECT_NE(decode.out.find("error: not verified: " + label), std::string::npos) << decode.out;
  // ...while the default shapes include decode ones (q_len 1): it runs.
  EXPECT_EQ(attnlab("verify --impl decode").code, 0);
}

TEST_F(Cli, VerifyAllSkipsWithReasonsAndCounts) {
  Result r = attnlab("verify --impl all --q-len 100 --kv-len 300 --head-dim 8");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("SKIP (q_len 100 > 16"), std::string::npos) << r.out;
  size_t total = 0, runnable = 0;
  Problem p = test::shape(1, 8, 2, 100, 300, 8);
  for (const Kernel* k : registry()) {
    ++total;
    runnable += k->available() && supports_problem(*k, p);
  }
  ASSERT_LT(runnable, total);  // decode at least is skipped
  const std::string line =
      "verified " + std::to_string(runnable) + " of " + std::to_string(total) + " kernels; not run: ";
  EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  EXPECT_NE(r.out.find("all kernels that ran agree"), std::string::npos) << r.out;
}

// A quantized cache from float .npy K and V (--kv-dtype): decode, flash and naive read it alike, the
// O differs from the float cache's by the quantization, and the kernels that do not read such
// a cache say which do.
TEST_F(Cli, KvDtypeWritesTheCacheFromFloatFiles) {
  Problem p = test::shape(1, 8, 2, 1, 300, 64);
  write_inputs(p);
  ASSERT_EQ(attnlab("run --impl decode " + qkv() + " --out " + path("f.npy")).code, 0);
  for (const char* impl : {"decode", "naive", "flash"}) {
    const Result r = attnlab(std::string("run --impl ") + impl + " " + qkv() + " --out " +
                             path(std::string(impl) + ".npy") + " --kv-dtype q8_0");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("kv_dtype=q8_0"), std::string::npos) << r.out;
  }
  const NpyArray f = read_npy(path("f.npy")), d = read_npy(path("decode.npy")), n = read_npy(path("naive.npy"));
  double quant = 0, kernels = 0;
  for (size_t i = 0; i < f.data.size(); ++i) {
    quant = std::max(quant, static_cast<double>(std::fabs(d.data[i] - f.data[i])));
    kernels = std::max(kernels, static_cast<double>(std::fabs(d.data[i] - n.data[i])));
  }
  EXPECT_GT(quant, 1e-5) << "q8_0 moves O";
  EXPECT_LT(quant, 1e-2);
  EXPECT_LT(kernels, 1e-5) << "decode and naive read the same cache";
  const Result simd = attnlab("run --impl simd " + qkv() + " --out " + path("x.npy") + " --kv-dtype q8_0");
  EXPECT_EQ(simd.code, 2) << simd.out;
  EXPECT_NE(simd.out.find("naive, flash, decode, decode_i8, cuda_decode read a quantized cache"), std::string::npos)
      << simd.out;
  EXPECT_EQ(attnlab("verify --impl decode --kv-dtype q4_0 --q-len 1 --kv-len 300 --q-heads 8 --kv-heads 2").code, 0);
}

// A uint8 .npy array (np.save of a uint8 array): what a cache written elsewhere is handed as.
void write_u8_npy(const std::string& file, const std::vector<std::byte>& bytes, const std::vector<int64_t>& shape) {
  std::string dict = "{'descr': '|u1', 'fortran_order': False, 'shape': (";
  for (int64_t s : shape) dict += std::to_string(s) + ", ";
  dict += "), }";
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::ofstream f(file, std::ios::binary);
  const auto len = static_cast<uint16_t>(dict.size());
  f << "\x93NUMPY" << '\x01' << '\x00' << static_cast<char>(len & 0xff) << static_cast<char>(len >> 8) << dict;
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A quantized cache given as it is stored (uint8 K and V whose last dimension is a row's bytes):
// read as those bytes - O bitwise the one of the same cache written from float files - with a
// changed byte changing O, paged too, and rows of the wrong size or a missing --kv-dtype refused.
TEST_F(Cli, RawQuantizedCacheFilesAreReadAsStored) {
  const Problem p = test::shape(1, 8, 2, 3, 300, 64);
  const Tensors t = write_inputs(p);
  for (KvDType type : {KvDType::Q4_0, KvDType::U8, KvDType::Fp8E4M3}) {
    const std::string kv = std::string(" --kv-dtype ") + to_string(type);
    SCOPED_TRACE(kv);
    const int64_t rb = kv_row_bytes(type, p.head_dim);
    for (const char* name : {"k", "v"}) {
      const float* x = std::string(name) == "k" ? t.k.get() : t.v.get();
      std::vector<std::byte> rows(static_cast<size_t>(p.kv_heads * p.kv_len * rb));
      for (int64_t r = 0; r < p.kv_heads * p.kv_len; ++r)
        quantize_row(type, x + r * p.head_dim, p.head_dim, &rows[r * rb]);
      if (std::string(name) == "k") {
        write_u8_npy(path("kq.npy"), rows, {1, p.kv_heads, p.kv_len, rb});
        rows[static_cast<size_t>(5 * rb + 9)] ^= std::byte{0x10};  // one value of key 5
        write_u8_npy(path("kq_changed.npy"), rows, {1, p.kv_heads, p.kv_len, rb});
      } else {
        write_u8_npy(path("vq.npy"), rows, {1, p.kv_heads, p.kv_len, rb});
      }
    }
    const std::string raw = " --q " + path("q.npy") + " --k " + path("kq.npy") + " --v " + path("vq.npy");
    ASSERT_EQ(attnlab("run --impl decode " + qkv() + kv + " --out " + path("from_float.npy")).code, 0);
    const Result r = attnlab("run --impl decode" + raw + kv + " --out " + path("raw.npy"));
    ASSERT_EQ(r.code, 0) << r.out;
    ASSERT_EQ(attnlab("run --impl decode" + raw + kv + " --kv-block 16 --out " + path("paged.npy")).code, 0);
    const Result changed = attnlab("run --impl decode --q " + path("q.npy") + " --k " + path("kq_changed.npy") +
                                   " --v " + path("vq.npy") + kv + " --out " + path("changed.npy"));
    ASSERT_EQ(changed.code, 0) << changed.out;
    const NpyArray a = read_npy(path("from_float.npy")), b = read_npy(path("raw.npy")), c = read_npy(path("paged.npy")),
                   d = read_npy(path("changed.npy"));
    ASSERT_EQ(a.data.size(), b.data.size());
    EXPECT_EQ(std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(a.data.data(), c.data.data(), a.data.size() * sizeof(float)), 0);
    EXPECT_NE(std::memcmp(a.data.data(), d.data.data(), a.data.size() * sizeof(float)), 0) << "the bytes are read";
  }
  const std::string raw = " --q " + path("q.npy") + " --k " + path("kq.npy") + " --v " + path("vq.npy");
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {raw + " --kv-dtype u8", "kq.npy: rows of 64 bytes; allowed: 72 (a u8 row of head_dim 64"},
           {raw, "uint8 data is a quantized cache's rows, read in the layout --kv-dtype names; allowed: --kv-dtype"},
           {" --q " + path("q.npy") + " --k " + path("kq.npy") + " --v " + path("v.npy") + " --kv-dtype fp8_e4m3",
            "v.npy: '<f4' data beside a uint8 cache"}}) {
    const Result bad = attnlab("run --impl decode" + args + " --out " + path("bad.npy"));
    EXPECT_EQ(bad.code, 2) << bad.out;
    EXPECT_NE(bad.out.find(message), std::string::npos) << bad.out;
    EXPECT_FALSE(fs::exists(path("bad.npy")));
  }
}

TEST_F(Cli, BadInputGetsClearErrorsAndWritesNothing) {
  Problem p = test::shape(1, 2, 2, 3, 3, 8);
  write_inputs(p);
  const std::string out = " --out " + path("o.npy");
  struct Bad {
    std::string args, message;
  };
  const std::vector<Bad> cases = {
      {"run --impl fastest " + qkv() + out, "impl: 'fastest' is not a kernel; allowed: naive, blocked"},
      {"run --impl naive " + qkv() + out + " --window 3", "--window: bad value 3; allowed: null (no window), [L, R]"},
      {"run --impl naive " + qkv() + out + " --kv-lens 9", "kv_lens[0]: 9 is out of range"},
      {"run --impl naive " + qkv() + out + " --kv-shared true", "kv_shared: the .npy files give V as its own tensor"},
      {"run --impl naive " + qkv() + out + " --kv-block 48", "kv_block: 48 is not allowed; allowed: 0"},
      {"run --impl naive " + qkv() + out + " --causal --causal-top-left", "--causal excludes --causal-top-left"},
      {"run --impl naive --q " + path("k.npy") + " --k " + path("q.npy") + " --v " + path("missing.npy") + out,
       "cannot open"},
      {"verify --q-heads 3 --kv-heads 2", "kv_heads: 2 does not divide q_heads (3)"},
      {"verify --head-dim 0", "--head-dim: bad value 0; allowed: a positive integer"},
      {"verify --dtype f32,bf16", "--dtype: bad value [\"f32\",\"bf16\"]; allowed: one value"},
      {"verify --layout diagonal", "--layout: bad value \"diagonal\"; allowed: \"bhsd\", \"bshd\""},
      {"verify --q-heads 8 --gqa-groups 3", "--gqa-groups: bad value 3; allowed: divisors of every q_heads value"},
      {"verify --q " + path("q.npy"), "--q, --k, --v and --expect go together"},
  };
  for (const Bad& b : cases) {
    const Result r = attnlab(b.args);
    EXPECT_EQ(r.code, 2) << b.args << "\n" << r.out;
    EXPECT_NE(r.out.find(b.message), std::string::npos) << b.args << "\n" << r.out;
  }
  // Bad .npy files: bad magic, wrong dtype, truncated, shapes that do not fit.
  std::ofstream(path("junk.npy")) << "definitely not numpy";
  Result r =
      attnlab("run --impl naive --q " + path("junk.npy") + " --k " + path("k.npy") + " --v " + path("v.npy") + out);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("bad magic"), std::string::npos) << r.out;
  const float x[8] = {};
  write_npy(path("k3.npy"), x, {1, 2, 4});
  r = attnlab("run --impl naive --q " + path("q.npy") + " --k " + path("k3.npy") + " --v " + path("v.npy") + out);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("has 3 dimensions; allowed: 4"), std::string::npos) << r.out;
  write_npy(path("kd.npy"), x, {1, 2, 1, 4});
  r = attnlab("run --impl naive --q " + path("q.npy") + " --k " + path("kd.npy") + " --v " + path("kd.npy") + out);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("head_dim 4 differs from Q's head_dim 8"), std::string::npos) << r.out;
  // A peak file that is not JSON names the flag (it was nlohmann's bare parse error).
  std::ofstream(path("peak.txt")) << "";
  r = attnlab("sweep --experiment " + std::string(ATTNLAB_SOURCE_DIR) + "/experiments/quick.json --out " +
              path("sweep") + " --peak-json " + path("peak.txt"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--peak-json: " + path("peak.txt") + " is not JSON"), std::string::npos) << r.out;
  // V may differ from K in its last dimension only (head_dim_v), and --head-dim-v is range-checked.
  const float vx[2 * 2 * 8] = {};
  write_npy(path("vs.npy"), vx, {1, 2, 2, 8});  // 2 keys, K has 3
  r = attnlab("run --impl naive " + qkv().substr(0, qkv().find(" --v ")) + " --v " + path("vs.npy") + out);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("allowed: V has K's shape but for its last dimension (head_dim_v)"), std::string::npos) << r.out;
  r = attnlab("verify --head-dim-v 577");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("head_dim_v: 577 is not supported; allowed: 1 to 576, or 0 (= head_dim)"), std::string::npos)
      << r.out;
  const std::vector<float> q_data(1 * 2 * 3 * 8, 0.f);
  std::string q = encode_npy(q_data.data(), {1, 2, 3, 8});
  std::ofstream(path("qt.npy"), std::ios::binary) << q.substr(0, q.size() - 4);
  r = attnlab("run --impl naive --q " + path("qt.npy") + " --k " + path("k.npy") + " --v " + path("v.npy") + out);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("truncated data"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(path("o.npy")));
  // Unknown flags and subcommands are parse errors, not crashes.
  EXPECT_EQ(attnlab("run --impl naive --bogus").code, 2);
  EXPECT_EQ(attnlab("frobnicate").code, 2);
}

// 16-bit inputs: '<f2' files run as f16 (inferred), '<u2' files as raw bf16 bits with
// --dtype bf16, float files are rounded by --dtype; the result agrees with the reference on
// the stored values, and the misuses are clear errors.
// --mask: a bool .npy file (what numpy's np.save writes for a bool array) drives verify; a file
// that is not a mask, has the wrong rank or does not fit the shape is refused, naming the
// field and what is allowed.
TEST_F(Cli, MaskFileVerifiesAndBadMasksAreRefused) {
  const int64_t n = 40;
  const auto bool_npy = [&](const std::string& name, const std::vector<int64_t>& shape,
                            const std::function<bool(int64_t)>& at) {
    int64_t count = 1;
    for (int64_t s : shape) count *= s;
    const std::vector<float> zeros(static_cast<size_t>(count), 0.f);
    std::string bytes = encode_npy(zeros.data(), shape);  // same header length as '|b1'
    const size_t header = bytes.size() - zeros.size() * sizeof(float);
    const size_t descr = bytes.find("'<f4'");
    ASSERT_NE(descr, std::string::npos);
    bytes.replace(descr, 5, "'|b1'");
    bytes.resize(header);
    for (int64_t e = 0; e < count; ++e) bytes.push_back(at(e) ? 1 : 0);
    std::ofstream(path(name), std::ios::binary) << bytes;
  };
  // Causal with holes; row 0 keeps key 0 and row 7 sees nothing (a fully masked row).
  bool_npy("mask.npy", {n, n}, [&](int64_t e) {
    const int64_t i = e / n, j = e % n;
    return i != 7 && j <= i && ((i + j) % 3 != 0 || j == 0);
  });
  const std::string shape = "--q-len 40 --kv-len 40 --head-dim 16 --q-heads 2 --kv-heads 1 ";
  const Result ok = attnlab("verify --impl naive,flash " + shape + "--mask " + path("mask.npy"));
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("flash"), std::string::npos) << ok.out;

  write_npy(path("float.npy"), std::vector<float>(n * n, 1.f).data(), {n, n});
  const Result f = attnlab("verify --impl naive " + shape + "--mask " + path("float.npy"));
  EXPECT_NE(f.code, 0);
  EXPECT_NE(f.out.find("dtype '<f4' is not a mask; allowed: bool ('|b1') or uint8 ('|u1')"), std::string::npos)
      << f.out;

  bool_npy("rank3.npy", {1, n, n}, [](int64_t) { return true; });
  const Result r3 = attnlab("verify --impl naive " + shape + "--mask " + path("rank3.npy"));
  EXPECT_NE(r3.code, 0);
  EXPECT_NE(r3.out.find("has 3 dimensions; allowed: 2 (q_len, kv_len) or 4"), std::string::npos) << r3.out;

  bool_npy("wide.npy", {n, n + 1}, [](int64_t) { return true; });
  const Result w = attnlab("verify --impl naive " + shape + "--mask " + path("wide.npy"));
  EXPECT_NE(w.code, 0);
  EXPECT_NE(w.out.find("mask: shape (1, 1, 40, 41)"), std::string::npos) << w.out;
  EXPECT_NE(w.out.find("allowed: (q_len, kv_len) = (40, 40)"), std::string::npos) << w.out;
}

TEST_F(Cli, SixteenBitInputs) {
  Problem p = test::shape(1, 4, 2, 6, 21, 24);
  const std::vector<int64_t> qs = {1, 4, 6, 24}, ks = {1, 2, 21, 24};
  const Tensors f = write_inputs(p);  // float32 q.npy, k.npy, v.npy
  for (DType d : {DType::BF16, DType::F16}) {
    Problem pd = p;
    pd.dtype = d;
    const Tensors t = convert_inputs(pd, f.inputs);
    const std::string ext = d == DType::F16 ? "f2" : "u2";
    write_npy16(path("q" + ext + ".npy"), t.inputs.q16.data, qs, d);
    write_npy16(path("k" + ext + ".npy"), t.inputs.k16.data, ks, d);
    write_npy16(path("v" + ext + ".npy"), t.inputs.v16.data, ks, d);
    const std::string files =
        "--q " + path("q" + ext + ".npy") + " --k " + path("k" + ext + ".npy") + " --v " + path("v" + ext + ".npy");
    const std::string flag = d == DType::BF16 ? " --dtype bf16" : "";  // f16 is inferred from '<f2'
    const Result r =
        attnlab("run --impl flash " + files + flag + " --out " + path("o.npy") + " --lse " + path("l.npy"));
    ASSERT_EQ(r.code, 0) << r.out;
    NpyArray o = read_npy(path("o.npy")), l = read_npy(path("l.npy"));
    const Agreement a = prepare_agreement(pd, t.inputs, all_rows(pd));
    const Errors e =
        measure(a.ref, as_const(make_view<float>(o.data.data(), 1, 4, 6, 24, Layout::BHSD)), l.data.data(), pd);
    EXPECT_TRUE(a.tol.passes(e)) << to_string(d) << ": " << a.tol.why_failed(e);
    // The float32 files rounded on load give the same output, bit for bit.
    const Result r2 = attnlab("run --impl flash " + qkv() + " --dtype " + to_string(d) + " --out " + path("o2.npy"));
    ASSERT_EQ(r2.code, 0) << r2.out;
    NpyArray o2 = read_npy(path("o2.npy"));
    EXPECT_EQ(0, std::memcmp(o.data.data(), o2.data.data(), o.data.size() * 4)) << to_string(d);
    // verify runs every kernel on the stored values.
    const Result v =
        attnlab("verify --impl all --dtype " + std::string(to_string(d)) + " --q-len 9 --kv-len 40 --head-dim 20");
    EXPECT_EQ(v.code, 0) << v.out;
    EXPECT_NE(v.out.find(std::string("dtype=") + to_string(d)), std::string::npos) << v.out;
  }
  // '<u2' without --dtype bf16, and '<f2' beside float32 files, are refused.
  Result bad = attnlab("run --impl naive --q " + path("qu2.npy") + " --k " + path("ku2.npy") + " --v " +
                       path("vu2.npy") + " --out " + path("x.npy"));
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("needs --dtype bf16"), std::string::npos) << bad.out;
  bad = attnlab("run --impl naive --q " + path("qf2.npy") + " --k " + path("k.npy") + " --v " + path("v.npy") +
                " --out " + path("x.npy"));
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("allowed: the same kind of data"), std::string::npos) << bad.out;
  // With --dtype, Q, K and V may hold different kinds of data: each is converted.
  const Result mixed = attnlab("run --impl naive --q " + path("qf2.npy") + " --k " + path("k.npy") + " --v " +
                               path("vu2.npy") + " --dtype bf16 --out " + path("m.npy"));
  EXPECT_EQ(mixed.code, 0) << mixed.out;
  const Result mixed32 = attnlab("run --impl naive --q " + path("q.npy") + " --k " + path("kf2.npy") + " --v " +
                                 path("v.npy") + " --dtype f32 --out " + path("m.npy"));
  EXPECT_EQ(mixed32.code, 0) << mixed32.out;
  bad = attnlab("run --impl naive " + qkv() + " --dtype fp8 --out " + path("x.npy"));
  EXPECT_NE(bad.code, 0) << bad.out;
  EXPECT_FALSE(fs::exists(path("x.npy")));
}

// Rounding to f16 can overflow: the warning says how many values became inf.
TEST_F(Cli, F16OverflowIsReported) {
  Problem p = test::shape(1, 1, 1, 2, 2, 4);
  Tensors t = random_tensors(p, 1);
  t.k[2] = 1e6f;
  write_npy(path("q.npy"), t.q.get(), {1, 1, 2, 4});
  write_npy(path("k.npy"), t.k.get(), {1, 1, 2, 4});
  write_npy(path("v.npy"), t.v.get(), {1, 1, 2, 4});
  const Result r = attnlab("run --impl naive " + qkv() + " --dtype f16 --out " + path("o.npy"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("warning: K holds 1 NaN/Inf value(s), first at flat index 2 (1 of them overflowed to inf "
                       "when rounded to f16)"),
            std::string::npos)
      << r.out;
}

TEST_F(Cli, NanInputsAreReported) {
  Problem p = test::shape(1, 1, 1, 2, 2, 4);
  Tensors t = random_tensors(p, 1);
  t.k[5] = std::nanf("");
  write_npy(path("q.npy"), t.q.get(), {1, 1, 2, 4});
  write_npy(path("k.npy"), t.k.get(), {1, 1, 2, 4});
  write_npy(path("v.npy"), t.v.get(), {1, 1, 2, 4});
  const Result r = attnlab("run --impl naive " + qkv() + " --out " + path("o.npy"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("warning: K holds 1 NaN/Inf value(s), first at flat index 5"), std::string::npos) << r.out;
  EXPECT_TRUE(std::isnan(read_npy(path("o.npy")).data[0]));
}

// Issue 8's hostile inputs, each of which used to crash or hang: every one is a clear error
// (exit 2) naming the field, the value and the limit. `timeout` turns a hang into exit 124
// instead of a stuck suite (the bound is generous for a loaded machine, not a timing claim).
TEST_F(Cli, HostileInputFailsFastWithClearErrors) {
  const std::string bounded = "timeout -k 5 60 ";
  Problem p = test::shape(1, 2, 2, 3, 3, 8);
  write_inputs(p);
  const std::string out = " --out " + path("o.npy");
  std::ofstream(path("pow2.json")) << R"({"description": "d", "q_len": {"pow2": [1, 4611686018427387904]}})";
  std::ofstream(path("range.json")) << R"({"description": "d", "q_len": {"range": [1, 9223372036854775807, 1]}})";
  const std::string q = encode_npy(std::vector<float>(48, 1.f).data(), {1, 2, 3, 8});
  std::ofstream(path("long.npy"), std::ios::binary) << q << "junk";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"verify --batch 4294967296 --q-heads 4294967296 --kv-heads 1 --q-len 2 --kv-len 2 --head-dim 8",
       "Q: batch * q_heads * q_len * head_dim = 4294967296 * 4294967296 * 2 * 8 is more than 2^36 (68719476736) "
       "elements per tensor; allowed: at most 2^36"},
      {"verify --q-len 9223372036854775807 --kv-len 9223372036854775807 --head-dim 1 --q-heads 1 --kv-heads 1",
       "allowed: at most 2^36"},
      {"verify --window -2,3", "--window: bad value [-2,3]; allowed: null (no window), [L, R] with integers >= -1"},
      {"run --impl flash --q /dev/zero --k /dev/zero --v /dev/zero" + out,
       "/dev/zero: is not a regular file (a character device); allowed: a regular .npy file"},
      {"run --impl flash --q " + path("long.npy") + " --k " + path("k.npy") + " --v " + path("v.npy") + out,
       "long.npy: 4 trailing bytes after the data"},
      {"sweep --dry-run --experiment " + path("pow2.json") + " --out " + path("res"),
       "is invalid: Q: batch * q_heads * q_len * head_dim"},
      {"sweep --dry-run --experiment " + path("range.json") + " --out " + path("res"),
       "at most 4096 values per key (this gives 9223372036854775807)"},
  };
  for (const auto& [args, message] : cases) {
    const Result r = attnlab(args, bounded);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find("error: "), std::string::npos) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << args << "\n" << r.out;
  }
  EXPECT_FALSE(fs::exists(path("o.npy")));
}

// A window bound past the keys is unbounded: --window -1,INT64_MAX computes exactly what no
// window does (it used to wrap, mask every row, and pass verify because the reference
// shared the wrap).
TEST_F(Cli, HugeWindowBoundsAreUnbounded) {
  Problem p = test::shape(1, 2, 1, 5, 9, 8);
  write_inputs(p);
  ASSERT_EQ(attnlab("run --impl naive " + qkv() + " --out " + path("o.npy") + " --lse " + path("l.npy")).code, 0);
  for (const char* w :
       {"-1,9223372036854775807", "9223372036854775807,-1", "9223372036854775807,9223372036854775807", "14,14"}) {
    SCOPED_TRACE(w);
    const Result r = attnlab("run --impl flash " + qkv() + " --out " + path("ow.npy") + " --lse " + path("lw.npy") +
                             " --window " + w);
    ASSERT_EQ(r.code, 0) << r.out;
    const NpyArray o = read_npy(path("o.npy")), ow = read_npy(path("ow.npy"));
    const NpyArray l = read_npy(path("l.npy")), lw = read_npy(path("lw.npy"));
    for (size_t i = 0; i < lw.data.size(); ++i) {
      EXPECT_TRUE(std::isfinite(lw.data[i])) << "row " << i << " fully masked";
      EXPECT_NEAR(lw.data[i], l.data[i], 1e-5) << i;
    }
    for (size_t i = 0; i < ow.data.size(); ++i) EXPECT_NEAR(ow.data[i], o.data[i], 1e-5) << i;
  }
}

// A kernel whose workspace is over the memory budget says so before allocating (naive's
// O(n^2) scores here, with a 128 KiB budget), while flash runs in the same budget.
TEST_F(Cli, MemoryBudgetRefusesOversizedWorkspaces) {
  Problem p = test::shape(1, 1, 1, 256, 256, 8);
  write_inputs(p);
  const std::string budget = "ATTN_MEMORY_BUDGET=128K ";
  const Result naive = attnlab("run --impl naive --threads 1 " + qkv() + " --out " + path("o.npy"), budget);
  EXPECT_EQ(naive.code, 2) << naive.out;
  EXPECT_NE(naive.out.find("naive cannot run batch=1 q_heads=1 kv_heads=1 q_len=256 kv_len=256"), std::string::npos)
      << naive.out;
  EXPECT_NE(naive.out.find("memory: needs 289.0 KiB (295936 bytes: workspace 256.0 KiB + Q, K, V, O, LSE 33.0 KiB), "
                           "above the memory budget of 128.0 KiB (131072 bytes, set by ATTN_MEMORY_BUDGET)"),
            std::string::npos)
      << naive.out;
  EXPECT_FALSE(fs::exists(path("o.npy")));
  const Result flash = attnlab("run --impl flash --threads 1 " + qkv() + " --out " + path("o.npy"), budget);
  EXPECT_EQ(flash.code, 0) << flash.out;
  const Result bad = attnlab("run --impl flash " + qkv() + " --out " + path("o2.npy"), "ATTN_MEMORY_BUDGET=lots ");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("ATTN_MEMORY_BUDGET: 'lots' is not a memory size"), std::string::npos) << bad.out;
  // verify refuses before building inputs and a float64 reference over 2^34 rows x keys.
  const Result huge =
      attnlab("verify --impl naive --q-len 131072 --kv-len 131072 --head-dim 8", "ATTN_MEMORY_BUDGET=1G timeout 30 ");
  EXPECT_EQ(huge.code, 3) << huge.out;
  EXPECT_NE(huge.out.find("SKIP (memory: needs 64.1 GiB"), std::string::npos) << huge.out;
}

}  // namespace
}  // namespace attnlab
