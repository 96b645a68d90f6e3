// The sweep runner on tiny shapes: every point is decided and written, a stopped sweep
// resumes without re-running or losing points, shards merge back into the whole plan,
// disagreeing kernels are recorded as failed (never timed), and skips carry their reason.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "attnlab/npy.hpp"
#include "bench/files.hpp"
#include "bench/bench_point.hpp"
#include "bench/results.hpp"
#include "bench/sweep.hpp"

namespace attnlab::bench {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

// naive with one output value perturbed: must be caught by the pre-timing verification.
class Broken final : public Kernel {
 public:
  std::string_view name() const override { return "broken"; }
  std::string_view description() const override { return "test: naive with O[0,0,0,0] off by 0.01"; }
  size_t workspace_bytes(const Problem& p, int t) const override { return find_kernel("naive")->workspace_bytes(p, t); }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    find_kernel("naive")->run(p, in, out, ctx);
    out.o.row(0, 0, 0)[0] += 0.01f;
  }
};

// A kernel that supports nothing.
class Picky final : public Kernel {
 public:
  std::string_view name() const override { return "picky"; }
  std::string_view description() const override { return "test: supports no problem"; }
  Support supports(const Problem&) const override { return Support::no("test kernel supports nothing"); }
  void run(const Problem&, const Inputs&, const Outputs&, RunContext&) const override {}
};

const Broken kBroken;
const Picky kPicky;

std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/attn_sweep_" + name;
  fs::remove_all(d);
  return d;
}

// A peak file so the tests do not spend time measuring the machine.
std::string peak_file() {
  const std::string path = ::testing::TempDir() + "/attn_sweep_peak.json";
  Json rows = Json::array();
  for (int t : {1, 2}) {
    rows.push_back({{"threads", t}, {"fma_flops", 1e11 * t}, {"read_bytes", 1e10}, {"exp_per_s", 1e9}});
  }
  const Json j = {{"schema", "attnlab-peak-1"}, {"simd_arch", "test"}, {"lanes", 16}, {"exp_function", "test"},
                  {"buffer_bytes", 0},           {"repeats", 1},        {"rows", rows}};
  write_file_atomic(path, j.dump());
  return path;
}

struct SweepRun : ::testing::Test {
  std::vector<const Kernel*> kernels = {find_kernel("naive"), find_kernel("blocked"), &kBroken, &kPicky};
  std::vector<std::string> names = {"naive", "blocked", "broken", "picky"};
  std::ostringstream log;

  Experiment experiment(const std::string& extra = "") {
    const std::string doc = R"({"description": "tiny", "implementations": ["naive", "blocked"],
        "q_heads": 2, "q_len": [8, 16, 32], "head_dim": 16, "causal": [false, true], "threads": [1, 2],
        "repetitions": 2, "min_time_s": 0.001, "time_cap_s": 30)" + extra + "}";
    return parse_experiment(Json::parse(doc), "tiny", names);
  }
  SweepOptions options(const std::string& dir) {
    SweepOptions o;
    o.out_dir = dir;
    o.kernels = kernels;
    o.peak_json = peak_file();
    o.all_threads = 2;
    o.progress = &log;
    return o;
  }
  static std::map<std::string, std::string> point_files(const std::string& dir) {
    std::map<std::string, std::string> out;
    for (const auto& f : list_files(points_dir(dir), ".json")) out[f] = read_text_file(points_dir(dir) + "/" + f);
    return out;
  }
  static std::vector<std::string> csv_lines(const std::string& dir) {
    std::istringstream in(read_text_file(dir + "/results.csv"));
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    return lines;
  }
};

TEST_F(SweepRun, SweepWritesEveryPointAndTheTidyOutputs) {
  const std::string dir = fresh_dir("full");
  const Experiment e = experiment();
  const SweepSummary s = run_sweep(e, options(dir));
  const size_t planned = 2 * 3 * 2 * 2;
  EXPECT_EQ(s.planned, planned);
  EXPECT_EQ(s.ok, planned) << log.str();
  EXPECT_EQ(s.failed + s.skipped + s.remaining, 0u);
  EXPECT_EQ(point_files(dir).size(), planned);
  const auto lines = csv_lines(dir);
  ASSERT_EQ(lines.size(), planned + 1);
  EXPECT_EQ(lines[0].rfind("experiment,id,kernel,status,reason,", 0), 0u);
  for (size_t i = 1; i < lines.size(); ++i) EXPECT_NE(lines[i].find(",ok,"), std::string::npos) << lines[i];

  const Json bench = Json::parse(read_text_file(dir + "/bench.json"));
  ASSERT_TRUE(bench.contains("context"));
  EXPECT_EQ(bench["context"]["attnlab_experiment"], "tiny");
  // Two repetitions per point plus Google Benchmark's aggregates (mean, median, stddev, cv).
  size_t iteration_runs = 0;
  for (const auto& b : bench["benchmarks"]) {
    if (b["run_type"] == "iteration") ++iteration_runs;
    EXPECT_TRUE(b.contains("flops_per_second"));
    EXPECT_TRUE(b.contains("peak_fraction"));
  }
  EXPECT_EQ(iteration_runs, planned * 2);

  const Json machine = Json::parse(read_text_file(dir + "/machine.json"));
  for (const char* k : {"cpu_model", "cores", "isa", "compiler", "flags", "libraries", "git", "peaks"}) {
    EXPECT_TRUE(machine.contains(k)) << k;
  }
  for (const auto& pf : read_points(dir)) {
    EXPECT_EQ(pf.record.verdict, "PASS");
    EXPECT_EQ(pf.record.times.size(), 2u);
    EXPECT_GT(pf.record.peak_flops, 0);
    EXPECT_GT(pf.record.verify_rows, 0);
  }
}

TEST_F(SweepRun, StoppedSweepResumesWithoutLosingOrRepeatingPoints) {
  const std::string dir = fresh_dir("resume");
  const Experiment e = experiment();
  SweepOptions o = options(dir);
  o.stop_after = 5;
  const SweepSummary first = run_sweep(e, o);
  EXPECT_EQ(first.ok, 5u);
  EXPECT_EQ(first.remaining, first.planned - 5);
  const auto before = point_files(dir);
  ASSERT_EQ(before.size(), 5u);
  EXPECT_EQ(csv_lines(dir).size(), 6u) << "the CSV is current after every point";

  // Without --resume the folder is refused, untouched.
  EXPECT_THROW(run_sweep(e, options(dir)), InvalidInput);
  EXPECT_EQ(point_files(dir), before);

  // A leftover temp file of a killed atomic write is not a point.
  std::ofstream(points_dir(dir) + "/x.json.tmp.123") << "{garbage";

  o.stop_after = 0;
  o.resume = true;
  const SweepSummary second = run_sweep(e, o);
  EXPECT_EQ(second.already, 5u);
  EXPECT_EQ(second.ok, second.planned - 5);
  const auto after = point_files(dir);
  EXPECT_EQ(after.size(), second.planned);
  for (const auto& [name, text] : before) EXPECT_EQ(after.at(name), text) << name << " was re-run";
  EXPECT_EQ(csv_lines(dir).size(), second.planned + 1);

  // A point file that cannot be read is run again on resume.
  const std::string victim = points_dir(dir) + "/" + before.begin()->first;
  std::ofstream(victim, std::ios::trunc) << "{not json";
  const SweepSummary third = run_sweep(e, o);
  EXPECT_EQ(third.ok, 1u);
  EXPECT_NO_THROW(PointRecord::from_json(Json::parse(read_text_file(victim))["record"]));

  // Resuming with a different experiment is refused.
  EXPECT_THROW(run_sweep(experiment(R"(, "seed": 9)"), o), InvalidInput);
}

TEST_F(SweepRun, ShardsPartitionThePlanAndMergeBack) {
  const Experiment e = experiment();
  std::vector<std::string> dirs;
  std::set<std::string> ids;
  size_t total = 0;
  for (int i = 0; i < 3; ++i) {
    dirs.push_back(fresh_dir("shard" + std::to_string(i)));
    SweepOptions o = options(dirs.back());
    o.shard_index = i;
    o.shard_count = 3;
    const SweepSummary s = run_sweep(e, o);
    total += s.planned;
    for (const auto& [name, text] : point_files(dirs.back())) EXPECT_TRUE(ids.insert(name).second) << name << " in two shards";
  }
  EXPECT_EQ(total, expand(e, 2).size());
  EXPECT_EQ(ids.size(), total);

  const std::string merged = fresh_dir("merged");
  EXPECT_EQ(merge_results(merged, dirs), total);
  EXPECT_EQ(point_files(merged).size(), total);
  EXPECT_EQ(csv_lines(merged).size(), total + 1);
  const Json machine = Json::parse(read_text_file(merged + "/machine.json"));
  EXPECT_EQ(machine["shards"].size(), 3u);

  // Shards of another experiment do not merge.
  const std::string other = fresh_dir("other");
  SweepOptions o = options(other);
  o.stop_after = 1;
  run_sweep(experiment(R"(, "seed": 5)"), o);
  EXPECT_THROW(merge_results(fresh_dir("merged2"), {dirs[0], other}), InvalidInput);
  EXPECT_THROW(parse_shard("3/3"), InvalidInput);
  EXPECT_THROW(parse_shard("1"), InvalidInput);
  EXPECT_EQ(parse_shard("2/8"), (std::pair<int, int>{2, 8}));
}

TEST_F(SweepRun, DisagreeingKernelIsFailedNotTimed) {
  const std::string dir = fresh_dir("broken");
  const Experiment e = parse_experiment(
      Json::parse(R"({"description": "d", "implementations": ["broken", "picky"], "q_len": 16, "q_heads": 2,
                      "head_dim": 16, "threads": 1, "repetitions": 2, "min_time_s": 0.001})"),
      "broken", names);
  const SweepSummary s = run_sweep(e, options(dir));
  EXPECT_EQ(s.failed, 1u);
  EXPECT_EQ(s.skipped, 1u);
  for (const auto& pf : read_points(dir)) {
    if (pf.record.kernel == "broken") {
      EXPECT_EQ(pf.record.status, PointStatus::Failed);
      EXPECT_EQ(pf.record.verdict, "FAIL");
      EXPECT_NE(pf.record.reason.find("disagrees"), std::string::npos) << pf.record.reason;
      EXPECT_TRUE(pf.record.times.empty());
      EXPECT_TRUE(pf.gbench_runs.empty()) << "a failed point is never timed";
    } else {
      EXPECT_EQ(pf.record.status, PointStatus::Skipped);
      EXPECT_NE(pf.record.reason.find("unsupported: test kernel supports nothing"), std::string::npos);
    }
  }
  EXPECT_NE(read_text_file(dir + "/results.csv").find(",failed,"), std::string::npos);
}

TEST_F(SweepRun, MemoryBudgetAndTimeCapSkipWithReasons) {
  const std::string dir = fresh_dir("caps");
  SweepSummary s = run_sweep(experiment(R"(, "memory_budget_mib": 0.001)"), options(dir));
  EXPECT_EQ(s.skipped, s.planned);
  for (const auto& pf : read_points(dir)) {
    EXPECT_NE(pf.record.reason.find("memory: needs"), std::string::npos) << pf.record.reason;
    EXPECT_GT(pf.record.memory_bytes, 0u);
  }

  const std::string dir2 = fresh_dir("caps2");
  s = run_sweep(experiment(R"(, "time_cap_s": 1e-9)"), options(dir2));
  EXPECT_EQ(s.skipped, s.planned);
  for (const auto& pf : read_points(dir2)) {
    EXPECT_NE(pf.record.reason.find("time cap"), std::string::npos) << pf.record.reason;
  }
}

TEST(SweepEstimate, RateBookUsesTheLargestPointAndFallsBack) {
  RateBook rates;
  Problem p;
  p.q_len = p.kv_len = 64;
  p.head_dim = 16;
  const BenchPoint pt{find_kernel("naive"), p, 1};
  std::string basis;
  EXPECT_DOUBLE_EQ(rates.estimate_seconds(pt, &basis), p.flops() / RateBook::kDefaultRate);
  EXPECT_NE(basis.find("nothing measured"), std::string::npos);
  rates.record("blocked", 1, 1e6, 1e-3);  // 1 GFLOP/s
  rates.record("blocked", 1, 1e3, 1e-3);  // smaller point: ignored
  EXPECT_DOUBLE_EQ(rates.estimate_seconds(pt, &basis), p.flops() / 1e9);
  EXPECT_NE(basis.find("slowest"), std::string::npos);
  rates.record("naive", 2, 1e6, 1e-2);
  EXPECT_DOUBLE_EQ(rates.estimate_seconds(pt), p.flops() / 1e8);
  rates.record("naive", 1, 1e6, 1e-4);
  EXPECT_DOUBLE_EQ(rates.estimate_seconds(pt), p.flops() / 1e10);

  TimingOptions t;
  t.repetitions = 3;
  t.min_time_s = 0.5;
  EXPECT_DOUBLE_EQ(estimate_point_seconds(2.0, t, true), 2.0 + 3 * 2.0 + 0.5);
  EXPECT_DOUBLE_EQ(estimate_point_seconds(0.1, t, false), 3 * 0.5 + 0.1);
}

}  // namespace
}  // namespace attnlab::bench
