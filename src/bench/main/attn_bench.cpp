// attn_bench: the issue-3 benchmark shapes for every registry kernel that supports them,
// registered programmatically with register_point() (the same function the sweep uses).
//
//   attn_bench [--attn_kernels=a,b] [--attn_groups=ladder,flash,...] [--attn_threads=N]
//              [--attn_time_cap_s=60] [--attn_memory_budget_mib=M] [--attn_peak_json=FILE]
//              [--attn_peak_repeats=3] [--attn_dtypes=f32,bf16,f16]
//              [any Google Benchmark flag, e.g. --benchmark_format=json]
//
// Groups (batch 1, BHSD, each shape once per --attn_dtypes storage dtype, default f32;
// "all" = all cores):
//   decode   q_len 1, kv_len 32768, q_heads 32, kv_heads 8, d 128          threads all
//   cpu1024  q_len = kv_len = 1024, 8 heads, d 128                          threads 1 and all
//   ladder   q_len = kv_len = 2048, 8 heads, d 128                          threads all
//   flash    4096, 8 heads, d 128, none and causal; GQA 32/8; d 64           threads all
//   memory   32768, 8 heads, d 128 (extra memory of the tiled kernels)      threads all
//   mla      DeepSeek-V3's MLA: prefill 4096, 128 heads, d_qk 192 / d_v 128, causal, and the
//            absorbed decode q_len 1, kv_len 32768, 128 q heads on 1 kv head, d_qk 576 / d_v 512
//                                                                           threads all
// Points are registered in ascending FLOP count, so when a slow kernel reaches a shape it
// cannot finish within the time cap, its earlier points give the estimate and the point is
// reported as skipped (error_message says why) instead of running for minutes.
// The machine peaks are measured once at start for the thread counts used.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "attnlab/kernel.hpp"
#include "attnlab/limits.hpp"
#include "bench/bench_point.hpp"
#include "bench/machine.hpp"
#include "bench/peak.hpp"
#include "bench/files.hpp"

namespace {

using namespace attnlab;
using namespace attnlab::bench;

struct Shape {
  const char* group;
  int64_t q_heads, kv_heads, q_len, kv_len, head_dim;
  CausalAlign causal;
  bool single_thread_too;  // also at 1 thread
  int64_t head_dim_v = 0;  // 0 = head_dim
};

const Shape kShapes[] = {
    {"decode", 32, 8, 1, 32768, 128, CausalAlign::None, false},
    {"cpu1024", 8, 8, 1024, 1024, 128, CausalAlign::None, true},
    {"ladder", 8, 8, 2048, 2048, 128, CausalAlign::None, false},
    {"flash", 8, 8, 4096, 4096, 128, CausalAlign::None, false},
    {"flash", 8, 8, 4096, 4096, 128, CausalAlign::BottomRight, false},
    {"flash", 32, 8, 4096, 4096, 128, CausalAlign::None, false},
    {"flash", 8, 8, 4096, 4096, 64, CausalAlign::None, false},
    {"memory", 8, 8, 32768, 32768, 128, CausalAlign::None, false},
    {"mla", 128, 128, 4096, 4096, 192, CausalAlign::BottomRight, false, 128},
    {"mla", 128, 1, 1, 32768, 576, CausalAlign::BottomRight, false, 512},
};

struct Flags {
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
    if (const char* v = value("--attn_kernels")) {
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
                         "'; allowed: --attn_kernels, --attn_groups, --attn_threads, "
                         "--attn_time_cap_s, --attn_memory_budget_mib, --attn_peak_json, --attn_peak_repeats, "
                         "--attn_dtypes");
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  for (const auto& g : f.groups) {
    if (std::none_of(std::begin(kShapes), std::end(kShapes), [&](const Shape& s) { return g == s.group; })) {
      throw InvalidInput("attn_groups: '" + g + "' is not a group; allowed: decode, cpu1024, ladder, flash, memory");
    }
  }
  return f;
}

int run(int argc, char** argv) {
  Flags flags = take_flags(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;

  const int all =
      flags.threads > 0 ? flags.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<const Kernel*> kernels;
  if (flags.kernels.empty()) {
    kernels = registry();
  } else {
    for (const auto& k : flags.kernels) kernels.push_back(&kernel_or_throw(k));
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

  std::vector<BenchPoint> points;
  for (const Shape& s : kShapes) {
    if (!flags.groups.empty() && std::find(flags.groups.begin(), flags.groups.end(), s.group) == flags.groups.end())
      continue;
    std::vector<int> counts = {all};
    if (s.single_thread_too && all != 1) counts.insert(counts.begin(), 1);
    for (const Kernel* k : kernels)
      for (DType dtype : flags.dtypes)
        for (int t : counts) {
          BenchPoint pt;
          pt.kernel = k;
          pt.threads = t;
          Problem& p = pt.problem;
          p.q_heads = s.q_heads, p.kv_heads = s.kv_heads, p.q_len = s.q_len, p.kv_len = s.kv_len;
          p.head_dim = s.head_dim, p.head_dim_v = s.head_dim_v, p.causal = s.causal, p.dtype = dtype;
          if (Support a = k->available(); !a) {
            std::fprintf(stderr, "not registered: %s (%s)\n", pt.name().c_str(), a.reason.c_str());
            continue;
          }
          if (Support sup = supports_problem(*k, p); !sup) {
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
