// kernel "auto" (include/attnlab/auto.hpp): each table row chooses its first candidate that runs here,
// passes over (naming why) the ones that cannot, and the evidence it names is committed.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "attnlab/auto.hpp"
#include "attnlab/isa.hpp"
#include "attnlab/kv_quant.hpp"
#include "cpu/dispatch/isa_internal.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

// The first of `names` that can run p here (the test's own reading of the table's order).
std::string first_that_runs(std::initializer_list<const char*> names, const Problem& p, bool backward = false) {
  for (const char* n : names) {
    const Kernel* k = find_kernel(n);
    if (k && can_run(*k, p, 2, backward)) return n;
  }
  return "";
}

// Whether this CPU runs the vpdpbusd unit of decode_i8's default target.
bool decode_i8_unit_runs() {
  const TargetTable* t = target_table_for(find_kernel("decode_i8")->isa());
  return t && t->peak.i8_unit && *t->peak.i8_unit && cpu_runs_isa(t->peak.i8_unit);
}

// InvalidInput whose message holds `part`.
template <class F>
void expect_invalid(F&& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no InvalidInput; expected one naming: " << part;
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// Resets the default target at the end of a test that forces one.
struct IsaScope {
  explicit IsaScope(std::string_view isa) { set_default_isa(isa); }
  ~IsaScope() { set_default_isa(""); }
};

TEST(Auto, DecodeOnAFloatCacheRunsDecode) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    Problem p = test::shape(1, 32, 8, 1, 4096, 128);
    p.dtype = dt, p.causal = CausalAlign::BottomRight;
    const AutoChoice c = choose_kernel(p, 2);
    EXPECT_EQ(c.kernel->name(), "decode") << to_string(dt);
    EXPECT_NE(c.rule.find("any other cache"), std::string::npos) << c.rule;
  }
  Problem p = test::shape(1, 32, 8, 1, 4096, 128);
  p.kv_dtype = KvDType::Fp8E4M3;
  EXPECT_EQ(choose_kernel(p, 2).kernel->name(), "decode");
}

TEST(Auto, DecodeOnAnIntegerCacheRunsDecodeI8WhereItsUnitRuns) {
  for (KvDType t : {KvDType::Q8_0, KvDType::Q4_0, KvDType::U8, KvDType::U4}) {
    Problem p = test::shape(1, 32, 8, 1, 4096, 128);
    p.kv_dtype = t;
    const AutoChoice c = choose_kernel(p, 2);
    const bool unit = decode_i8_unit_runs();
    EXPECT_EQ(c.kernel->name(), unit ? "decode_i8" : "decode") << to_string(t);
    if (!unit) EXPECT_NE(c.passed_over.find("no vpdpbusd unit"), std::string::npos) << c.passed_over;
    // Under either arithmetic: the cache's rounding dominates.
    EXPECT_EQ(choose_kernel(p, 2, AutoArithmetic::Int8).kernel, c.kernel);
  }
  // The scalar target has no int8 unit: decode, and the reason decode_i8 was passed over.
  IsaScope scalar("scalar");
  Problem p = test::shape(1, 32, 8, 1, 4096, 128);
  p.kv_dtype = KvDType::U8;
  const AutoChoice c = choose_kernel(p, 2);
  EXPECT_EQ(kernel_label(*c.kernel), "decode[scalar]");
  EXPECT_NE(c.passed_over.find("decode_i8[scalar]: no vpdpbusd unit"), std::string::npos) << c.passed_over;
}

TEST(Auto, MqaDecodeOnAnIntegerCacheFallsToDecodeNamingWhy) {
  Problem p = test::shape(1, 32, 1, 1, 4096, 128);  // 32 rows per kv head: decode_i8 refuses
  p.kv_dtype = KvDType::Q4_0;
  const AutoChoice c = choose_kernel(p, 2);
  EXPECT_EQ(c.kernel->name(), "decode");
  EXPECT_NE(c.passed_over.find("decode_i8"), std::string::npos) << c.passed_over;
}

TEST(Auto, PrefillFollowsTheArithmeticClass) {
  Problem p = test::shape(1, 8, 8, 256, 256, 64);
  p.causal = CausalAlign::BottomRight;
  EXPECT_EQ(choose_kernel(p, 2).kernel->name(), "flash");  // float32 inputs: float32 products
  EXPECT_EQ(choose_kernel(p, 2, AutoArithmetic::Int8).kernel->name(),
            first_that_runs({"flash_int8_amx", "flash_int8"}, p));
  p.dtype = DType::BF16;
  EXPECT_EQ(choose_kernel(p, 2).kernel->name(), first_that_runs({"flash_amx", "flash_bf16", "flash"}, p));
  EXPECT_EQ(choose_kernel(p, 2, AutoArithmetic::Int8).kernel->name(),  // int8 is for float32 inputs only
            choose_kernel(p, 2).kernel->name());
  EXPECT_EQ(choose_kernel(p, 2, AutoArithmetic::F32).kernel->name(), "flash");  // float32 products asked for
  p.dtype = DType::F16;
  EXPECT_EQ(choose_kernel(p, 2).kernel->name(), "flash");
}

TEST(Auto, PassesOverCandidatesThatRefuseTheProblem) {
  // bf16 inputs on a quantized cache, prefill: the bf16-product kernels take no quantized cache.
  Problem p = test::shape(1, 8, 8, 64, 256, 64);
  p.dtype = DType::BF16, p.kv_dtype = KvDType::U8;
  const AutoChoice c = choose_kernel(p, 2);
  EXPECT_EQ(c.kernel->name(), "flash");
  if (find_kernel("flash_bf16")->available()) {
    EXPECT_NE(c.passed_over.find("flash_bf16"), std::string::npos) << c.passed_over;
  }
}

TEST(Auto, BackwardRunsAKernelWithABackward) {
  Problem p = test::shape(1, 4, 2, 64, 64, 32);
  p.pass = Pass::Backward;
  const AutoChoice c = choose_kernel(p, 2);
  EXPECT_TRUE(c.kernel->capabilities().backward);
  EXPECT_EQ(c.kernel->name(), "flash");
}

TEST(Auto, ResolveNamesAndRefusals) {
  const Problem p = test::shape(1, 4, 4, 16, 16, 32);
  EXPECT_EQ(resolve_kernel("naive", "", p, 2).kernel->name(), "naive");
  EXPECT_EQ(resolve_kernel("auto", "", p, 2).kernel->name(), "flash");
  expect_invalid([&] { resolve_kernel("auto", "scalar", p, 2); }, "isa");
  expect_invalid([&] { resolve_kernel("nope", "", p, 2); }, "impl");
  expect_invalid([] { parse_auto_arithmetic("fp8"); }, "arithmetic: 'fp8'; allowed: native");
  EXPECT_EQ(parse_auto_arithmetic("int8"), AutoArithmetic::Int8);
}

// attnlab's output and exit status for `args`.
std::pair<std::string, int> attnlab(const std::string& args) {
  const std::string cmd = test::attnlab_exe() + " " + args + " 2>&1";
  std::string out;
  FILE* pipe = popen(cmd.c_str(), "r");
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  const int status = pclose(pipe);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

TEST(Auto, VerifyImplAutoChecksTheChosenKernelPerShape) {
  const auto [out, rc] = attnlab(
      "verify --impl auto --batch 1 --q-heads 8 --kv-heads 2 --q-len 1 --kv-len 300 --head-dim 64 --causal "
      "--kv-dtype u8 --threads 2");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("auto>decode"), std::string::npos) << out;  // decode_i8 or decode: the unit decides
  EXPECT_NE(out.find("on a q8_0, q4_0, u8 or u4 cache"), std::string::npos) << out;
  EXPECT_NE(out.find("verified 1 of 1 kernels"), std::string::npos) << out;
  const auto [bad, bad_rc] = attnlab("verify --impl auto --isa scalar --q-len 4 --kv-len 4");
  EXPECT_EQ(bad_rc, 2) << bad;
  EXPECT_NE(bad.find("isa: given with --impl auto"), std::string::npos) << bad;
  const auto [list, list_rc] = attnlab("list");
  EXPECT_EQ(list_rc, 0);
  EXPECT_NE(list.find(auto_table()), std::string::npos) << list;
}

// Every kernel a row names exists, and every results folder its evidence names is committed.
TEST(Auto, TheTableNamesKernelsAndCommittedRuns) {
  const std::string table = auto_table();
  std::set<std::string> names;
  for (const Kernel* k : registry()) names.insert(std::string(k->name()));
  const std::regex row(R"(^\d+\. [^:]+: (.*)$)");
  int rows = 0;
  std::istringstream lines(table);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_match(line, m, row)) continue;
    ++rows;
    std::istringstream cands(std::regex_replace(m[1].str(), std::regex(" > "), " "));
    for (std::string c; cands >> c;) EXPECT_TRUE(names.count(c)) << c << " in: " << line;
  }
  EXPECT_GE(rows, 6);
  const std::regex folder(R"(results/([0-9]{4}-[0-9]{2}-[0-9]{2}-[A-Za-z0-9_-]+))");
  int cited = 0;
  for (std::sregex_iterator it(table.begin(), table.end(), folder), end; it != end; ++it, ++cited) {
    const std::filesystem::path dir = std::filesystem::path(ATTNLAB_SOURCE_DIR) / "results" / (*it)[1].str();
    EXPECT_TRUE(std::filesystem::is_directory(dir)) << dir;
  }
  EXPECT_GE(cited, 5);
}

}  // namespace
}  // namespace attnlab
