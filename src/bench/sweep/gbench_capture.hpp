// Google Benchmark as the sweep drives it: one Initialize per process, a reporter that keeps
// Google Benchmark's own JSON (for bench.json) and the runs (for the point's record), the
// repair of the non-JSON numbers that JSON holds, and the aggregates over a sweep's passes.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "bench/results/results.hpp"

namespace attnlab::bench {

// Google Benchmark needs Initialize once per process (it records the executable name the
// JSON context prints).
void init_benchmark_once();

// Keeps Google Benchmark's own JSON and the runs. The names drop the timing settings Google
// Benchmark appends (/min_time:0.050/repeats:3), so a point has the same name in every sweep
// and in attn_bench (which takes them from its flags), and Google Benchmark's compare.py lines
// runs up across settings.
class CaptureReporter : public benchmark::BenchmarkReporter {
 public:
  CaptureReporter();
  bool ReportContext(const Context& c) override { return json_.ReportContext(c); }
  void ReportRuns(const std::vector<Run>& runs) override;
  void Finalize() override { json_.Finalize(); }
  const std::vector<Run>& runs() const { return runs_; }
  std::string text() const { return text_.str(); }

 private:
  std::ostringstream text_, errors_;
  benchmark::JSONReporter json_;
  std::vector<Run> runs_;
};

// Google Benchmark writes non-finite numbers as bare NaN / Infinity (e.g. the cv aggregate
// of a counter that is always 0), which is not JSON; they become null.
std::string sanitize_gbench_json(const std::string& text);

// Adds a later pass of the sweep (Experiment::rounds) to a point timed before: its times and
// Google Benchmark's iteration runs (tagged attnlab_round, numbered on), and the aggregates
// (mean, median, stddev, cv of every counter) recomputed over all passes, so bench.json
// says what results.csv says. A pass that fails (it disagreed this time) fails the point; a
// skipped one (the time cap's estimate moved) leaves it as it was, with fewer rounds.
void add_round(PointFile& into, const PointFile& next, int round);

}  // namespace attnlab::bench
