#include "bench/sweep/sweep.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include <benchmark/benchmark.h>

#include "attnlab/isa.hpp"
#include "attnlab/npy.hpp"
#include "attnlab/verify.hpp"
#include "attnlab/limits.hpp"
#include "bench/sweep/bench_point.hpp"
#include "bench/results/files.hpp"
#include "bench/sweep/gbench_capture.hpp"
#include "bench/results/machine.hpp"
#include "bench/using.hpp"
#include "bench/peers/peers.hpp"
#include "bench/sweep/point_runner.hpp"
#include "bench/results/results.hpp"
#include "bench/sweep/stop_signals.hpp"
#include "bench/sweep/sweep_folder.hpp"

namespace attnlab::bench {

namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

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

// `k`: the kernel variant the point runs (nullptr: not in this build).
std::string describe_point(const GridPoint& g, const Kernel* k) {
  return bench::describe_point(PointView{g.kernel, g.problem, g.threads, g.isa, g.model},
                               k ? kernel_label(*k) : g.kernel);
}

// What an earlier start of this sweep left in its folder (nothing for a new folder).
struct Resumed {
  std::map<std::string, PointFile> done;  // decided points, by id
  std::map<std::string, Json> attempts;   // points a process died on
  Json forced_resume;                     // set when --force resumed another build's folder
};

// Checks a folder that holds a sweep may be resumed by this one (same experiment, shard,
// build) and reads what it holds; sets the plan's creation time. Writes experiment.json and
// sweep.json.
Resumed open_folder(const Experiment& e, const SweepOptions& o, const std::string& dir, SweepPlan& plan,
                    std::ostream& log) {
  Resumed r;
  if (file_exists(dir + "/sweep.json")) {
    const Json old_exp = Json::parse(read_text_file(dir + "/experiment.json"));
    const SweepPlan old = SweepPlan::from_json(Json::parse(read_text_file(dir + "/sweep.json")));
    if (!o.resume) {
      throw InvalidInput("out: " + dir + " already holds a sweep of '" + old.experiment +
                         "'; allowed: --resume to continue it, or another --out folder");
    }
    if (old_exp != e.source) {
      throw InvalidInput(
          "resume: " + dir + "/experiment.json differs from " + e.name +
          " (the experiment changed since the sweep started); allowed: the same experiment, or a new --out");
    }
    if (old.shard_index != o.shard_index || old.shard_count != o.shard_count) {
      throw InvalidInput("resume: " + dir + " is shard " + std::to_string(old.shard_index) + "/" +
                         std::to_string(old.shard_count) + "; allowed: --shard " + std::to_string(old.shard_index) +
                         "/" + std::to_string(old.shard_count));
    }
    if (file_exists(dir + "/machine.json")) {
      r.forced_resume = check_same_build(dir, Json::parse(read_text_file(dir + "/machine.json")), o.force, log);
    }
    if (old.ids != plan.ids) {
      log << "note: the plan changed since the sweep started (kernels or core count); finished points are kept\n";
    }
    plan.created = old.created;
    plan.created_unix_ns = old.created_unix_ns;
    for (PointFile& pf : read_points(dir)) r.done[pf.record.id] = std::move(pf);
    r.attempts = read_attempts(dir);
  } else {
    plan.set_created_now();
  }
  make_dirs(points_dir(dir));
  // A marker beside its point file: the process died after writing the point.
  for (auto it = r.attempts.begin(); it != r.attempts.end();) {
    if (r.done.count(it->first)) {
      clear_attempt(dir, it->first);
      it = r.attempts.erase(it);
    } else {
      ++it;
    }
  }
  write_file_atomic(dir + "/experiment.json", e.source.dump(2) + "\n");
  write_file_atomic(dir + "/sweep.json", plan.to_json().dump(1) + "\n");
  return r;
}

// The peaks the points are held against - kept from an earlier start of this sweep, read
// from --peak-json, or measured now - for the default target and every target of a SIMD point
// still to run (that this CPU runs: the others are skipped), at every thread count still to
// run. Returns machine.json's content (written); `from_file`: they came from --peak-json.
Json settle_peaks(Runner& run, const std::vector<const GridPoint*>& todo, int all_threads, bool& from_file) {
  const SweepOptions& o = run.o;
  const std::string& dir = run.dir;
  std::vector<std::string> peak_isas;
  std::set<int> thread_counts;
  for (const GridPoint* g : todo) {
    thread_counts.insert(g->threads);
    const Kernel* k = run.find(*g);
    if (!k || !is_per_target_isa(k->isa()) || !cpu_runs_isa(k->isa())) continue;
    if (std::find(peak_isas.begin(), peak_isas.end(), k->isa()) == peak_isas.end()) peak_isas.emplace_back(k->isa());
  }
  Json machine;
  if (file_exists(dir + "/machine.json")) machine = Json::parse(read_text_file(dir + "/machine.json"));
  bool have_peaks = false;
  auto covers = [&](const Peaks& p) {
    return p.covers(peak_isas, std::vector<int>(thread_counts.begin(), thread_counts.end()));
  };
  if (machine.contains("peaks")) {
    run.peaks = Peaks::from_json(machine["peaks"]);
    have_peaks = covers(run.peaks);
  }
  from_file = false;
  if (!have_peaks && !o.peak_json.empty()) {
    Json doc;
    try {
      doc = Json::parse(read_text_file(o.peak_json));
    } catch (const Json::parse_error& e) {
      throw InvalidInput("--peak-json: " + o.peak_json +
                         " is not JSON (write one with attnlab peak --json FILE): " + e.what());
    }
    run.peaks = Peaks::from_json(doc);
    have_peaks = from_file = covers(run.peaks);
    if (!have_peaks) run.log << "note: " << o.peak_json << " lacks some thread counts or targets; measuring\n";
  }
  if (!have_peaks) {
    PeakOptions po;
    po.threads.assign(thread_counts.begin(), thread_counts.end());
    if (po.threads.empty()) po.threads = {all_threads};
    po.isas = peak_isas;
    po.repeats = o.peak_repeats;
    po.buffer_bytes = o.peak_buffer_bytes;
    run.log << "measuring machine peaks (" << po.repeats << " runs each)...\n";
    run.peaks = measure_peaks(po);
    run.log << format_peaks(run.peaks);
    machine = describe_machine(run.peaks);
    write_file_atomic(dir + "/machine.json", machine.dump(2) + "\n");
  } else if (!file_exists(dir + "/machine.json")) {
    machine = describe_machine(run.peaks);
    write_file_atomic(dir + "/machine.json", machine.dump(2) + "\n");
  }
  return machine;
}

// The timing settings, the Google Benchmark context and the rates of points finished earlier
// (resume), which inform the time estimates.
void prepare_runner(Runner& run, const Json& machine, const std::map<std::string, PointFile>& done) {
  const Experiment& e = run.e;
  run.context_extra = {{"attnlab_experiment", e.name},
                       {"attnlab_git_commit", machine.value("git", Json::object()).value("commit", "unknown")},
                       {"attnlab_simd_arch", machine.value("isa", Json::object()).value("simd_arch", "")},
                       {"attnlab_flags", machine.value("flags", "")},
                       {"attnlab_min_time_s", e.min_time_s},  // the timing settings, not in the names
                       {"attnlab_repetitions", e.repetitions}};
  run.timing.repetitions = e.repetitions;
  run.timing.min_time_s = e.min_time_s;
  run.timing.seed = e.seed;
  run.read_probe.set_bytes(run.o.peak_buffer_bytes);  // the buffer `attnlab peak` reads
  run.memory_budget =
      e.memory_budget_mib > 0 ? e.memory_budget_mib * (1 << 20) : static_cast<double>(memory_budget_bytes());
  for (const auto& [id, pf] : done) {
    const PointRecord& r = pf.record;
    if (r.status == PointStatus::Ok && !r.times.empty()) {
      // Points written before the isa column ran the default variant.
      const Kernel* old = r.isa.empty() ? find_kernel(r.kernel) : nullptr;
      run.rates.record(old ? kernel_label(*old) : kernel_label(r.kernel, r.isa), r.threads, r.problem.flops(),
                       r.time_median());
    }
  }
}

// Estimated remaining time of the points todo[from...] (those over the time cap count zero).
double eta_seconds(const Runner& run, const std::vector<const GridPoint*>& todo, size_t from) {
  double eta = 0;
  for (size_t j = from; j < todo.size(); ++j) {
    const Kernel* k = run.find(*todo[j]);
    if (!k) continue;
    const BenchPoint pt{k, todo[j]->problem, todo[j]->threads, todo[j]->isa};
    const double est = estimate_point_seconds(run.rates.estimate_seconds(pt), run.timing, true);
    if (est <= run.e.time_cap_s) eta += est;
  }
  return eta;
}

// " -> ok 1.2 ms, 345.6 GFLOP/s (78% of the avx2 peak)" or " -> skipped: why".
std::string outcome_text(const Runner& run, const PointRecord& r) {
  if (r.status != PointStatus::Ok) return " -> " + std::string(to_string(r.status)) + ": " + r.reason;
  const double t = r.time_median();
  char buf[160];
  std::snprintf(buf, sizeof buf, " -> ok %.3g ms, %.1f GFLOP/s", t * 1e3, r.problem.flops() / t * 1e-9);
  std::string s = buf;
  if (r.peak_flops > 0) {
    std::snprintf(buf, sizeof buf, " (%.0f%% of the %s peak)", 100.0 * r.problem.flops() / t / r.peak_flops,
                  run.peaks.flops_name(r.isa).c_str());
    s += buf;
  }
  return s;
}

// The machine is shared: the peaks measured again at the end, so the report can show how much
// they drifted while the points ran (fractions stay relative to the first measurement).
void remeasure_peaks(const Runner& run, Json& machine) {
  PeakOptions po;
  for (const TargetPeaks& t : run.peaks.targets) {
    for (const auto& row : t.rows) {
      if (std::find(po.threads.begin(), po.threads.end(), row.threads) == po.threads.end()) {
        po.threads.push_back(row.threads);
      }
    }
    if (is_per_target_isa(t.isa) && cpu_runs_isa(t.isa)) po.isas.push_back(t.isa);
  }
  po.repeats = run.o.peak_repeats;
  po.buffer_bytes = run.o.peak_buffer_bytes;
  const Peaks after = measure_peaks(po);
  machine["peaks_after"] = after.to_json();
  machine["date_after"] = now_iso8601();
  write_file_atomic(run.dir + "/machine.json", machine.dump(2) + "\n");
  run.log << "peaks again after the sweep:\n" << format_peaks(after);
}

}  // namespace

SweepSummary run_sweep(const Experiment& e, const SweepOptions& o) {
  if (o.shard_count < 1 || o.shard_index < 0 || o.shard_index >= o.shard_count) {
    throw InvalidInput("shard: " + std::to_string(o.shard_index) + "/" + std::to_string(o.shard_count) +
                       " is not allowed; allowed: i/n with 0 <= i < n");
  }
  std::ostream& log = o.progress ? *o.progress : std::cerr;
  const int all_threads = thread_count(o.all_threads, "all_threads");
  const std::vector<GridPoint> grid = expand(e, all_threads);

  SweepPlan plan;
  plan.experiment = e.name;
  plan.shard_index = o.shard_index;
  plan.shard_count = o.shard_count;
  plan.all_threads = all_threads;
  for (const auto& g : grid) plan.ids.push_back(g.id());

  Runner run{e, o, log, choose_out_dir(e.name, o), {}, {}, 0, {}, {}, nullptr, {}};
  const std::string& dir = run.dir;
  Resumed resumed = open_folder(e, o, dir, plan, log);

  // The points of this shard still to decide.
  std::vector<const GridPoint*> todo;
  SweepSummary sum;
  sum.out_dir = dir;
  for (size_t i = 0; i < grid.size(); ++i) {
    if (!plan.in_shard(i)) continue;
    ++sum.planned;
    if (resumed.done.count(grid[i].id())) {
      ++sum.already;
      continue;
    }
    todo.push_back(&grid[i]);
  }

  bool peaks_from_file = false;
  Json machine = settle_peaks(run, todo, all_threads, peaks_from_file);
  prepare_runner(run, machine, resumed.done);
  if (!resumed.forced_resume.is_null()) {
    machine["forced_resumes"].push_back(resumed.forced_resume);
    write_file_atomic(dir + "/machine.json", machine.dump(2) + "\n");
  }

  std::vector<PointFile> all;
  for (auto& [id, pf] : resumed.done) all.push_back(pf);
  write_outputs(dir, plan, all);
  const StopSignals stop_signals;

  log << "sweep " << e.name << ": " << sum.planned << " points"
      << (o.shard_count > 1 ? " in shard " + std::to_string(o.shard_index) + "/" + std::to_string(o.shard_count) : "")
      << ", " << sum.already << " already done, " << todo.size() << " to run -> " << dir << "\n";
  const auto start = Clock::now();
  size_t decided = 0;
  // The first pass: every point still to decide, in plan order.
  for (size_t i = 0; i < todo.size(); ++i) {
    const GridPoint& g = *todo[i];
    if (o.stop_after > 0 && static_cast<int>(decided) >= o.stop_after) break;
    char head[64];
    std::snprintf(head, sizeof head, "[%zu/%zu] ", sum.already + i + 1, sum.planned);
    log << head << describe_point(g, run.find(g)) << " | elapsed " << fmt_duration(seconds_since(start)) << ", ETA "
        << fmt_duration(eta_seconds(run, todo, i)) << std::flush;

    const PointRecord base = run.base_record(g);
    PointFile pf;
    if (const auto died = resumed.attempts.find(base.id); died != resumed.attempts.end()) {
      // Measuring it killed the process before: recorded as failed, not retried in a loop.
      pf = died_point(died->second, &base);
      write_point(dir, pf);
      clear_attempt(dir, base.id);
    } else {
      RunningPoint running(dir, base);
      pf = run.decide(g, base);
      write_point(dir, pf);
      running.finish();
    }
    all.push_back(pf);
    write_outputs(dir, plan, all);
    ++decided;
    const PointRecord& r = pf.record;
    if (r.status == PointStatus::Ok) ++sum.ok;
    if (r.status != PointStatus::Ok) (r.status == PointStatus::Failed ? sum.failed : sum.skipped)++;
    log << outcome_text(run, r) << "\n";
  }
  sum.remaining = todo.size() - decided;
  // Later passes (Experiment::rounds): every timed point of this shard again, in plan order,
  // pass after pass, until it has e.rounds (a resumed sweep finishes the passes it lacks).
  std::map<std::string, size_t> where;
  for (size_t x = 0; x < all.size(); ++x) where[all[x].record.id] = x;
  for (int round = 2; round <= e.rounds && sum.remaining == 0; ++round) {
    for (size_t i = 0; i < grid.size(); ++i) {
      const auto at = where.find(grid[i].id());
      if (!plan.in_shard(i) || at == where.end()) continue;
      PointFile& pf = all[at->second];
      if (pf.record.status != PointStatus::Ok || pf.record.rounds >= round) continue;
      if (o.stop_after > 0 && static_cast<int>(decided) >= o.stop_after) {
        ++sum.passes_remaining;
        continue;
      }
      log << "[pass " << round << "/" << e.rounds << "] " << describe_point(grid[i], run.find(grid[i])) << std::flush;
      const PointRecord base = run.base_record(grid[i]);
      RunningPoint running(dir, base);
      const PointFile next = run.decide(grid[i], base);
      add_round(pf, next, round);
      write_point(dir, pf);
      running.finish();
      write_outputs(dir, plan, all);
      ++decided;
      const PointRecord& n = next.record;
      if (n.status == PointStatus::Ok) {
        char buf[96];
        std::snprintf(buf, sizeof buf, " -> ok %.3g ms (median of %zu: %.3g ms)\n", n.time_median() * 1e3,
                      pf.record.times.size(), pf.record.time_median() * 1e3);
        log << buf;
      } else {
        log << " -> " << to_string(n.status) << ": " << n.reason
            << (n.status == PointStatus::Failed ? " (the point is failed)\n" : " (kept with the passes it has)\n");
        if (n.status == PointStatus::Failed) {
          ++sum.failed;
          if (!resumed.done.count(pf.record.id)) --sum.ok;  // its first pass was counted ok by this run
        }
      }
    }
  }
  // Not when the peaks were given (--peak-json).
  if (decided > 0 && !run.peaks.targets.empty() && !peaks_from_file) remeasure_peaks(run, machine);
  log << "sweep " << e.name << ": " << sum.ok << " ok, " << sum.failed << " failed, " << sum.skipped << " skipped"
      << (sum.remaining ? ", " + std::to_string(sum.remaining) + " not run (stopped; --resume continues)" : "")
      << (sum.passes_remaining
              ? ", " + std::to_string(sum.passes_remaining) + " later passes not run (stopped; --resume continues)"
              : "")
      << " in " << fmt_duration(seconds_since(start)) << " -> " << dir << "\n";
  return sum;
}

}  // namespace attnlab::bench
