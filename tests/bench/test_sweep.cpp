// The sweep runner on tiny shapes: every point is decided and written, a stopped sweep
// resumes without re-running or losing points, shards merge back into the whole plan,
// disagreeing kernels are recorded as failed (never timed), and skips carry their reason.
// Robustness: non-finite errors survive write -> load -> merge -> resume, --resume picks
// the newest folder and refuses another build, a point the process died on is recorded as
// failed (not retried), the memory estimate covers what verification allocates, and a
// failed write is an I/O error (exit code 4), not bad input.
#include "cpu/dispatch/isa_internal.hpp"
#include "cpu/dispatch/target.hpp"
#include "sweep_fixture.hpp"

namespace attnlab::bench {
namespace {

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
  EXPECT_EQ(lines[0].rfind("experiment,id,kernel,isa,status,reason,model,", 0), 0u);
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
    EXPECT_EQ(pf.record.isa, "baseline") << "naive and blocked are built once";
    EXPECT_EQ(pf.record.verdict, "PASS");
    EXPECT_EQ(pf.record.times.size(), 2u);
    EXPECT_GT(pf.record.peak_flops, 0);
    EXPECT_GT(pf.record.verify_rows, 0);
  }
}

// bench.json names carry the point, not the timing settings, and each point is its own family:
// two sweeps with different repetitions and min_time line up in Google Benchmark's compare.py
// (Debian's libbenchmark-tools; needs python3-scipy), point by point.
TEST_F(SweepRun, BenchJsonNamesAreStableAcrossTimingSettings) {
  const std::string a = fresh_dir("gb_a"), b = fresh_dir("gb_b");
  const std::string shape = R"({"description": "d", "implementations": ["naive", "blocked"], "q_heads": 2,
      "q_len": [8, 16], "head_dim": 16, "threads": 1, )";
  ASSERT_EQ(run_sweep(parse_experiment(Json::parse(shape + R"("repetitions": 2, "min_time_s": 0.001})"), "gb", names),
                      options(a))
                .ok,
            4u)
      << log.str();
  ASSERT_EQ(run_sweep(parse_experiment(Json::parse(shape + R"("repetitions": 3, "min_time_s": 0.002})"), "gb", names),
                      options(b))
                .ok,
            4u)
      << log.str();
  std::set<std::string> names_a, names_b;
  std::set<int64_t> families;
  for (const auto& [dir, set] : {std::pair{a, &names_a}, std::pair{b, &names_b}}) {
    const Json bench = Json::parse(read_text_file(dir + "/bench.json"));
    EXPECT_EQ(bench["context"]["attnlab_repetitions"], dir == a ? 2 : 3);
    for (const auto& r : bench["benchmarks"]) {
      const std::string n = r["name"];
      EXPECT_EQ(n.find("min_time"), std::string::npos) << n;
      EXPECT_EQ(n.find("repeats"), std::string::npos) << n;
      if (r["run_type"] == "iteration") set->insert(n), families.insert(r["family_index"].get<int64_t>());
    }
  }
  EXPECT_EQ(names_a, names_b);
  EXPECT_EQ(names_a.size(), 4u);
  EXPECT_EQ(families, (std::set<int64_t>{0, 1, 2, 3}));  // one family per point, in plan order
  const std::string compare = "/usr/share/benchmark/compare.py";
  if (!fs::exists(compare) || std::system("/usr/bin/python3 -c 'import scipy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << compare << " or scipy missing (scripts/setup.sh installs libbenchmark-tools, python3-scipy)";
  }
  const std::string out = ::testing::TempDir() + "/attn_gb_compare.txt";
  ASSERT_EQ(std::system(("/usr/bin/python3 " + compare + " benchmarks " + a + "/bench.json " + b + "/bench.json > " +
                         out + " 2>&1")
                            .c_str()),
            0)
      << read_text_file(out);
  const std::string text = read_text_file(out);
  for (const std::string& n : names_a) EXPECT_NE(text.find(n), std::string::npos) << n << " not lined up:\n" << text;
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

// "rounds": every timed point once per pass, passes in turn (so two points compared with each
// other saw the same host), the record holding every pass's repetitions and bench.json's
// aggregates recomputed over them; a sweep stopped between passes resumes the passes it lacks.
TEST_F(SweepRun, RoundsTimeEveryPointOncePerPassAndResume) {
  const std::string dir = fresh_dir("rounds");
  const Experiment e = experiment(R"(, "rounds": 3)");
  ASSERT_EQ(e.rounds, 3);
  SweepOptions o = options(dir);
  const size_t planned = 2 * 3 * 2 * 2;
  o.stop_after = static_cast<int>(planned) + 5;  // the first pass and 5 points of the second
  const SweepSummary first = run_sweep(e, o);
  EXPECT_EQ(first.ok, planned) << log.str();
  EXPECT_EQ(first.remaining, 0u);
  EXPECT_EQ(first.passes_remaining, 2 * planned - 5);
  // Pass 2 starts after the last point's first pass.
  const std::string text = log.str();
  const size_t last_first = text.rfind("[" + std::to_string(planned) + "/" + std::to_string(planned) + "]");
  ASSERT_NE(last_first, std::string::npos) << text;
  const size_t pass_two = text.find("[pass 2/3]");
  ASSERT_NE(pass_two, std::string::npos) << text;
  EXPECT_GT(pass_two, last_first);
  std::map<std::string, std::vector<double>> pass_one;
  size_t with_two = 0;
  for (const auto& pf : read_points(dir)) {
    EXPECT_EQ(pf.record.times.size(), 2u * pf.record.rounds);
    with_two += pf.record.rounds == 2;
    pass_one[pf.record.id] = {pf.record.times.begin(), pf.record.times.begin() + 2};
  }
  EXPECT_EQ(with_two, 5u);

  o.stop_after = 0;
  o.resume = true;
  const SweepSummary second = run_sweep(e, o);
  EXPECT_EQ(second.already, planned);
  EXPECT_EQ(second.passes_remaining, 0u);
  const auto lines = csv_lines(dir);
  ASSERT_EQ(lines.size(), planned + 1);
  const std::string header = lines[0];
  EXPECT_NE(header.find(",repetitions,rounds,iterations,"), std::string::npos) << header;
  for (size_t i = 1; i < lines.size(); ++i) EXPECT_NE(lines[i].find(",6,3,"), std::string::npos) << lines[i];

  const Json bench = Json::parse(read_text_file(dir + "/bench.json"));
  std::map<std::string, std::vector<double>> real;
  std::map<std::string, std::set<int>> passes;
  for (const auto& b : bench["benchmarks"]) {
    if (b["run_type"] != "iteration") continue;
    real[b["name"]].push_back(b["real_time"].get<double>());
    passes[b["name"]].insert(b["attnlab_round"].get<int>());
    EXPECT_EQ(b["repetitions"], 6);
  }
  ASSERT_EQ(real.size(), planned);
  for (const auto& b : bench["benchmarks"]) {
    if (b["run_type"] != "aggregate" || b["aggregate_name"] != "median") continue;
    std::string name = b["name"];
    name = name.substr(0, name.size() - std::string("_median").size());
    ASSERT_EQ(real[name].size(), 6u) << name;
    EXPECT_EQ(passes[name], (std::set<int>{1, 2, 3})) << name;
    EXPECT_DOUBLE_EQ(b["real_time"].get<double>(), median(real[name])) << name;
    EXPECT_EQ(b["repetitions"], 6);
  }
  for (const auto& pf : read_points(dir)) {
    EXPECT_EQ(pf.record.rounds, 3);
    ASSERT_EQ(pf.record.times.size(), 6u);
    EXPECT_EQ(std::vector<double>(pf.record.times.begin(), pf.record.times.begin() + 2), pass_one[pf.record.id])
        << pf.record.id << ": the first pass's times are kept";
  }
}

// A memory-bound point (FLOP per byte under the ridge of the peaks: here 1e11 / 1e10 = 10) measures
// the read bandwidth before and after each pass of its repetitions; a compute-bound one does not.
TEST_F(SweepRun, MemoryBoundPointsMeasureTheReadBandwidthBesideThem) {
  const std::string dir = fresh_dir("probe");
  const Experiment e =
      parse_experiment(Json::parse(R"({"description": "d", "implementations": ["naive"], "q_heads": 2, "head_dim": 32,
                      "grids": [{"q_len": 1, "kv_len": 256}, {"q_len": 128, "kv_len": 128}],
                      "threads": 1, "repetitions": 2, "rounds": 2, "min_time_s": 0.001})"),
                       "probe", names);
  const SweepSummary sum = run_sweep(e, options(dir));
  ASSERT_EQ(sum.ok, 2u) << log.str();
  bool decode = false;
  for (const auto& pf : read_points(dir)) {
    const PointRecord& r = pf.record;
    const double intensity = r.problem.flops() / r.problem.bytes_moved();
    if (r.problem.q_len == 1) {
      decode = true;
      ASSERT_LT(intensity, 10) << "the decode shape is memory-bound under these peaks";
      ASSERT_EQ(r.read_probe.size(), 4u) << "before and after each of the 2 passes";
      for (double b : r.read_probe) EXPECT_GT(b, 1e8) << "bytes/s of a real read";
    } else {
      ASSERT_GT(intensity, 10);
      EXPECT_TRUE(r.read_probe.empty()) << "a compute-bound point runs no probe";
    }
  }
  ASSERT_TRUE(decode);
  const auto lines = csv_lines(dir);
  const auto header = test::split_csv(lines[0]);
  const auto col = [&](const std::string& name) {
    const auto at = std::find(header.begin(), header.end(), name);
    EXPECT_NE(at, header.end()) << name;
    return static_cast<size_t>(at - header.begin());
  };
  for (size_t i = 1; i < lines.size(); ++i) {
    const auto row = test::split_csv(lines[i]);
    const bool dec = row[col("q_len")] == "1";
    EXPECT_EQ(row[col("probes")], dec ? "4" : "0");
    for (const char* c : {"probe_read_gbs_min", "probe_read_gbs_median", "probe_read_gbs_max",
                          "bw_fraction_probe_median", "bw_fraction_probe_best"}) {
      EXPECT_EQ(row[col(c)].empty(), !dec) << c << " in " << lines[i];
    }
    if (dec) {
      EXPECT_LE(std::stod(row[col("probe_read_gbs_min")]), std::stod(row[col("probe_read_gbs_median")]));
      EXPECT_LE(std::stod(row[col("probe_read_gbs_median")]), std::stod(row[col("probe_read_gbs_max")]));
      EXPECT_LE(std::stod(row[col("bw_fraction_probe_best")]), std::stod(row[col("bw_fraction_probe_median")]));
    }
  }
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
    for (const auto& [name, text] : point_files(dirs.back()))
      EXPECT_TRUE(ids.insert(name).second) << name << " in two shards";
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

// The pass axis: a backward point times the backward alone (forward_backward both), counts 2.5x
// (3.5x) the forward's FLOPs, checks dQ, dK, dV on sampled rows and keys (a wrong dK fails the
// point untimed), and a kernel without a backward pass is skipped naming those that have one.
TEST_F(SweepRun, BackwardPassPointsVerifyTheGradientsAndCountTheirFlops) {
  const std::string dir = fresh_dir("backward");
  const Experiment e = parse_experiment(
      Json::parse(R"({"description": "d", "implementations": ["naive", "blocked", "brokengrad"], "q_len": 70,
                      "kv_len": 90, "q_heads": 4, "gqa_groups": 2, "head_dim": 16, "causal": [false, true],
                      "pass": ["forward", "backward", "forward_backward"], "threads": 2, "repetitions": 1,
                      "min_time_s": 0.001, "verify_rows": 16})"),
      "backward", names);
  const SweepSummary s = run_sweep(e, options(dir));
  EXPECT_EQ(s.planned, 3u * 2 * 3);
  std::map<std::string, double> forward_flops;
  for (const auto& pf : read_points(dir)) {
    const PointRecord& r = pf.record;
    const Problem& p = r.problem;
    const std::string what = r.id + ": " + r.reason;
    if (p.pass == Pass::Forward) {
      EXPECT_EQ(r.id.find("forward"), std::string::npos) << "a forward point keeps its old id: " << r.id;
      EXPECT_EQ(r.status, PointStatus::Ok) << what;
      continue;
    }
    EXPECT_NE(r.id.find(p.pass == Pass::Backward ? "-t2-backward" : "-t2-forward_backward"), std::string::npos) << r.id;
    EXPECT_DOUBLE_EQ(p.flops(), (p.pass == Pass::Backward ? 2.5 : 3.5) * p.forward_flops());
    if (r.kernel == "blocked") {
      EXPECT_EQ(r.status, PointStatus::Skipped) << what;
      EXPECT_NE(r.reason.find("blocked has no backward pass; allowed: naive, flash"), std::string::npos) << what;
    } else if (r.kernel == "brokengrad") {
      EXPECT_EQ(r.status, PointStatus::Failed) << what;
      EXPECT_NE(r.reason.find("gradients disagree with the float64 reference: dK error"), std::string::npos) << what;
      EXPECT_TRUE(r.times.empty());
    } else {
      EXPECT_EQ(r.status, PointStatus::Ok) << what;
      EXPECT_EQ(r.times.size(), 1u);
      for (double err : {r.err_grad.dq, r.err_grad.dk, r.err_grad.dv}) {
        EXPECT_GT(err, 0) << what;  // measured: small, not zero
        EXPECT_LT(err, 1e-5) << what;
      }
      EXPECT_GT(r.tol_grad.dk, Tolerance::kFloor) << what;
    }
  }
  const std::string csv = read_text_file(dir + "/results.csv");
  for (const char* col : {",pass,", ",err_dq,", ",err_dk,", ",err_dv,", ",tol_dq,"})
    EXPECT_NE(csv.find(col), std::string::npos) << col;
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

// A kernel's first point is not skipped on a constant rate: nothing measured for it, the
// estimate is the least time at the machine's measured peak, and the point's first call (its
// verification) measures it; the cap then applies to what that call took.
TEST_F(SweepRun, FirstPointOfAKernelIsEstimatedFromThePeakNotAConstant) {
  const std::string dir = fresh_dir("first_point");
  // 8.4 MFLOP: 8 ms at the 1 GFLOP/s constant (over the cap), 42 us at the file's 200 GFLOP/s.
  const Experiment e = parse_experiment(
      Json::parse(R"({"description": "one point", "implementations": ["naive"], "q_heads": 2, "q_len": 256,
                      "head_dim": 16, "threads": 2, "repetitions": 1, "min_time_s": 0.001, "time_cap_s": 0.01})"),
      "one", names);
  ASSERT_GT(estimate_point_seconds(
                RateBook().estimate_seconds(BenchPoint{find_kernel("naive"), expand(e, 2)[0].problem, 2, {}}),
                TimingOptions{1, 0.001}, true),
            e.time_cap_s)
      << "the constant's estimate must exceed the cap, or this test shows nothing";
  run_sweep(e, options(dir));
  const auto points = read_points(dir);
  ASSERT_EQ(points.size(), 1u);
  const PointRecord& r = points[0].record;
  EXPECT_EQ(r.reason.find("nothing measured"), std::string::npos) << r.reason;
  EXPECT_TRUE(r.status == PointStatus::Ok || r.reason.find("verified, but") != std::string::npos)
      << "run, or capped on its own measured call: " << r.reason;
  EXPECT_EQ(r.verify_rows > 0, true) << "the call was made: " << r.reason;
}

// Peaks of every built target: FMA 1, 2, 3... GFLOP/s per thread in build order, read
// bandwidth 10, 11, 12... GB/s; the default target is default_isa(), its rows with a bf16
// dot-product peak of 5 GFLOP/s and an AMX bf16 peak of 70 GFLOP/s per thread.
std::string per_target_peak_file() {
  const std::string path = ::testing::TempDir() + "/attn_sweep_peak_targets.json";
  Json targets = Json::array();
  for (size_t i = 0; i < built_isas().size(); ++i) {
    Json rows = Json::array();
    for (int t : {1, 2}) {
      rows.push_back({{"threads", t},
                      {"fma_flops", 1e9 * static_cast<double>(i + 1) * t},
                      {"read_bytes", 1e10 + 1e9 * static_cast<double>(i)},
                      {"exp_per_s", 1e9}});
      if (built_isas()[i] == default_isa())
        rows.back()["bf16_dot_flops"] = 5e9 * t, rows.back()["amx_bf16_flops"] = 7e10 * t;
    }
    targets.push_back({{"isa", built_isas()[i]}, {"lanes", 1}, {"fma_chains", 1}, {"rows", rows}});
  }
  const Json j = {{"schema", "attnlab-peak-2"},
                  {"simd_arch", default_isa()},
                  {"exp_function", "test"},
                  {"buffer_bytes", 0},
                  {"repeats", 1},
                  {"targets", targets}};
  write_file_atomic(path, j.dump());
  return path;
}

// The isa axis through the registry, as `attnlab sweep` runs it: flash once per built
// target, naive once; each row records its target and its own target's peak; a target this
// CPU cannot run is skipped with that reason, not failed; a stopped sweep resumes.
TEST(SweepIsa, EveryTargetRunsOrIsSkippedWithTheReason) {
  const std::string dir = fresh_dir("isa");
  Json doc = Json::parse(R"({"description": "d", "implementations": ["naive", "flash"], "q_heads": 2,
                             "q_len": 8, "head_dim": 16, "threads": 1, "repetitions": 1, "min_time_s": 0.001})");
  doc["isa"] = built_isas();
  const Experiment e = parse_experiment(doc, "isa", registry_kernel_names());
  std::ostringstream log;
  SweepOptions o;
  o.out_dir = dir;
  o.peak_json = per_target_peak_file();
  o.all_threads = 2;
  o.progress = &log;
  o.stop_after = 2;
  const SweepSummary first = run_sweep(e, o);
  EXPECT_EQ(first.planned, 1 + built_isas().size());
  EXPECT_EQ(first.remaining, first.planned - 2);
  o.stop_after = 0;
  o.resume = true;
  const SweepSummary second = run_sweep(e, o);
  EXPECT_EQ(second.already, 2u);
  EXPECT_EQ(second.failed, 0u) << log.str();

  const Peaks peaks = Peaks::from_json(Json::parse(read_text_file(o.peak_json)));
  const double default_read = peaks.at(default_isa(), 1)->read_bytes;
  size_t skipped = 0, seen = 0;
  for (const PointFile& pf : read_points(dir)) {
    const PointRecord& r = pf.record;
    SCOPED_TRACE(r.id);
    ++seen;
    EXPECT_DOUBLE_EQ(r.peak_read_bytes, default_read) << "read bandwidth: the default target's";
    if (r.kernel == "naive") {
      EXPECT_EQ(r.isa, "baseline");
      EXPECT_EQ(r.id, "naive-b1-hq2-hkv2-sq8-sk8-d16-none-t1");
      EXPECT_DOUBLE_EQ(r.peak_flops, peaks.at(default_isa(), 1)->fma_flops) << "built once: the default target's";
      EXPECT_EQ(r.status, PointStatus::Ok);
      continue;
    }
    EXPECT_EQ(r.id, "flash-b1-hq2-hkv2-sq8-sk8-d16-none-t1-" + r.isa);
    EXPECT_EQ(r.name, "attn/flash/b:1/hq:2/hkv:2/sq:8/sk:8/d:16/mask:none/t:1/isa:" + r.isa);
    EXPECT_DOUBLE_EQ(r.peak_flops, peaks.at(r.isa, 1)->fma_flops) << "% of peak: the row's own target";
    if (cpu_runs_isa(r.isa)) {
      EXPECT_EQ(r.status, PointStatus::Ok) << r.reason;
      EXPECT_EQ(r.verdict, "PASS");
    } else {
      ++skipped;
      EXPECT_EQ(r.status, PointStatus::Skipped);
      EXPECT_NE(r.reason.find("unavailable: this CPU cannot run " + r.isa + "; it runs "), std::string::npos)
          << r.reason;
    }
  }
  EXPECT_EQ(seen, first.planned);
  EXPECT_EQ(skipped, built_isas().size() - runnable_isas().size());
  EXPECT_EQ(first.skipped + second.skipped, skipped);
  // The CSV names the target of every row.
  const std::string csv = read_text_file(dir + "/results.csv");
  for (const auto& t : built_isas()) EXPECT_NE(csv.find(",flash," + t + ","), std::string::npos) << t;
  EXPECT_NE(csv.find(",naive,baseline,ok,"), std::string::npos) << csv;
  EXPECT_NE(log.str().find("flash[" + runnable_isas().front() + "] b1"), std::string::npos) << log.str();
}

// Peaks per target: schema 2 round-trips; schema 1 (machine.json before the isa axis) reads
// as one target, the one its simd_arch names; Peaks::ref is the one rule for % of peak.
// attnlab peak says when its runs of one figure disagree by more than 20% of their median.
TEST(SweepPeaks, PeakWarnsWhenItsRunsDisagree) {
  EXPECT_FALSE(runs_disagree({20e9, 22e9, 21e9}));
  EXPECT_FALSE(runs_disagree({20e9}));
  EXPECT_TRUE(runs_disagree({43.4e9, 45.2e9, 69.8e9})) << "a sweep's peak runs on the issue's Zen 5";
  Peaks p = Peaks::from_json(Json::parse(read_text_file(per_target_peak_file())));
  const auto warnings = [](const Peaks& x) {
    const std::string text = format_peaks(x);
    size_t n = 0;
    for (size_t at = text.find("warning:"); at != std::string::npos; at = text.find("warning:", at + 1)) ++n;
    return std::pair{n, text};
  };
  EXPECT_EQ(warnings(p).first, 0u) << warnings(p).second;
  PeakAtThreads& row = p.targets.front().rows.front();
  row.read_runs = {43.4e9, 45.2e9, 69.8e9};
  const auto [n, text] = warnings(p);
  EXPECT_EQ(n, 1u) << text;
  EXPECT_NE(text.find("read at " + std::to_string(row.threads) +
                      " threads: runs disagree by 58% of their median "
                      "(43.4-69.8)"),
            std::string::npos)
      << text;
}

TEST(SweepPeaks, PerTargetPeaksRoundTripAndOldFilesRead) {
  const Peaks p2 = Peaks::from_json(Json::parse(read_text_file(per_target_peak_file())));
  ASSERT_EQ(p2.targets.size(), built_isas().size());
  const Json again = p2.to_json();
  EXPECT_EQ(again["schema"], "attnlab-peak-2");
  EXPECT_EQ(Peaks::from_json(again).to_json(), again);
  // The default target's figures also where schema 1 kept them.
  EXPECT_EQ(again["simd_arch"], default_isa());
  EXPECT_EQ(again["rows"],
            again["targets"][std::distance(
                built_isas().begin(), std::find(built_isas().begin(), built_isas().end(), default_isa()))]["rows"]);
  const std::string narrow = built_isas().front();
  EXPECT_DOUBLE_EQ(p2.ref(narrow, 2).flops, 2e9) << "the narrowest target: 1 GFLOP/s per thread";
  EXPECT_DOUBLE_EQ(p2.ref("baseline", 2).flops, p2.at(default_isa(), 2)->fma_flops);
  // CUDA points: the GPU's FP32 peak and bandwidth, never the CPU's (0 = no device: no fraction).
  EXPECT_DOUBLE_EQ(p2.ref("cuda", 1).flops, 0);
  EXPECT_DOUBLE_EQ(p2.ref("cuda", 1).read_bytes, 0);
  EXPECT_FALSE(p2.to_json().contains("gpu"));
  Peaks pg = p2;
  pg.gpu = GpuPeaks{"Test GPU", 6.0e13, 4.8e12};
  EXPECT_DOUBLE_EQ(pg.ref("cuda", 2).flops, 6.0e13);
  EXPECT_DOUBLE_EQ(pg.ref("cuda", 2).read_bytes, 4.8e12);
  EXPECT_DOUBLE_EQ(pg.ref("baseline", 2).flops, p2.at(default_isa(), 2)->fma_flops) << "CPU points keep the CPU's";
  EXPECT_EQ(pg.flops_name("cuda"), "GPU FP32 (Test GPU)");
  const Peaks pg_back = Peaks::from_json(pg.to_json());
  EXPECT_EQ(pg_back.gpu.name, "Test GPU");
  EXPECT_DOUBLE_EQ(pg_back.gpu.fp32_flops, 6.0e13);
  EXPECT_EQ(pg_back.to_json(), pg.to_json());
  EXPECT_DOUBLE_EQ(p2.ref(narrow, 1).read_bytes, p2.at(default_isa(), 1)->read_bytes);
  EXPECT_DOUBLE_EQ(p2.ref(narrow, 3).flops, 0) << "no row for 3 threads";
  // flash_bf16's points: the bf16 dot-product peak, the default target's read bandwidth.
  EXPECT_DOUBLE_EQ(p2.ref("avx512_bf16", 2).flops, 1e10);
  EXPECT_DOUBLE_EQ(p2.ref("avx512_bf16", 2).read_bytes, p2.at(default_isa(), 2)->read_bytes);
  EXPECT_DOUBLE_EQ(p2.ref("avx512_bf16", 3).flops, 0);
  EXPECT_EQ(p2.flops_name("avx512_bf16"), "avx512_bf16 dot-product");
  EXPECT_DOUBLE_EQ(p2.ref("amx_bf16", 2).flops, 1.4e11) << "flash_amx: the AMX tile peak";
  EXPECT_EQ(p2.flops_name("amx_bf16"), "amx_bf16 tile");
  EXPECT_DOUBLE_EQ(p2.ref("amx_int8", 2).flops, 1.4e11) << "flash_int8_amx: the AMX tile peak of its P.V";
  EXPECT_EQ(p2.flops_name("amx_int8"), "amx_bf16 tile");
  EXPECT_EQ(p2.flops_name(narrow), narrow);
  EXPECT_EQ(p2.flops_name("baseline"), default_isa());

  const Json old = Json::parse(read_text_file(peak_file()));  // schema 1, simd_arch "test"
  const Peaks p1 = Peaks::from_json(old);
  ASSERT_EQ(p1.targets.size(), 1u);
  EXPECT_EQ(p1.targets[0].isa, "test");
  EXPECT_DOUBLE_EQ(p1.ref("baseline", 2).flops, 2e11);
  EXPECT_DOUBLE_EQ(p1.ref(narrow, 2).flops, 0) << "a target that was not measured has no peak";
  EXPECT_DOUBLE_EQ(p1.ref(narrow, 2).read_bytes, 1e10);
  EXPECT_TRUE(p1.covers({}, {1, 2}));
  EXPECT_FALSE(p1.covers({narrow}, {1}));
  Json bad = again;
  bad["simd_arch"] = "other";  // the default target must be one of the targets
  EXPECT_THROW(Peaks::from_json(bad), InvalidInput);
  bad = old;
  bad["schema"] = "attnlab-peak-9";
  EXPECT_THROW(Peaks::from_json(bad), InvalidInput);
}

// The int8 units: each target's vpdpbusd where the CPU has that target's VNNI (the unit decode_i8
// and flash_int8 score on), and AMX-INT8 where flash_int8_amx runs; each measures something.
TEST(SweepPeaks, Int8PeaksWhereTheCpuHasThem) {
  int measured = 0;
  for (const std::string& isa : runnable_isas()) {
    const TargetTable* t = target_table_for(isa);
    ASSERT_NE(t, nullptr);
    const double ops = peaks::measure_i8_dot_ops(1, 0.01, *t);
    const bool unit = t->peak.i8_chains && cpu_runs_isa(t->peak.i8_unit);
    EXPECT_EQ(ops > 0, unit) << isa;
    if (unit) EXPECT_GT(ops, 1e9) << isa, ++measured;
  }
  const Kernel* amx = find_kernel("flash_int8_amx");
  ASSERT_NE(amx, nullptr);
  EXPECT_EQ(peaks::amx_int8_runnable(), static_cast<bool>(amx->available())) << amx->available().reason;
  if (peaks::amx_int8_runnable()) EXPECT_GT(peaks::measure_amx_int8_ops(1, 0.01), 1e10);
  if (measured == 0 && !peaks::amx_int8_runnable()) GTEST_SKIP() << "no int8 dot-product unit on this CPU";
}

// The bf16 dot-product loop runs exactly where flash_bf16 is available, and measures something.
TEST(SweepPeaks, Bf16DotPeakWhereTheCpuHasIt) {
  const Kernel* k = find_kernel("flash_bf16");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(peaks::bf16_dot_runnable(), static_cast<bool>(k->available())) << k->available().reason;
  const double f = peaks::measure_bf16_dot_flops(1, 0.01);
  if (!peaks::bf16_dot_runnable()) {
    EXPECT_EQ(f, 0);
    GTEST_SKIP() << k->available().reason;
  }
  EXPECT_GT(f, 1e9);
  EXPECT_LT(f, 1e13);
  // The AMX tile peak, where flash_amx runs: far above the vector dot products.
  const Kernel* amx = find_kernel("flash_amx");
  ASSERT_NE(amx, nullptr);
  EXPECT_EQ(peaks::amx_bf16_runnable(), static_cast<bool>(amx->available())) << amx->available().reason;
  if (peaks::amx_bf16_runnable()) {
    EXPECT_GT(peaks::measure_amx_bf16_flops(1, 0.01), 2 * f);
  }
}

TEST(SweepEstimate, RateBookUsesTheLargestPointAndFallsBack) {
  RateBook rates;
  Problem p;
  p.q_len = p.kv_len = 64;
  p.head_dim = 16;
  const BenchPoint pt{find_kernel("naive"), p, 1, {}};
  std::string basis;
  EXPECT_DOUBLE_EQ(rates.estimate_seconds(pt, &basis), p.flops() / RateBook::kDefaultRate);
  EXPECT_NE(basis.find("nothing measured"), std::string::npos);
  // Nothing measured, the machine's peak known: the least time the call can take.
  EXPECT_DOUBLE_EQ(rates.estimate_seconds(pt, &basis, 4e11), p.flops() / 4e11);
  EXPECT_NE(basis.find("measured peak, 400.0 GFLOP/s"), std::string::npos) << basis;
  rates.record("blocked", 1, 1e6, 1e-3);  // 1 GFLOP/s
  rates.record("blocked", 1, 1e3, 1e-3);  // smaller point: ignored
  EXPECT_DOUBLE_EQ(rates.estimate_seconds(pt, &basis), p.flops() / 1e9);
  EXPECT_NE(basis.find("slowest"), std::string::npos);
  EXPECT_DOUBLE_EQ(rates.estimate_seconds(pt, &basis, 4e11), p.flops() / 4e11)
      << "another kernel's rate says nothing of this one's: the peak bound";
  rates.record("naive", 2, 1e6, 1e-2);
  EXPECT_DOUBLE_EQ(rates.estimate_seconds(pt), p.flops() / 1e8);
  rates.record("naive", 1, 1e6, 1e-4);
  EXPECT_DOUBLE_EQ(rates.estimate_seconds(pt), p.flops() / 1e10);
  // Each target of a SIMD kernel has its own rate (kernel_label: flash[scalar], flash[avx2]);
  // an ATTN_NATIVE build has one target.
  const BenchPoint narrow{find_kernel("flash", built_isas().front()), p, 1, {}};
  const BenchPoint wide{find_kernel("flash", built_isas().back()), p, 1, {}};
  EXPECT_EQ(kernel_label(*narrow.kernel), "flash[" + built_isas().front() + "]");
  rates.record(kernel_label(*narrow.kernel), 1, 1e6, 1e-2);  // 0.1 GFLOP/s
  EXPECT_DOUBLE_EQ(rates.estimate_seconds(narrow), p.flops() / 1e8);
  if (built_isas().size() > 1) {
    EXPECT_DOUBLE_EQ(rates.estimate_seconds(wide), p.flops() / 1e8) << "no rate of this target yet: the slowest";
    rates.record(kernel_label(*wide.kernel), 1, 1e6, 1e-4);  // 10 GFLOP/s
    EXPECT_DOUBLE_EQ(rates.estimate_seconds(wide), p.flops() / 1e10);
    EXPECT_DOUBLE_EQ(rates.estimate_seconds(narrow), p.flops() / 1e8);
  }

  TimingOptions t;
  t.repetitions = 3;
  t.min_time_s = 0.5;
  EXPECT_DOUBLE_EQ(estimate_point_seconds(2.0, t, true), 2.0 + 3 * 2.0 + 0.5);
  EXPECT_DOUBLE_EQ(estimate_point_seconds(0.1, t, false), 3 * 0.5 + 0.1);
}

// ---------------------------------------------------------------- robustness of results

// One CSV data row as column -> text (quoted fields hold commas; rows hold no newline).
std::map<std::string, std::string> csv_row(const std::string& csv, size_t index) {
  std::istringstream in(csv);
  std::vector<std::vector<std::string>> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(test::split_csv(line));
  std::map<std::string, std::string> out;
  EXPECT_EQ(rows.at(0).size(), rows.at(index + 1).size()) << csv;
  for (size_t i = 0; i < rows.at(0).size(); ++i) out[rows[0][i]] = rows.at(index + 1).at(i);
  return out;
}

TEST(SweepRecords, NonFiniteNumbersRoundTripExactly) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  PointRecord r;
  r.id = r.name = "p";
  r.kernel = "naive";
  r.status = PointStatus::Failed;
  r.reason = "disagrees";
  r.verdict = "FAIL";
  r.err_o_rel = inf;
  r.err_lse = nan;
  r.tol_o_rel = -inf;
  r.tol_lse = 3.814697265625e-06;
  r.peak_flops = 1.2345678901234567e11;
  r.times = {0.5, inf, nan};
  const std::string text = r.to_json().dump();
  EXPECT_EQ(text.find("null"), std::string::npos) << "JSON null loses the value: " << text;
  const PointRecord back = PointRecord::from_json(Json::parse(text));
  EXPECT_TRUE(std::isinf(back.err_o_rel) && back.err_o_rel > 0);
  EXPECT_TRUE(std::isnan(back.err_lse));
  EXPECT_TRUE(std::isinf(back.tol_o_rel) && back.tol_o_rel < 0);
  EXPECT_EQ(back.tol_lse, r.tol_lse);
  EXPECT_EQ(back.peak_flops, r.peak_flops);
  ASSERT_EQ(back.times.size(), 3u);
  EXPECT_EQ(back.times[0], 0.5);
  EXPECT_TRUE(std::isinf(back.times[1]));
  EXPECT_TRUE(std::isnan(back.times[2]));
  EXPECT_EQ(back.to_json(), r.to_json()) << "merge compares records as JSON: NaN must equal NaN";

  // Files written before the rule hold null: read as NaN, not dropped.
  Json old = r.to_json();
  old["err_o_rel"] = nullptr;
  EXPECT_TRUE(std::isnan(PointRecord::from_json(old).err_o_rel));
  old["err_lse"] = "infinity";
  try {
    PointRecord::from_json(old);
    ADD_FAILURE() << "\"infinity\" accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("err_lse"), std::string::npos) << e.what();
  }

  // The CSV writes them as Python's float() reads them; empty only where a column does not
  // apply (a failed point has no times).
  const auto row = csv_row(tidy_csv("e", {r}), 0);
  EXPECT_EQ(row.at("err_o_rel"), "inf");
  EXPECT_EQ(row.at("err_lse"), "nan");
  EXPECT_EQ(row.at("tol_o_rel"), "-inf");
  EXPECT_EQ(row.at("time_median_s"), "");
  EXPECT_EQ(row.at("gflops"), "");
}

TEST_F(SweepRun, FailedPointWithInfiniteErrorSurvivesLoadResumeAndMerge) {
  const Experiment e = parse_experiment(
      Json::parse(R"({"description": "d", "implementations": ["nanout", "naive"], "q_len": [8, 16], "q_heads": 2,
                      "head_dim": 16, "threads": 1, "repetitions": 1, "min_time_s": 0.001})"),
      "nonfinite", names);
  std::vector<std::string> dirs;
  for (int i = 0; i < 2; ++i) {
    dirs.push_back(fresh_dir("nonfinite" + std::to_string(i)));
    SweepOptions o = options(dirs.back());
    o.shard_index = i;
    o.shard_count = 2;
    const SweepSummary s = run_sweep(e, o);
    EXPECT_EQ(s.ok + s.failed, s.planned) << log.str();
    EXPECT_EQ(read_points(dirs.back()).size(), s.planned) << "a failed point must load";
    // Resuming keeps every point, failed ones included: nothing runs again.
    const auto before = point_files(dirs.back());
    o.resume = true;
    const SweepSummary again = run_sweep(e, o);
    EXPECT_EQ(again.already, again.planned);
    EXPECT_EQ(again.ok + again.failed, 0u);
    EXPECT_EQ(point_files(dirs.back()), before);
  }
  const std::string merged = fresh_dir("nonfinite_merged");
  EXPECT_EQ(merge_results(merged, dirs), 4u);
  size_t failed = 0;
  for (const auto& pf : read_points(merged)) {
    if (pf.record.kernel != "nanout") continue;
    ++failed;
    EXPECT_EQ(pf.record.status, PointStatus::Failed);
    EXPECT_TRUE(std::isinf(pf.record.err_o_rel)) << pf.record.err_o_rel;
  }
  EXPECT_EQ(failed, 2u) << "merged results lost failures";
  const std::string csv = read_text_file(merged + "/results.csv");
  size_t inf_rows = 0;
  for (size_t i = 0; i < 4; ++i) {
    const auto row = csv_row(csv, i);
    if (row.at("kernel") == "nanout") inf_rows += row.at("err_o_rel") == "inf" && row.at("status") == "failed";
  }
  EXPECT_EQ(inf_rows, 2u) << csv;
}

TEST(SweepResume, NewestFolderIsChosenByRecordedCreationThenNumerically) {
  const std::string root = fresh_dir("root");
  auto folder = [&](const std::string& name, const std::string& experiment, int64_t created, int shards = 1) {
    SweepPlan p;
    p.experiment = experiment;
    p.created_unix_ns = created;
    p.shard_count = shards;
    make_dirs(root + "/" + name);
    write_file_atomic(root + "/" + name + "/sweep.json", p.to_json().dump());
  };
  SweepOptions o;
  o.results_root = root;
  o.resume = true;
  // Folders without a recorded creation time: by date, then -N as a number (-10 after -2).
  folder("2026-01-01-tiny", "tiny", 0);
  folder("2026-01-01-tiny-2", "tiny", 0);
  folder("2026-01-01-tiny-10", "tiny", 0);
  folder("2025-12-31-tiny-11", "tiny", 0);
  EXPECT_EQ(choose_out_dir("tiny", o), root + "/2026-01-01-tiny-10");
  // A recorded creation time wins over the name.
  folder("2026-01-01-tiny-3", "tiny", 5);
  EXPECT_EQ(choose_out_dir("tiny", o), root + "/2026-01-01-tiny-3");
  // Not candidates, however new: experiment "tiny-4" (its folder looks like tiny's 4th),
  // another shard count, names that are not <date>-tiny[-N], a folder without sweep.json.
  folder("2026-01-01-tiny-4", "tiny-4", 9);
  folder("2026-01-01-tiny-shard0of2", "tiny", 10, 2);
  folder("2026-01-01-tiny-x", "tiny", 11);
  folder("2026-01-01-tiny-05", "tiny", 12);
  folder("tiny", "tiny", 13);
  folder("2026-01-01-mytiny", "tiny", 14);
  make_dirs(root + "/2026-01-01-tiny-20");
  EXPECT_EQ(choose_out_dir("tiny", o), root + "/2026-01-01-tiny-3");
  o.shard_count = 2;
  EXPECT_EQ(choose_out_dir("tiny", o), root + "/2026-01-01-tiny-shard0of2");
  // Nothing to resume: a new folder of today.
  o.shard_count = 1;
  EXPECT_EQ(choose_out_dir("other", o), root + "/" + today() + "-other");
}

TEST_F(SweepRun, ResumeWithoutOutContinuesTheNewestFolder) {
  const Experiment e = experiment();
  SweepOptions o = options("");
  o.results_root = fresh_dir("root_run");
  o.stop_after = 1;
  const std::string first = run_sweep(e, o).out_dir;
  const std::string second = run_sweep(e, o).out_dir;
  EXPECT_EQ(second, first + "-2") << "without --resume, a new folder";
  o.resume = true;
  o.stop_after = 0;
  const SweepSummary s = run_sweep(e, o);
  EXPECT_EQ(s.out_dir, second);
  EXPECT_EQ(s.already, 1u);
}

TEST_F(SweepRun, ResumeRefusesAnotherBuildUnlessForced) {
  const std::string dir = fresh_dir("build");
  const Experiment e = experiment();
  SweepOptions o = options(dir);
  o.stop_after = 2;
  run_sweep(e, o);
  Json machine = Json::parse(read_text_file(dir + "/machine.json"));
  const std::string commit = machine["git"]["commit"], flags = machine["flags"];
  machine["git"]["commit"] = "0123456789abcdef";
  machine["flags"] = "-O0 -g";
  write_file_atomic(dir + "/machine.json", machine.dump(2));
  const auto before = point_files(dir);

  o.stop_after = 0;
  o.resume = true;
  try {
    run_sweep(e, o);
    ADD_FAILURE() << "resumed a folder of another build";
  } catch (const InvalidInput& err) {
    const std::string msg = err.what();
    for (const std::string& want :
         {std::string("0123456789abcdef"), commit, std::string("-O0 -g"), flags, std::string("--force")}) {
      EXPECT_NE(msg.find(want), std::string::npos) << "'" << want << "' missing from: " << msg;
    }
  }
  EXPECT_EQ(point_files(dir), before) << "a refused resume writes nothing";

  o.force = true;
  const SweepSummary s = run_sweep(e, o);
  EXPECT_EQ(s.already, 2u);
  EXPECT_EQ(s.ok, s.planned - 2);
  const Json after = Json::parse(read_text_file(dir + "/machine.json"));
  ASSERT_EQ(after["forced_resumes"].size(), 1u);
  EXPECT_NE(after["forced_resumes"][0]["differences"].get<std::string>().find("0123456789abcdef"), std::string::npos);
}

// The death tests re-execute this binary up to their statement (TBB threads: no plain
// fork), so each statement comes first in its test, before state it would disturb.
// Runs the sweep in a child process whose doomed point raises `sig`; expects that death.
void sweep_killed_by(const Experiment& e, const SweepOptions& o, int sig) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        g_doomed_signal = sig;
        run_sweep(e, o);
      },
      ::testing::KilledBySignal(sig), "");
}

TEST_F(SweepRun, PointTheProcessDiedOnIsRecordedAsFailedNotRetried) {
  const Experiment e = died_experiment();
  const std::string doomed_id = doomed_point_id(e);
  const std::string dir = fresh_dir("died");
  sweep_killed_by(e, options(dir), SIGKILL);
  ASSERT_TRUE(file_exists(attempt_path(dir, doomed_id))) << "the marker is written before the point runs";
  EXPECT_FALSE(file_exists(point_path(dir, doomed_id)));

  // Merging the dead shard as it is counts the point as failed.
  const std::string merged = fresh_dir("died_merged");
  merge_results(merged, {dir});
  const auto merged_points = read_points(merged);
  const auto dead = std::find_if(merged_points.begin(), merged_points.end(),
                                 [&](const PointFile& pf) { return pf.record.id == doomed_id; });
  ASSERT_NE(dead, merged_points.end());
  EXPECT_EQ(dead->record.status, PointStatus::Failed);

  // Resuming records it as failed with the reason, without running it (were it run, this
  // process would not die: g_doomed_signal is 0 here, and the point would come out ok).
  SweepOptions r = options(dir);
  r.resume = true;
  const SweepSummary s = run_sweep(e, r);
  EXPECT_EQ(s.failed, 1u) << log.str();
  const PointRecord rec = PointRecord::from_json(Json::parse(read_text_file(point_path(dir, doomed_id)))["record"]);
  EXPECT_EQ(rec.status, PointStatus::Failed);
  EXPECT_EQ(rec.reason.rfind("process died while measuring this point: ", 0), 0u) << rec.reason;
  EXPECT_NE(rec.reason.find("pid"), std::string::npos) << rec.reason;
  EXPECT_EQ(rec.kernel, "doomed");
  EXPECT_FALSE(file_exists(attempt_path(dir, doomed_id)));
  const SweepSummary again = run_sweep(e, r);
  EXPECT_EQ(again.already, again.planned) << "the death is a result, not retried";
}

// Ctrl-C or SIGTERM is not a death of the point: the marker goes, a resume measures it.
TEST_F(SweepRun, StoppedBySigtermThePointIsMeasuredAgainOnResume) {
  const Experiment e = died_experiment();
  const std::string doomed_id = doomed_point_id(e);
  const std::string stopped = fresh_dir("stopped");
  sweep_killed_by(e, options(stopped), SIGTERM);
  EXPECT_FALSE(file_exists(attempt_path(stopped, doomed_id)));
  SweepOptions sr = options(stopped);
  sr.resume = true;
  const SweepSummary resumed = run_sweep(e, sr);
  EXPECT_EQ(resumed.failed, 0u) << log.str();
  EXPECT_EQ(resumed.already + resumed.ok, resumed.planned);
}

TEST_F(SweepRun, MemoryEstimateCoversWhatVerificationAndTimingAllocate) {
  {
    const size_t before = heap_in_use();
    const auto block = alloc_floats(size_t{2} << 20);
    if (heap_in_use() < before + (size_t{8} << 20)) {
      GTEST_SKIP() << "mallinfo2 does not see this allocator's blocks (sanitizer build)";
    }
  }
  for (const std::string shape :
       {R"("q_len": 4, "kv_len": 16384, "q_heads": 4, "kv_heads": 2, "head_dim": 64)",
        R"("q_len": 512, "q_heads": 2, "head_dim": 64, "causal": true)",
        R"("q_len": 96, "kv_len": 2000, "q_heads": 6, "kv_heads": 2, "head_dim": 40, "layout": "bshd")"}) {
    const Experiment e = parse_experiment(
        Json::parse(R"({"description": "m", "implementations": ["probe"], "threads": 1, "repetitions": 1,
                        "min_time_s": 0.001, "verify_rows": 64, )" +
                    shape + "}"),
        "memory", names);
    const std::string dir = fresh_dir("memory");
    g_probe_peak = 0;
    const size_t base = heap_in_use();
    run_sweep(e, options(dir));
    const auto points = read_points(dir);
    ASSERT_EQ(points.size(), 1u);
    ASSERT_EQ(points[0].record.status, PointStatus::Ok) << points[0].record.reason;
    const size_t estimate = points[0].record.memory_bytes;
    ASSERT_GT(g_probe_peak, base);
    const size_t actual = g_probe_peak - base;
    EXPECT_GE(estimate, actual) << shape;
    // And not far above it: the estimate decides which points are skipped.
    EXPECT_LE(estimate, actual + (size_t{2} << 20)) << shape << ": estimate " << estimate << ", actual " << actual;
  }
}

}  // namespace
}  // namespace attnlab::bench
