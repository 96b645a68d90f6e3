// attn_bench: the benchmark shapes of experiments/attn_bench.json for every registry kernel
// that supports them, registered programmatically with register_point() (the same function
// the sweep uses), so Google Benchmark's own flags, filters and output formats apply.
//
//   attn_bench [--attn_experiment=FILE] [--attn_kernels=a,b] [--attn_groups=ladder,flash,...]
//              [--attn_threads=N] [--attn_time_cap_s=60] [--attn_memory_budget_mib=M]
//              [--attn_peak_json=FILE] [--attn_peak_repeats=3] [--attn_dtypes=f32,bf16,f16]
//              [any Google Benchmark flag, e.g. --benchmark_format=json]
//
// The shapes are the experiment file's grids (default: experiments/attn_bench.json of the
// source tree; the experiment format, experiments/README.md); a grid's "model" label is its
// group for --attn_groups (decode, cpu1024, ladder, flash, memory, mla there). --attn_dtypes
// replaces every grid's dtype list, --attn_threads what "all" threads means.
// Points are registered in ascending FLOP count, so when a slow kernel reaches a shape it
// cannot finish within the time cap, its earlier points give the estimate and the point is
// reported as skipped (error_message says why) instead of running for minutes.
// The machine peaks are measured once at start for the thread counts used.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "attnlab/kernel.hpp"
#include "attnlab/limits.hpp"
#include "bench/sweep/bench_point.hpp"
#include "bench/sweep/experiment.hpp"
#include "bench/results/machine.hpp"
#include "bench/using.hpp"
#include "bench/results/files.hpp"

namespace {

using namespace attnlab;
using namespace attnlab::bench;

#ifndef ATTN_SOURCE_DIR
#define ATTN_SOURCE_DIR "."
#endif

struct Flags {
  std::string experiment = std::string(ATTN_SOURCE_DIR) + "/experiments/attn_bench.json";
  std::vector<std::string> kernels, groups;
  int threads = 0;
  double time_cap_s = 60;
  double memory_budget_mib = 0;
  std::string peak_json;
  int peak_repeats = 3;
  std::vector<DType> dtypes = {DType::F32};
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string tok = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!tok.empty()) out.push_back(tok);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// Takes the --attn_* flags out of argv (Google Benchmark rejects flags it does not know).
Flags take_flags(int& argc, char** argv) {
  Flags f;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* key) -> const char* {
      const size_t n = std::strlen(key);
      return a.compare(0, n, key) == 0 && a.size() > n && a[n] == '=' ? argv[i] + n + 1 : nullptr;
    };
    if (const char* v = value("--attn_experiment")) {
      f.experiment = v;
    } else if (const char* v = value("--attn_kernels")) {
      f.kernels = split(v);
    } else if (const char* v = value("--attn_groups")) {
      f.groups = split(v);
    } else if (const char* v = value("--attn_threads")) {
      f.threads = std::stoi(v);
    } else if (const char* v = value("--attn_time_cap_s")) {
      f.time_cap_s = std::stod(v);
    } else if (const char* v = value("--attn_memory_budget_mib")) {
      f.memory_budget_mib = std::stod(v);
    } else if (const char* v = value("--attn_peak_json")) {
      f.peak_json = v;
    } else if (const char* v = value("--attn_peak_repeats")) {
      f.peak_repeats = std::stoi(v);
    } else if (const char* v = value("--attn_dtypes")) {
      f.dtypes.clear();
      for (const auto& d : split(v)) f.dtypes.push_back(parse_dtype(d, "attn_dtypes"));
    } else if (a.rfind("--attn_", 0) == 0) {
      throw InvalidInput("unknown flag '" + a +
                         "'; allowed: --attn_experiment, --attn_kernels, --attn_groups, --attn_threads, "
                         "--attn_time_cap_s, --attn_memory_budget_mib, --attn_peak_json, --attn_peak_repeats, "
                         "--attn_dtypes");
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  return f;
}

int run(int argc, char** argv) {
  Flags flags = take_flags(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;

  const int all = thread_count(flags.threads, "--attn_threads");
  std::vector<const Kernel*> kernels;
  if (flags.kernels.empty()) {
    kernels = registry();
  } else {
    for (const auto& k : flags.kernels) kernels.push_back(&kernel_or_throw(k));
  }

  // The shapes: the experiment's grid points, less the groups (model labels) not asked for.
  Experiment e = load_experiment(flags.experiment, registry_kernel_names());
  std::vector<std::string> groups;
  for (const Grid& g : e.grids) {
    if (std::find(groups.begin(), groups.end(), g.model) == groups.end()) groups.push_back(g.model);
  }
  for (const auto& g : flags.groups) {
    if (std::find(groups.begin(), groups.end(), g) == groups.end()) {
      std::string allowed;
      for (const auto& name : groups) allowed += (allowed.empty() ? "" : ", ") + name;
      throw InvalidInput("attn_groups: '" + g + "' is not a group of " + flags.experiment + "; allowed: " + allowed);
    }
  }
  Peaks peaks;
  if (!flags.peak_json.empty()) {
    peaks = Peaks::from_json(nlohmann::json::parse(read_text_file(flags.peak_json)));
  } else {
    PeakOptions po;
    po.threads = {1, all};
    po.repeats = flags.peak_repeats;
    peaks = measure_peaks(po);
  }
  std::fputs(format_peaks(peaks).c_str(), stderr);
  add_benchmark_context(describe_machine(peaks));

  const double budget =
      flags.memory_budget_mib > 0 ? flags.memory_budget_mib * (1 << 20) : static_cast<double>(memory_budget_bytes());
  auto rates = std::make_shared<RateBook>();
  RegisterHooks hooks;
  hooks.slot = std::make_shared<FixtureSlot>();
  hooks.rates = rates;
  const double cap = flags.time_cap_s;
  hooks.skip_reason = [rates, cap, budget](const BenchPoint& pt) -> std::string {
    char buf[320];
    const double mem = static_cast<double>(point_memory_bytes(pt, 0));  // attn_bench times without verifying
    if (mem > budget) {
      std::snprintf(buf, sizeof buf, "skipped: needs %.0f MiB > memory budget %.0f MiB", mem / (1 << 20),
                    budget / (1 << 20));
      return buf;
    }
    std::string basis;
    const double est = rates->estimate_seconds(pt, &basis);
    if (est > cap) {
      std::snprintf(buf, sizeof buf, "skipped: one run estimated %.0f s > time cap %.0f s (%s)", est, cap,
                    basis.c_str());
      return buf;
    }
    return "";
  };

  std::vector<nlohmann::json> dtypes;
  for (DType d : flags.dtypes) dtypes.emplace_back(to_string(d));
  for (Grid& g : e.grids) g.set("dtype", dtypes);
  std::vector<BenchPoint> points;
  for (const GridPoint& g : expand(e, all)) {
    if (!flags.groups.empty() && std::find(flags.groups.begin(), flags.groups.end(), g.model) == flags.groups.end())
      continue;
    for (const Kernel* k : kernels) {
      if (k->name() != g.kernel) continue;
      BenchPoint pt;
      pt.kernel = k;
      pt.threads = g.threads;
      pt.problem = g.problem;
      if (Support a = k->available(); !a) {
        std::fprintf(stderr, "not registered: %s (%s)\n", pt.name().c_str(), a.reason.c_str());
        continue;
      }
      if (Support sup = supports_problem(*k, pt.problem); !sup) {
        std::fprintf(stderr, "not registered: %s (%s)\n", pt.name().c_str(), sup.reason.c_str());
        continue;
      }
      points.push_back(pt);
    }
  }
  std::stable_sort(points.begin(), points.end(),
                   [](const BenchPoint& a, const BenchPoint& b) { return a.problem.flops() < b.problem.flops(); });
  TimingOptions timing;
  timing.min_time_s = 0;   // --benchmark_min_time applies (default 0.5 s)
  timing.repetitions = 1;  // --benchmark_repetitions applies
  for (const BenchPoint& pt : points) {
    register_point(pt, peaks.ref(pt.kernel->isa(), pt.threads), timing, hooks);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const attnlab::InvalidInput& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 3;
  }
}
