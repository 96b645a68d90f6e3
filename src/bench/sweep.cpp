#include "bench/sweep.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <benchmark/benchmark.h>

#include "attnlab/npy.hpp"
#include "attnlab/verify.hpp"
#include "bench/bench_point.hpp"
#include "bench/files.hpp"
#include "bench/machine.hpp"
#include "bench/peak.hpp"
#include "bench/results.hpp"

namespace attnlab::bench {

namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string fmt_duration(double s) {
  char buf[32];
  if (!(s >= 0)) return "?";
  const long t = static_cast<long>(s + 0.5);
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  }
  return buf;
}

std::string fmt_mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f MiB", bytes / (1 << 20));
  return buf;
}

// Google Benchmark needs Initialize once per process (it records the executable name the
// JSON context prints).
void init_benchmark_once() {
  static bool done = false;
  if (done) return;
  done = true;
  static char arg0[] = "attnlab-sweep";
  static char* argv[] = {arg0, nullptr};
  int argc = 1;
  benchmark::Initialize(&argc, argv);
}

// Keeps Google Benchmark's own JSON (for bench.json) and the runs (for the record).
class CaptureReporter : public benchmark::BenchmarkReporter {
 public:
  CaptureReporter() {
    json_.SetOutputStream(&text_);
    json_.SetErrorStream(&errors_);
  }
  bool ReportContext(const Context& c) override { return json_.ReportContext(c); }
  void ReportRuns(const std::vector<Run>& runs) override {
    json_.ReportRuns(runs);
    runs_.insert(runs_.end(), runs.begin(), runs.end());
  }
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
std::string sanitize_gbench_json(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    bool replaced = false;
    if (text[i] == ':' ) {
      size_t j = i + 1;
      while (j < text.size() && text[j] == ' ') ++j;
      for (const char* tok : {"-NaN", "NaN", "-nan", "nan", "-Infinity", "Infinity", "-inf", "inf"}) {
        const size_t n = std::char_traits<char>::length(tok);
        if (text.compare(j, n, tok) == 0) {
          out += ": null";
          i = j + n;
          replaced = true;
          break;
        }
      }
    }
    if (!replaced) out += text[i++];
  }
  return out;
}

std::string describe_point(const GridPoint& g) {
  const Problem& p = g.problem;
  std::ostringstream s;
  s << g.kernel << " b" << p.batch << " h" << p.q_heads << "/" << p.kv_heads << " q" << p.q_len << " kv" << p.kv_len
    << " d" << p.head_dim << " " << mask_name(p) << (p.layout == Layout::BSHD ? " bshd" : "") << " t" << g.threads;
  return s.str();
}

struct Runner {
  const Experiment& e;
  const SweepOptions& o;
  std::ostream& log;
  std::string dir;
  Peaks peaks;
  TimingOptions timing;
  double memory_budget = 0;
  RateBook rates;
  Json context_extra;

  const Kernel* find(const std::string& name) const {
    for (const Kernel* k : o.kernels.empty() ? registry() : o.kernels) {
      if (k->name() == name) return k;
    }
    return nullptr;
  }

  PointFile decide(const GridPoint& g) {
    const auto t0 = Clock::now();
    PointFile pf;
    PointRecord& r = pf.record;
    r.id = g.id();
    r.kernel = g.kernel;
    r.problem = g.problem;
    r.threads = g.threads;
    r.name = point_name(g.kernel, g.problem, g.threads);
    r.measured_at = now_iso8601();
    if (const PeakAtThreads* row = peaks.at(g.threads)) {
      r.peak_flops = row->fma_flops;
      r.peak_read_bytes = row->read_bytes;
    }
    auto skip = [&](const std::string& why) -> PointFile& {
      r.status = PointStatus::Skipped;
      r.reason = why;
      r.seconds_spent = seconds_since(t0);
      return pf;
    };
    const Kernel* k = find(g.kernel);
    if (!k) return skip("kernel not in this build's registry");
    if (Support a = k->available(); !a) return skip("unavailable: " + a.reason);
    if (Support s = k->supports(g.problem); !s) return skip("unsupported: " + s.reason);
    const BenchPoint pt{k, g.problem, g.threads};
    r.extra_bytes = k->workspace_bytes(g.problem, g.threads);
    r.memory_bytes = point_memory_bytes(pt);
    if (static_cast<double>(r.memory_bytes) > memory_budget) {
      return skip("memory: needs " + fmt_mib(static_cast<double>(r.memory_bytes)) + " > budget " +
                  fmt_mib(memory_budget));
    }
    std::string basis;
    const double run_est = rates.estimate_seconds(pt, &basis);
    const double point_est = estimate_point_seconds(run_est, timing, true);
    if (point_est > e.time_cap_s) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "time cap: estimated %.0f s > %.0f s (", point_est, e.time_cap_s);
      return skip(buf + basis + ")");
    }
    try {
      // Verify first, on the inputs that will be timed.
      auto fixture = std::make_unique<PointFixture>();
      fixture->id = r.id;
      fixture->tensors = random_tensors(g.problem, e.seed);
      const Inputs& in = fixture->tensors.inputs;
      const auto rows = sample_rows(g.problem, static_cast<size_t>(e.verify_rows), e.seed);
      const Agreement ag = prepare_agreement(g.problem, in, rows);
      const auto tv = Clock::now();
      const KernelCheck check = check_kernel(*k, g.problem, in, ag, g.threads);
      const double verify_run = seconds_since(tv);
      r.verdict = to_string(check.verdict);
      r.err_o_rel = check.errors.o_rel;
      r.err_lse = check.errors.lse;
      r.tol_o_rel = ag.tol.o_rel;
      r.tol_lse = ag.tol.lse;
      r.verify_rows = static_cast<int>(rows.size());
      if (check.verdict == Verdict::Skip) return skip("verification skipped: " + check.reason);
      if (check.verdict == Verdict::Fail) {
        r.status = PointStatus::Failed;
        r.reason = "disagrees with the float64 reference: " + check.reason;
        r.seconds_spent = seconds_since(t0);
        return pf;
      }
      rates.record(g.kernel, g.threads, g.flops, verify_run);
      // The verification run is a measurement too: a first point of a slow kernel that
      // turns out to exceed the cap stops here.
      const double timing_est = estimate_point_seconds(verify_run, timing, false);
      if (timing_est > e.time_cap_s) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "time cap: verified, but timing estimated %.0f s > %.0f s (one run took %.2f s)",
                      timing_est, e.time_cap_s, verify_run);
        return skip(buf);
      }
      fixture->session = std::make_unique<Session>(*k, g.problem, g.threads);
      auto slot = std::make_shared<FixtureSlot>();
      slot->put(std::move(fixture));
      RegisterHooks hooks;
      hooks.slot = slot;
      const PointFile timed = time_point(pt, r, hooks);
      slot->clear();
      pf = timed;
    } catch (const std::bad_alloc&) {
      return skip("memory: allocation failed");
    } catch (const std::exception& err) {
      r.status = PointStatus::Failed;
      r.reason = std::string("error: ") + err.what();
    }
    pf.record.seconds_spent = seconds_since(t0);
    return pf;
  }

  PointFile time_point(const BenchPoint& pt, const PointRecord& base, const RegisterHooks& hooks) {
    PointFile pf;
    pf.record = base;
    PointRecord& r = pf.record;
    init_benchmark_once();
    const PeakRef peak{r.peak_flops, r.peak_read_bytes};
    register_point(pt, peak, timing, hooks);
    CaptureReporter capture;
    benchmark::RunSpecifiedBenchmarks(&capture);
    benchmark::ClearRegisteredBenchmarks();
    std::string error;
    for (const auto& run : capture.runs()) {
      if (run.error_occurred) error = run.error_message;
      if (run.run_type != benchmark::BenchmarkReporter::Run::RT_Iteration || run.error_occurred) continue;
      if (run.iterations > 0) {
        r.times.push_back(run.real_accumulated_time / static_cast<double>(run.iterations));
        r.iterations = run.iterations;
      }
    }
    if (!error.empty() || r.times.empty()) {
      r.status = PointStatus::Failed;
      r.reason = "timing failed: " + (error.empty() ? std::string("no runs reported") : error);
      r.times.clear();
    } else {
      r.status = PointStatus::Ok;
      rates.record(r.kernel, r.threads, r.problem.flops(), r.time_median());
    }
    try {
      Json doc = Json::parse(sanitize_gbench_json(capture.text()));
      pf.gbench_context = doc.value("context", Json::object());
      for (const auto& [key, value] : context_extra.items()) pf.gbench_context[key] = value;
      pf.gbench_runs = doc.value("benchmarks", Json::array());
    } catch (const Json::exception& err) {
      pf.gbench_context = {{"attnlab_note", std::string("Google Benchmark JSON unparsable: ") + err.what()}};
    }
    return pf;
  }
};

}  // namespace

std::pair<int, int> parse_shard(const std::string& text) {
  const std::string allowed = "'i/n' with integers 0 <= i < n (e.g. 0/4 ... 3/4)";
  const auto slash = text.find('/');
  if (slash == std::string::npos) throw InvalidInput("shard: '" + text + "' is not allowed; allowed: " + allowed);
  try {
    size_t a = 0, b = 0;
    const int i = std::stoi(text.substr(0, slash), &a);
    const int n = std::stoi(text.substr(slash + 1), &b);
    if (a != slash || b != text.size() - slash - 1 || n < 1 || i < 0 || i >= n) throw std::invalid_argument(text);
    return {i, n};
  } catch (const std::exception&) {
    throw InvalidInput("shard: '" + text + "' is not allowed; allowed: " + allowed);
  }
}

std::string choose_out_dir(const std::string& experiment, const SweepOptions& o) {
  if (!o.out_dir.empty()) return o.out_dir;
  namespace fs = std::filesystem;
  const std::string suffix = "-" + experiment + (o.shard_count > 1 ? "-shard" + std::to_string(o.shard_index) + "of" +
                                                                          std::to_string(o.shard_count)
                                                                    : "");
  if (o.resume) {
    std::vector<std::string> candidates;
    std::error_code ec;
    if (fs::is_directory(o.results_root, ec)) {
      for (const auto& d : fs::directory_iterator(o.results_root, ec)) {
        const std::string name = d.path().filename().string();
        if (d.is_directory() && name.size() > suffix.size() &&
            name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
            file_exists(d.path().string() + "/sweep.json")) {
          candidates.push_back(d.path().string());
        }
      }
    }
    if (!candidates.empty()) return *std::max_element(candidates.begin(), candidates.end());
  }
  const std::string base = o.results_root + "/" + today() + suffix;
  std::string dir = base;
  for (int n = 2; std::filesystem::exists(dir); ++n) dir = base + "-" + std::to_string(n);
  return dir;
}

SweepSummary run_sweep(const Experiment& e, const SweepOptions& o) {
  if (o.shard_count < 1 || o.shard_index < 0 || o.shard_index >= o.shard_count) {
    throw InvalidInput("shard: " + std::to_string(o.shard_index) + "/" + std::to_string(o.shard_count) +
                       " is not allowed; allowed: i/n with 0 <= i < n");
  }
  std::ostream& log = o.progress ? *o.progress : std::cerr;
  const int all_threads = o.all_threads > 0 ? o.all_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::vector<GridPoint> grid = expand(e, all_threads);

  SweepPlan plan;
  plan.experiment = e.name;
  plan.shard_index = o.shard_index;
  plan.shard_count = o.shard_count;
  plan.all_threads = all_threads;
  for (const auto& g : grid) plan.ids.push_back(g.id());

  Runner run{e, o, log, choose_out_dir(e.name, o), {}, {}, 0, {}, {}};
  const std::string& dir = run.dir;
  const bool exists = file_exists(dir + "/sweep.json");
  std::map<std::string, PointFile> done;
  if (exists) {
    const Json old_exp = Json::parse(read_text_file(dir + "/experiment.json"));
    const SweepPlan old = SweepPlan::from_json(Json::parse(read_text_file(dir + "/sweep.json")));
    if (!o.resume) {
      throw InvalidInput("out: " + dir + " already holds a sweep of '" + old.experiment +
                         "'; allowed: --resume to continue it, or another --out folder");
    }
    if (old_exp != e.source) {
      throw InvalidInput("resume: " + dir + "/experiment.json differs from " + e.name +
                         " (the experiment changed since the sweep started); allowed: the same experiment, or a new --out");
    }
    if (old.shard_index != o.shard_index || old.shard_count != o.shard_count) {
      throw InvalidInput("resume: " + dir + " is shard " + std::to_string(old.shard_index) + "/" +
                         std::to_string(old.shard_count) + "; allowed: --shard " + std::to_string(old.shard_index) +
                         "/" + std::to_string(old.shard_count));
    }
    if (old.ids != plan.ids) {
      log << "note: the plan changed since the sweep started (kernels or core count); finished points are kept\n";
    }
    for (PointFile& pf : read_points(dir)) done[pf.record.id] = std::move(pf);
  }
  make_dirs(points_dir(dir));
  write_file_atomic(dir + "/experiment.json", e.source.dump(2) + "\n");
  write_file_atomic(dir + "/sweep.json", plan.to_json().dump(1) + "\n");

  // The points of this shard still to decide.
  std::vector<const GridPoint*> todo;
  SweepSummary sum;
  sum.out_dir = dir;
  std::set<int> thread_counts;
  for (size_t i = 0; i < grid.size(); ++i) {
    if (!plan.in_shard(i)) continue;
    ++sum.planned;
    if (done.count(grid[i].id())) {
      ++sum.already;
      continue;
    }
    todo.push_back(&grid[i]);
    thread_counts.insert(grid[i].threads);
  }

  // Peaks: kept from an earlier start of this sweep, read from --peak-json, or measured now.
  Json machine;
  if (file_exists(dir + "/machine.json")) machine = Json::parse(read_text_file(dir + "/machine.json"));
  bool have_peaks = false;
  auto covers = [&](const Peaks& p) {
    return std::all_of(thread_counts.begin(), thread_counts.end(), [&](int t) { return p.at(t) != nullptr; });
  };
  if (machine.contains("peaks")) {
    run.peaks = Peaks::from_json(machine["peaks"]);
    have_peaks = covers(run.peaks);
  }
  bool peaks_from_file = false;
  if (!have_peaks && !o.peak_json.empty()) {
    run.peaks = Peaks::from_json(Json::parse(read_text_file(o.peak_json)));
    have_peaks = peaks_from_file = covers(run.peaks);
    if (!have_peaks) log << "note: " << o.peak_json << " lacks some thread counts; measuring\n";
  }
  if (!have_peaks) {
    PeakOptions po;
    po.threads.assign(thread_counts.begin(), thread_counts.end());
    if (po.threads.empty()) po.threads = {all_threads};
    po.repeats = o.peak_repeats;
    po.buffer_bytes = o.peak_buffer_bytes;
    log << "measuring machine peaks (" << po.repeats << " runs each)...\n";
    run.peaks = measure_peaks(po);
    log << format_peaks(run.peaks);
    machine = describe_machine(run.peaks);
    write_file_atomic(dir + "/machine.json", machine.dump(2) + "\n");
  } else if (!file_exists(dir + "/machine.json")) {
    machine = describe_machine(run.peaks);
    write_file_atomic(dir + "/machine.json", machine.dump(2) + "\n");
  }
  run.context_extra = {{"attnlab_experiment", e.name},
                       {"attnlab_git_commit", machine.value("git", Json::object()).value("commit", "unknown")},
                       {"attnlab_simd_arch", machine.value("isa", Json::object()).value("simd_arch", "")},
                       {"attnlab_flags", machine.value("flags", "")}};

  run.timing.repetitions = e.repetitions;
  run.timing.min_time_s = e.min_time_s;
  run.timing.seed = e.seed;
  run.memory_budget = e.memory_budget_mib > 0 ? e.memory_budget_mib * (1 << 20)
                                              : static_cast<double>(physical_memory_bytes()) / 2;
  // Rates of points finished earlier (resume) inform the time estimates.
  for (const auto& [id, pf] : done) {
    const PointRecord& r = pf.record;
    if (r.status == PointStatus::Ok && !r.times.empty()) {
      run.rates.record(r.kernel, r.threads, r.problem.flops(), r.time_median());
    }
  }

  std::vector<PointFile> all;
  for (auto& [id, pf] : done) all.push_back(pf);
  write_outputs(dir, plan, all);

  log << "sweep " << e.name << ": " << sum.planned << " points"
      << (o.shard_count > 1 ? " in shard " + std::to_string(o.shard_index) + "/" + std::to_string(o.shard_count) : "")
      << ", " << sum.already << " already done, " << todo.size() << " to run -> " << dir << "\n";
  const auto start = Clock::now();
  size_t decided = 0;
  for (size_t i = 0; i < todo.size(); ++i) {
    const GridPoint& g = *todo[i];
    if (o.stop_after > 0 && static_cast<int>(decided) >= o.stop_after) break;
    // ETA: estimated remaining time of the points still to run (capped ones count zero).
    double eta = 0;
    for (size_t j = i; j < todo.size(); ++j) {
      const Kernel* k = run.find(todo[j]->kernel);
      if (!k) continue;
      const double est = estimate_point_seconds(run.rates.estimate_seconds({k, todo[j]->problem, todo[j]->threads}),
                                                run.timing, true);
      if (est <= e.time_cap_s) eta += est;
    }
    char head[64];
    std::snprintf(head, sizeof head, "[%zu/%zu] ", sum.already + i + 1, sum.planned);
    log << head << describe_point(g) << " | elapsed " << fmt_duration(seconds_since(start)) << ", ETA "
        << fmt_duration(eta) << std::flush;

    PointFile pf = run.decide(g);
    write_point(dir, pf);
    all.push_back(pf);
    write_outputs(dir, plan, all);
    ++decided;
    const PointRecord& r = pf.record;
    if (r.status == PointStatus::Ok) {
      ++sum.ok;
      const double t = r.time_median();
      char buf[160];
      std::snprintf(buf, sizeof buf, " -> ok %.3g ms, %.1f GFLOP/s", t * 1e3, r.problem.flops() / t * 1e-9);
      log << buf;
      if (r.peak_flops > 0) {
        std::snprintf(buf, sizeof buf, " (%.0f%% of peak)", 100.0 * r.problem.flops() / t / r.peak_flops);
        log << buf;
      }
      log << "\n";
    } else {
      (r.status == PointStatus::Failed ? sum.failed : sum.skipped)++;
      log << " -> " << to_string(r.status) << ": " << r.reason << "\n";
    }
  }
  sum.remaining = todo.size() - decided;
  // The machine is shared: measure the peaks again at the end, so the report can show how
  // much they drifted while the points ran (fractions stay relative to the first
  // measurement). Not when the peaks were given (--peak-json).
  if (decided > 0 && !run.peaks.rows.empty() && !peaks_from_file) {
    PeakOptions po;
    for (const auto& row : run.peaks.rows) po.threads.push_back(row.threads);
    po.repeats = o.peak_repeats;
    po.buffer_bytes = o.peak_buffer_bytes;
    const Peaks after = measure_peaks(po);
    machine["peaks_after"] = after.to_json();
    machine["date_after"] = now_iso8601();
    write_file_atomic(dir + "/machine.json", machine.dump(2) + "\n");
    log << "peaks again after the sweep:\n" << format_peaks(after);
  }
  log << "sweep " << e.name << ": " << sum.ok << " ok, " << sum.failed << " failed, " << sum.skipped << " skipped"
      << (sum.remaining ? ", " + std::to_string(sum.remaining) + " not run (stopped; --resume continues)" : "")
      << " in " << fmt_duration(seconds_since(start)) << " -> " << dir << "\n";
  return sum;
}

}  // namespace attnlab::bench
