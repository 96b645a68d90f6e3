// The report and compare scripts on the fixture results folders (tests/fixtures/), run with
// /usr/bin/python3 (matplotlib + numpy). Also checks the fitted exponent on synthetic data
// written by the C++ CSV writer, so writer and reader are tested together.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sys/wait.h>
#include <unistd.h>
#include <cmath>
#include <limits>
#include <tuple>

#include <nlohmann/json.hpp>

#include "attnlab/kernel.hpp"
#include "attnlab/npy.hpp"
#include "bench/sweep/bench_point.hpp"
#include "bench/results/files.hpp"
#include "bench/results/results.hpp"
#include "test_util.hpp"

namespace attnlab::bench {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const std::string kSource = ATTNLAB_SOURCE_DIR;
const std::string kPython = "/usr/bin/python3";

bool python_ready() { return std::system((kPython + " -c 'import matplotlib, numpy' > /dev/null 2>&1").c_str()) == 0; }

// Runs a command; returns its exit status and leaves stdout+stderr in *output.
int run(const std::string& cmd, std::string* output) {
  // One log per process and call: ctest runs the tests of this file in parallel processes.
  static int calls = 0;
  const std::string log =
      ::testing::TempDir() + "/attn_report_cmd." + std::to_string(::getpid()) + "." + std::to_string(++calls) + ".log";
  const int rc = std::system((cmd + " > '" + log + "' 2>&1").c_str());
  *output = read_text_file(log);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/attn_report_" + name;
  fs::remove_all(d);
  return d;
}

void expect_png(const std::string& path) {
  ASSERT_TRUE(file_exists(path)) << path;
  const std::string bytes = read_text_file(path);
  EXPECT_GT(bytes.size(), 5000u) << path;
  EXPECT_EQ(bytes.substr(1, 3), "PNG") << path;
}

class Report : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!python_ready()) GTEST_SKIP() << kPython << " with matplotlib and numpy is not installed (scripts/setup.sh)";
  }
  std::string report(const std::string& folder, const std::string& out, int* rc = nullptr) {
    std::string output;
    const int status =
        run(kPython + " " + kSource + "/scripts/report.py '" + folder + "' --out '" + out + "'", &output);
    if (rc) {
      *rc = status;
    } else {
      EXPECT_EQ(status, 0) << output;
    }
    return output;
  }
};

TEST_F(Report, ScalingFixtureGetsSummaryAndEveryApplicablePlot) {
  const std::string out = fresh_dir("scaling");
  report(kSource + "/tests/fixtures/results_scaling", out);
  const std::string md = read_text_file(out + "/report.md");
  EXPECT_NE(md.find("# attnlab report: results_scaling"), std::string::npos);
  EXPECT_NE(md.find("## Summary"), std::string::npos);
  ASSERT_NE(md.find("!["), std::string::npos) << "no plot in the report";
  EXPECT_LT(md.find("## Summary"), md.find("![")) << "the summary table comes before the plots";
  EXPECT_NE(md.find("**Noise.**"), std::string::npos);
  for (const char* k : {"naive", "blocked", "flash"}) {
    // (the fixture predates the roofline: its best % of roofline is "-")
    const std::regex row(std::string("\\| ") + k +
                         " \\| -?[0-9]+\\.[0-9]+ \\(time vs n\\) \\| [0-9.]+ \\| [0-9.]+ \\| [0-9]+ \\| - \\| PASS");
    EXPECT_TRUE(std::regex_search(md, row)) << k << " summary row missing or malformed";
  }
  for (const char* png :
       {"scaling_time.png", "scaling_gflops.png", "ladder.png", "extra_memory.png", "threads.png", "masks.png"}) {
    expect_png(out + "/" + png);
    EXPECT_NE(md.find(std::string("](") + png + ")"), std::string::npos) << png << " not in report.md";
  }
  EXPECT_FALSE(file_exists(out + "/gqa.png")) << "no GQA variation in this fixture";
  // Six plots, each followed by its caption (an italic paragraph).
  size_t images = 0;
  for (size_t at = md.find("!["); at != std::string::npos; at = md.find("![", at + 1)) {
    ++images;
    const size_t caption = md.find("\n\n*", at);
    EXPECT_EQ(md.find('\n', at), caption) << "no caption right after the image at " << at;
  }
  EXPECT_EQ(images, 6u);
}

TEST_F(Report, GqaDecodeFixtureGetsGqaAndDecodePlots) {
  const std::string out = fresh_dir("gqa");
  report(kSource + "/tests/fixtures/results_gqa_decode", out);
  const std::string md = read_text_file(out + "/report.md");
  expect_png(out + "/gqa.png");
  expect_png(out + "/decode.png");
  EXPECT_NE(md.find("(time vs kv_len)"), std::string::npos) << "decode exponent in the summary";
  EXPECT_FALSE(file_exists(out + "/scaling_time.png")) << "a single prefill length gives no scaling plot";
}

// Synthetic points with exact power laws: the report must recover the exponents.
TEST_F(Report, FittedExponentIsExactOnPowerLaws) {
  const std::string dir = fresh_dir("synthetic");
  make_dirs(dir);
  std::vector<PointRecord> records;
  for (const auto& [kernel, power] : {std::pair<std::string, double>{"naive", 2.0}, {"flash", 1.5}}) {
    for (int64_t n = 64; n <= 2048; n *= 2) {
      PointRecord r;
      r.kernel = kernel;
      r.id = kernel + std::to_string(n);
      r.status = PointStatus::Ok;
      r.problem.q_len = r.problem.kv_len = n;
      r.problem.head_dim = 16;
      const double t = 1e-9 * std::pow(static_cast<double>(n), power);
      r.times = {t * 0.99, t, t * 1.01};
      r.verdict = "PASS";
      r.peak_flops = 1e11;
      records.push_back(r);
    }
  }
  write_file_atomic(dir + "/results.csv", tidy_csv("synthetic", records));
  const std::string out = fresh_dir("synthetic_out");
  report(dir, out);
  const std::string md = read_text_file(out + "/report.md");
  EXPECT_NE(md.find("| naive | 2.00 (time vs n)"), std::string::npos) << md.substr(0, 2000);
  EXPECT_NE(md.find("| flash | 1.50 (time vs n)"), std::string::npos) << md.substr(0, 2000);
}

// Sparse patterns whose lists follow n (globals spread over the sequence, documents of a mean
// length) get a new mask name at each n; the report still gives each family one line and one
// exponent, and the skipping efficiency against the dense points.
TEST_F(Report, SparsePatternFamiliesGetOneExponentEach) {
  const std::string dir = fresh_dir("sparse");
  make_dirs(dir);
  std::vector<PointRecord> records;
  for (int64_t n = 2048; n <= 8192; n *= 2) {
    for (int which = 0; which < 3; ++which) {
      PointRecord r;
      r.kernel = "flash";
      r.status = PointStatus::Ok;
      Problem& p = r.problem;
      p.q_len = p.kv_len = n;
      p.head_dim = 16;
      double t = 1e-9 * static_cast<double>(n) * static_cast<double>(n);  // dense: n^2
      if (which == 1) {                                                   // Longformer-like: 16 globals spread over n
        p.window_left = p.window_right = 64;
        for (int64_t g = 0; g < 16; ++g) p.globals.push_back(g * n / 16);
        t = 1e-6 * static_cast<double>(n);
      } else if (which == 2) {  // documents of mean 1024: 512, 1536, ... cut to fit
        p.causal = CausalAlign::BottomRight;
        for (int64_t at = 0, k = 0; at < n; ++k) {
          const int64_t len = std::min<int64_t>(k % 2 ? 1536 : 512, n - at);
          p.doc_lens.push_back(len);
          at += len;
        }
        t = 2e-6 * static_cast<double>(n);
      }
      p.validate();
      r.id = "flash_" + std::to_string(n) + "_" + std::to_string(which);
      r.times = {t * 0.99, t, t * 1.01};
      r.verdict = "PASS";
      r.peak_flops = 1e11;
      records.push_back(r);
    }
  }
  write_file_atomic(dir + "/results.csv", tidy_csv("sparse", records));
  const std::string out = fresh_dir("sparse_out");
  report(dir, out);
  const std::string md = read_text_file(out + "/report.md");
  const auto at = md.find("## Sparse patterns");
  ASSERT_NE(at, std::string::npos) << md.substr(0, 2000);
  const std::string sec = md.substr(at, md.find("\n## ", at + 1) - at);  // this section only
  EXPECT_NE(sec.find("| flash | none | 2.00 |"), std::string::npos) << sec.substr(0, 3000);
  EXPECT_NE(sec.find("| flash | window_64_64_global16 | 1.00 |"), std::string::npos) << sec.substr(0, 3000);
  EXPECT_NE(sec.find("| flash | causal_docs | 1.00 |"), std::string::npos) << sec.substr(0, 3000);
  EXPECT_EQ(sec.find("global16h"), std::string::npos) << "one line per family, not per n";
}

// A failed point whose errors are inf and NaN (written by the C++ CSV writer as inf, nan)
// loads and is counted and listed as failed.
TEST_F(Report, FailedPointWithNonFiniteErrorsIsCounted) {
  const std::string dir = fresh_dir("nonfinite");
  make_dirs(dir);
  std::vector<PointRecord> records;
  for (const std::string kernel : {"naive", "flash"}) {
    PointRecord r;
    r.kernel = kernel;
    r.id = kernel + "64";
    r.problem.q_len = r.problem.kv_len = 64;
    r.problem.head_dim = 16;
    r.verdict = kernel == "naive" ? "PASS" : "FAIL";
    r.tol_o_rel = r.tol_lse = 4e-6;
    if (kernel == "naive") {
      r.status = PointStatus::Ok;
      r.times = {1e-4, 1.1e-4};
    } else {
      r.status = PointStatus::Failed;
      r.reason = "disagrees with the float64 reference: O error inf";
      r.err_o_rel = std::numeric_limits<double>::infinity();
      r.err_lse = std::numeric_limits<double>::quiet_NaN();
    }
    records.push_back(r);
  }
  const std::string csv = tidy_csv("nonfinite", records);
  ASSERT_NE(csv.find(",FAIL,inf,"), std::string::npos) << csv;
  write_file_atomic(dir + "/results.csv", csv);
  const std::string out = fresh_dir("nonfinite_out");
  report(dir, out);
  const std::string md = read_text_file(out + "/report.md");
  EXPECT_NE(md.find("FAIL (1 of 1 shapes) | 0 / 1 / 0 |"), std::string::npos) << md.substr(0, 3000);
  EXPECT_NE(md.find("O error inf"), std::string::npos) << "listed with its reason";
}

// Two targets with exact numbers: flash at 5 GFLOP/s on scalar (peak 10) and 40 GFLOP/s on
// avx2 (peak 80), naive (built once) at 8 GFLOP/s. % of peak must use the row's own target
// (50% for both flash rows; naive against the default target avx2: 10%), the speed-up over
// scalar is 8x and the peak ratio 8x; a kernel on several targets is named kernel[isa].
TEST_F(Report, TwoTargetsGetVectorWidthSectionAndPerTargetPeaks) {
  const std::string dir = fresh_dir("isa");
  make_dirs(dir);
  std::vector<PointRecord> records;
  for (const auto& [kernel, isa, rate] : {std::tuple<std::string, std::string, double>{"naive", "baseline", 8e9},
                                          {"flash", "scalar", 5e9},
                                          {"flash", "avx2", 40e9}}) {
    for (int64_t n : {64, 128}) {
      PointRecord r;
      r.kernel = kernel;
      r.isa = isa;
      r.id = kernel + std::to_string(n) + isa;
      r.status = PointStatus::Ok;
      r.problem.q_len = r.problem.kv_len = n;
      r.problem.head_dim = 16;
      r.threads = 1;
      const double t = r.problem.flops() / rate;
      r.times = {t, t, t};
      r.verdict = "PASS";
      records.push_back(r);
    }
  }
  write_file_atomic(dir + "/results.csv", tidy_csv("isa", records));
  auto target = [](const std::string& isa, double fma) {
    return Json{
        {"isa", isa},
        {"lanes", 1},
        {"fma_chains", 1},
        {"rows", Json::array({{{"threads", 1}, {"fma_flops", fma}, {"read_bytes", 2e10}, {"exp_per_s", 1e9}}})}};
  };
  const Json machine = {{"isa",
                         {{"default", "avx2"},
                          {"simd_arch", "avx2"},
                          {"targets_built", {"scalar", "avx2", "avx512"}},
                          {"targets_cpu_runs", {"scalar", "avx2"}}}},
                        {"kernels", Json::array({{{"name", "naive"}}, {{"name", "flash"}}})},
                        {"peaks",
                         {{"schema", "attnlab-peak-2"},
                          {"simd_arch", "avx2"},
                          {"repeats", 1},
                          {"exp_function", "test"},
                          {"targets", Json::array({target("scalar", 1e10), target("avx2", 8e10)})}}}};
  write_file_atomic(dir + "/machine.json", machine.dump());
  const std::string out = fresh_dir("isa_out");
  report(dir, out);
  const std::string md = read_text_file(out + "/report.md");
  expect_png(out + "/vector_width.png");
  EXPECT_NE(md.find("## What vector width buys"), std::string::npos) << md;
  for (const char* n : {"64", "128"}) {
    SCOPED_TRACE(n);
    const std::string shape = std::string("b1 h1/1 q") + n + " kv" + n + " d16 none | 1 | ";
    // GB/s and % of the read bandwidth (20 GB/s) sit between % of peak and the speed-up: 8x
    // apart, as the times are.
    const std::regex row_scalar(
        "\\| flash \\| " + std::regex_replace(shape, std::regex("\\|"), "\\|") +
        "scalar \\| 5\\.0 \\| 50\\.0 \\| ([0-9.]+) \\| ([0-9.]+) \\| 1\\.00x \\| 1\\.00x \\| 100% \\|");
    const std::regex row_avx2(
        "\\| flash \\| " + std::regex_replace(shape, std::regex("\\|"), "\\|") +
        "avx2 \\| 40\\.0 \\| 50\\.0 \\| ([0-9.]+) \\| ([0-9.]+) \\| 8\\.00x \\| 8\\.00x \\| 100% \\|");
    std::smatch ms, ma;
    ASSERT_TRUE(std::regex_search(md, ms, row_scalar)) << md;
    ASSERT_TRUE(std::regex_search(md, ma, row_avx2)) << md;
    EXPECT_NEAR(std::stod(ma[1]) / std::stod(ms[1]), 8.0, 0.1);
    EXPECT_NEAR(std::stod(ma[2]) / std::stod(ms[2]), 8.0, 0.2);
    EXPECT_NEAR(std::stod(ma[2]), 100.0 * std::stod(ma[1]) / 20.0, 0.1);
  }
  // The summary names each variant; best % of peak per the row's own target.
  EXPECT_NE(md.find("| flash[scalar] | "), std::string::npos) << md;
  EXPECT_TRUE(std::regex_search(md, std::regex("\\| flash\\[avx2\\] \\| [^|]+ \\| 40\\.0 \\| 50\\.0 \\|"))) << md;
  EXPECT_TRUE(std::regex_search(md, std::regex("\\| naive \\| [^|]+ \\| 8\\.0 \\| 10\\.0 \\|"))) << md;
  EXPECT_NE(md.find("| scalar | 1 | 10.0 | 20.0 |"), std::string::npos) << "peaks per target in the machine section";
  EXPECT_NE(md.find("| avx2 (default) | 1 | 80.0 | 20.0 |"), std::string::npos) << md;

  // The fixture written by a real sweep on two targets (tests/fixtures/results_isa).
  const std::string fx = fresh_dir("isa_fixture");
  report(kSource + "/tests/fixtures/results_isa", fx);
  const std::string fmd = read_text_file(fx + "/report.md");
  expect_png(fx + "/vector_width.png");
  for (const char* k : {"simd[scalar]", "simd[avx2]", "flash[scalar]", "flash[avx2]"}) {
    EXPECT_NE(fmd.find(std::string("| ") + k + " | "), std::string::npos) << k;
  }
  EXPECT_NE(fmd.find("| naive | "), std::string::npos) << "naive is built once: no target in its name";
}

// report.py's peak_for (the rule of Peaks::ref): a CUDA row is held to the GPU's FP32 peak from
// machine.json's peaks "gpu", never to the CPU's; without a GPU figure it has none.
TEST_F(Report, CudaRowsAreMeasuredAgainstTheGpuPeak) {
  const std::string code =
      "import sys; sys.path.insert(0, '" ATTNLAB_SOURCE_DIR
      "/scripts'); import report\n"
      "rows = [{'threads': 2, 'fma_flops': 3e11, 'read_bytes': 2e10}]\n"
      "m = {'isa': {'targets_built': ['avx512'], 'default': 'avx512'}, 'peaks': {'simd_arch': 'avx512',\n"
      "     'targets': [{'isa': 'avx512', 'rows': rows}], 'gpu': {'fp32_flops': 6e13, 'read_bytes': 4.8e12}}}\n"
      "best = report.best_peaks(m)\n"
      "assert report.peak_for({'isa': 'cuda', 'threads': 2}, best, m) == (6e13, 4.8e12)\n"
      "assert report.peak_for({'isa': 'avx512', 'threads': 2}, best, m) == (3e11, 2e10)\n"
      "del m['peaks']['gpu']\n"
      "assert report.peak_for({'isa': 'cuda', 'threads': 2}, best, m) == (None, None)\n"
      "print('ok')\n";
  const std::string file = fresh_dir("cuda_peak") + ".py";
  write_file_atomic(file, code);
  FILE* pipe = popen(("/usr/bin/python3 " + file + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  EXPECT_EQ(pclose(pipe), 0) << out;
  EXPECT_EQ(out, "ok\n");
}

TEST_F(Report, MissingResultsAreAnError) {
  int rc = 0;
  const std::string output = report(fresh_dir("empty_in"), fresh_dir("empty_out"), &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(output.find("results.csv not found"), std::string::npos) << output;
}

TEST_F(Report, CompareGivesPerPointSpeedups) {
  const std::string out = fresh_dir("compare");
  const std::string fx = kSource + "/tests/fixtures/results_scaling";
  std::string output;
  ASSERT_EQ(run(kPython + " " + kSource + "/scripts/compare.py '" + fx + "' '" + fx + "' --out '" + out + "'", &output),
            0)
      << output;
  const std::string md = read_text_file(out + "/compare.md");
  EXPECT_NE(md.find("| naive | 16 | 1.000 | 1.000 | 1.000 |"), std::string::npos) << md;
  EXPECT_NE(md.find("within noise"), std::string::npos);
  expect_png(out + "/compare.png");

  // Folders without common points: an error, not an empty table.
  EXPECT_NE(run(kPython + " " + kSource + "/scripts/compare.py '" + fx + "' '" + kSource +
                    "/tests/fixtures/results_gqa_decode' --out '" + out + "2'",
                &output),
            0);
  EXPECT_NE(output.find("no measured point in common"), std::string::npos) << output;
}

// compare.py reads the repetitions of committed runs (no points/) from bench.json: Google
// Benchmark names map back to point ids exactly as point_id() writes them.
TEST_F(Report, CompareMapsBenchmarkNamesToPointIds) {
  Problem p = test::shape(1, 8, 2, 4096, 4096, 192);
  p.head_dim_v = 128, p.layout = Layout::BSHD, p.dtype = DType::BF16, p.causal = CausalAlign::BottomRight;
  const Problem q = test::shape(1, 32, 8, 1, 32768, 128);
  std::string cases;
  for (const auto& [k, pr, isa, model] : {std::tuple{"flash", p, "avx2", ""}, std::tuple{"decode", q, "", ""},
                                          std::tuple{"naive", p, "", ""}, std::tuple{"flash", q, "", "llama-3"}}) {
    const PointView v{k, pr, 2, isa, model};
    cases += "(" + Json(point_name(v) + "/min_time:0.050/repeats:3/real_time").dump() + ", " +
             Json(point_id(v)).dump() + "),";
  }
  // With this build's schema.json (what a new folder holds), every case; without one (the
  // folders from before it), those that have no model label.
  const std::string schema = fresh_dir("id_of_name_schema") + ".json";
  std::ofstream(schema) << schema_json().dump();
  std::string output;
  const std::string py = "import json, sys; sys.path.insert(0, '" + kSource +
                         "/scripts'); from compare import id_of_name; "
                         "s = json.load(open('" +
                         schema + "')); cases = [" + cases +
                         "]; "
                         "bad = [(n, i, id_of_name(n, s)) for n, i in cases if id_of_name(n, s) != i]; "
                         "bad += [(n, i, id_of_name(n)) for n, i in cases[:3] if id_of_name(n) != i]; "
                         "print(bad); sys.exit(1 if bad else 0)";
  const std::string script = fresh_dir("id_of_name") + ".py";
  std::ofstream(script) << py << "\n";
  EXPECT_EQ(run(kPython + " '" + script + "'", &output), 0) << output;
}

// compare.py's U test over the repetitions (points/<id>.json) and its machine check: the same
// folder with one point's five repetitions made twice as fast, and another CPU in machine.json.
TEST_F(Report, CompareTestsSignificanceAndFlagsMachineDifferences) {
  if (!python_ready() || std::system((kPython + " -c 'import scipy' > /dev/null 2>&1").c_str()) != 0) {
    GTEST_SKIP() << "no matplotlib/numpy/scipy for " << kPython;
  }
  const std::string fx = kSource + "/tests/fixtures/results_scaling";
  const std::string a = fresh_dir("cmp_a"), b = fresh_dir("cmp_b"), out = fresh_dir("cmp_out");
  for (const std::string& d : {a, b}) {
    fs::copy(fx, d, fs::copy_options::recursive);
    fs::create_directories(d + "/points");
  }
  const std::string fast = "naive-b1-hq2-hkv2-sq32-sk32-d16-causal-t1",
                    same = "naive-b1-hq2-hkv2-sq32-sk32-d16-causal-t2";
  const auto put = [](const std::string& dir, const std::string& id, double t) {
    Json times = Json::array();
    for (int r = 0; r < 5; ++r) times.push_back(t * (1 + 0.01 * r));
    std::ofstream(dir + "/points/" + id + ".json") << Json{{"record", {{"times_s", times}}}}.dump();
  };
  put(a, fast, 2e-5), put(b, fast, 1e-5);
  put(a, same, 1e-5), put(b, same, 1e-5);
  Json machine = Json::parse(read_text_file(b + "/machine.json"));
  machine["cpu_model"] = "Another CPU";
  // B's peaks measured again after its points at twice the FMA rate: compare.py holds each run
  // to the larger of its two measurements (the report's rule), so the FMA peaks differ.
  Json after = machine["peaks"];
  for (Json& row : after["rows"]) row["fma_flops"] = 2 * row["fma_flops"].get<double>();
  machine["peaks_after"] = after;
  std::ofstream(b + "/machine.json") << machine.dump();
  std::string output;
  ASSERT_EQ(run(kPython + " " + kSource + "/scripts/compare.py '" + a + "' '" + b + "' --out '" + out + "'", &output),
            0)
      << output;
  const std::string md = read_text_file(out + "/compare.md");
  EXPECT_NE(md.find("machines differ"), std::string::npos) << md;
  EXPECT_NE(md.find("Another CPU"), std::string::npos) << md;
  EXPECT_NE(md.find("threads fma_flops: "), std::string::npos) << md;
  EXPECT_EQ(md.find("threads read_bytes: "), std::string::npos) << md;
  // 5 vs 5 repetitions, all of B below all of A: exact two-sided p = 2/252.
  EXPECT_NE(md.find("| " + fast + " | "), std::string::npos) << md;
  const std::regex fast_row("\\| " + fast + " \\|[^\\n]*\\| 0\\.00794 \\|  \\|");
  EXPECT_TRUE(std::regex_search(md, fast_row)) << md;
  const std::regex same_row("\\| " + same + " \\|[^\\n]*\\| within noise \\|");
  EXPECT_TRUE(std::regex_search(md, same_row)) << md;
  expect_png(out + "/compare.png");
}

}  // namespace
}  // namespace attnlab::bench

namespace attnlab::bench {
namespace {

// attnlab generate writes its folder and generation_report.py reads it: two configurations
// (MHA and MQA over the same query heads), the report's table, speed-up rows and both plots.
TEST(GenerationReport, GenerateThenReport) {
  if (!python_ready()) GTEST_SKIP() << "no matplotlib/numpy for " << kPython;
  const std::string dir = fresh_dir("generation");
  fs::create_directories(dir);
  {
    std::ofstream(dir + "/g.json") << R"({"kind": "generation", "description": "d", "q_heads": 8, "head_dim": 32,
      "prompts": [200, 700], "steps": 4, "threads": 1, "verify_steps": 1, "repetitions": 1,
      "runs": [{"name": "mha", "kv_heads": 8}, {"name": "mqa", "kv_heads": 1}]})";
  }
  std::string output;
  ASSERT_EQ(run(std::string(ATTNLAB_EXE) + " generate --experiment '" + dir + "/g.json' --out '" + dir +
                    "/out' --no-bandwidth",
                &output),
            0)
      << output;
  ASSERT_EQ(run(kPython + " " + kSource + "/scripts/generation_report.py '" + dir + "/out'", &output), 0) << output;
  const std::string md = read_text_file(dir + "/out/report.md");
  EXPECT_NE(md.find("| mha | 8/8 | f32 | 203 | 2048 |"), std::string::npos) << md;  // 8 heads x 64 x 4 B
  EXPECT_NE(md.find("| mqa | 8/1 | f32 | 703 | 256 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| mqa | 703 |"), std::string::npos) << md;  // speed-up row, bytes ratio 8x
  EXPECT_NE(md.find("| 8.0x |"), std::string::npos) << md;
  expect_png(dir + "/out/generation_time.png");
  expect_png(dir + "/out/generation_bytes.png");
}

}  // namespace
}  // namespace attnlab::bench
