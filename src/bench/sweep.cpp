#include "bench/sweep.hpp"

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
#include <thread>
#include <tuple>

#include <benchmark/benchmark.h>

#include "attnlab/isa.hpp"
#include "attnlab/npy.hpp"
#include "attnlab/verify.hpp"
#include "attnlab/limits.hpp"
#include "bench/bench_point.hpp"
#include "bench/files.hpp"
#include "bench/machine.hpp"
#include "bench/peak.hpp"
#include "bench/peers.hpp"
#include "bench/results.hpp"
#include "bench/stats.hpp"

namespace attnlab::bench {

namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

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

// Keeps Google Benchmark's own JSON (for bench.json) and the runs (for the record). The names
// drop the timing settings Google Benchmark appends (/min_time:0.050/repeats:3), so a point has
// the same name in every sweep and in attn_bench (which takes them from its flags), and
// Google Benchmark's compare.py lines runs up across settings.
class CaptureReporter : public benchmark::BenchmarkReporter {
 public:
  CaptureReporter() {
    json_.SetOutputStream(&text_);
    json_.SetErrorStream(&errors_);
  }
  bool ReportContext(const Context& c) override { return json_.ReportContext(c); }
  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> named = runs;
    for (Run& r : named) r.run_name.min_time.clear(), r.run_name.repetitions.clear();
    json_.ReportRuns(named);
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
    if (text[i] == ':') {
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

// `k`: the kernel variant the point runs (nullptr: not in this build).
std::string describe_point(const GridPoint& g, const Kernel* k) {
  return bench::describe_point(PointView{g.kernel, g.problem, g.threads, g.isa, g.model},
                               k ? kernel_label(*k) : g.kernel);
}

// Ctrl-C or a batch system's SIGTERM stops a sweep, which is not the running point's fault:
// the handler removes that point's attempt marker (unlink is async-signal-safe), then
// re-raises the signal with the action installed before, so a resume measures the point
// again. Only a process that dies otherwise (out-of-memory kill, SIGKILL, a crash) leaves
// the marker behind.
constexpr int kStopSignals[] = {SIGINT, SIGTERM};
struct sigaction g_previous_action[std::size(kStopSignals)];
char g_running_marker[4096];
volatile std::sig_atomic_t g_marker_armed = 0;

void on_stop_signal(int sig) {
  if (g_marker_armed) ::unlink(g_running_marker);
  for (size_t i = 0; i < std::size(kStopSignals); ++i) {
    if (kStopSignals[i] == sig) ::sigaction(sig, &g_previous_action[i], nullptr);
  }
  ::raise(sig);  // delivered when this handler returns, to the previous action
}

// Installs the handler for the sweep's loop (not over an ignored signal), restores after.
class StopSignals {
 public:
  StopSignals() {
    for (size_t i = 0; i < std::size(kStopSignals); ++i) {
      struct sigaction now {};
      now.sa_handler = on_stop_signal;
      sigemptyset(&now.sa_mask);
      installed_[i] = ::sigaction(kStopSignals[i], nullptr, &g_previous_action[i]) == 0 &&
                      g_previous_action[i].sa_handler != SIG_IGN && ::sigaction(kStopSignals[i], &now, nullptr) == 0;
    }
  }
  ~StopSignals() {
    g_marker_armed = 0;
    for (size_t i = 0; i < std::size(kStopSignals); ++i) {
      if (installed_[i]) ::sigaction(kStopSignals[i], &g_previous_action[i], nullptr);
    }
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  bool installed_[std::size(kStopSignals)] = {};
};

// The attempt marker of the point being measured: written before it runs, removed by
// finish() once its point file is written, and also when an exception stops the sweep
// (an error, e.g. a full disk, is not a death: a resume measures the point again).
class RunningPoint {
 public:
  RunningPoint(const std::string& dir, const PointRecord& base) : dir_(dir), id_(base.id) {
    mark_attempt(dir, base);
    const std::string path = attempt_path(dir, id_);
    if (path.size() < sizeof g_running_marker) {
      std::memcpy(g_running_marker, path.c_str(), path.size() + 1);
      g_marker_armed = 1;
    }
  }
  void finish() {
    g_marker_armed = 0;
    clear_attempt(dir_, id_);
    finished_ = true;
  }
  ~RunningPoint() {
    g_marker_armed = 0;
    if (!finished_) ::unlink(attempt_path(dir_, id_).c_str());
  }
  RunningPoint(const RunningPoint&) = delete;
  RunningPoint& operator=(const RunningPoint&) = delete;

 private:
  std::string dir_, id_;
  bool finished_ = false;
};

// The build a folder's points were measured with must be this one: points of two commits
// or two sets of compiler flags in one folder would be compared as if they were one run.
// Returns the record of a forced resume (null when the builds match).
Json check_same_build(const std::string& dir, const Json& old_machine, bool force, std::ostream& log) {
  const Json now = describe_machine();
  auto field = [](const Json& m, const char* what) -> std::string {
    if (std::string(what) == "git commit") return m.value("git", Json::object()).value("commit", "unknown");
    if (std::string(what) == "default isa") {
      // Points without an "isa" key in the experiment ran the default target (--isa, ATTN_ISA).
      const Json isa = m.value("isa", Json::object());
      return isa.value("default", isa.value("simd_arch", std::string("unknown")));
    }
    return m.value(what, std::string("unknown"));
  };
  std::string diffs;
  for (const char* what : {"git commit", "build_type", "flags", "default isa"}) {
    const std::string was = field(old_machine, what), is = field(now, what);
    if (was != is) diffs += std::string(diffs.empty() ? "" : "; ") + what + " '" + was + "' there, '" + is + "' here";
  }
  if (old_machine.value("git", Json::object()).value("dirty", false) || now["git"].value("dirty", false)) {
    log << "note: " << dir << " or this build has uncommitted changes; the commit alone cannot tell whether "
        << "the code is the same\n";
  }
  if (diffs.empty()) return Json();
  if (!force) {
    throw InvalidInput("resume: " + dir + " was measured by another build (" + diffs +
                       "); its points and new ones would mix two builds. allowed: the same build, --force to "
                       "resume anyway (recorded in machine.json as forced_resumes), or a new --out folder");
  }
  log << "note: --force: resuming " << dir << " measured by another build (" << diffs << ")\n";
  return {{"date", now_iso8601()},
          {"differences", diffs},
          {"git", now["git"]},
          {"build_type", now["build_type"]},
          {"flags", now["flags"]}};
}

// Adds a later pass of the sweep (Experiment::rounds) to a point timed before: its times and
// Google Benchmark's iteration runs (tagged attnlab_round, numbered on), and the aggregates
// (mean, median, stddev, cv of every counter) recomputed over all passes, so bench.json
// says what results.csv says. A pass that fails (it disagreed this time) fails the point; a
// skipped one (the time cap's estimate moved) leaves it as it was, with fewer rounds.
void add_round(PointFile& into, const PointFile& next, int round) {
  PointRecord& r = into.record;
  const PointRecord& n = next.record;
  r.seconds_spent += n.seconds_spent;
  if (n.status == PointStatus::Skipped) return;
  if (n.status == PointStatus::Failed) {
    into = next;
    into.record.reason = "pass " + std::to_string(round) + " of the sweep: " + n.reason;
    return;
  }
  for (const auto& [mine, theirs] : {std::pair{&r.err_o_rel, n.err_o_rel}, std::pair{&r.err_lse, n.err_lse},
                                     std::pair{&r.err_o_rel_f32_inputs, n.err_o_rel_f32_inputs}}) {
    if (!(*mine >= theirs)) *mine = theirs;  // the worst pass (NaN stays)
  }
  r.times.insert(r.times.end(), n.times.begin(), n.times.end());
  r.rounds += 1;

  Json iterations = Json::array(), aggregates = Json::array();
  // Aggregates (Google Benchmark writes them from 2 repetitions on) are the first pass's,
  // recomputed below; every pass has the same repetitions.
  for (const Json& run : into.gbench_runs)
    (run.value("run_type", "") == "iteration" ? iterations : aggregates).push_back(run);
  for (Json& run : iterations) {
    if (!run.contains("attnlab_round")) run["attnlab_round"] = 1;
  }
  for (const Json& run : next.gbench_runs) {
    if (run.value("run_type", "") != "iteration") continue;
    Json added = run;
    added["repetition_index"] = iterations.size();
    added["attnlab_round"] = round;
    iterations.push_back(added);
  }
  for (Json& run : iterations) run["repetitions"] = iterations.size();
  // Fields that name or count rather than measure.
  static const std::set<std::string> kNotMeasured = {
      "family_index", "per_family_instance_index", "repetition_index", "repetitions", "iterations", "threads",
      "attnlab_round"};
  for (Json& agg : aggregates) {
    const std::string what = agg.value("aggregate_name", "");
    for (auto it = agg.begin(); it != agg.end(); ++it) {
      if (!it.value().is_number() || kNotMeasured.count(it.key())) continue;
      std::vector<double> v;
      for (const Json& run : iterations) {
        if (run.contains(it.key()) && run[it.key()].is_number()) v.push_back(run[it.key()].get<double>());
      }
      if (v.empty()) continue;
      const double m = mean(v), sd = stddev(v);
      const double value = what == "mean"     ? m
                           : what == "median" ? median(v)
                           : what == "stddev" ? sd
                           : what == "cv"     ? (m != 0 ? sd / m : std::numeric_limits<double>::quiet_NaN())
                                              : it.value().get<double>();
      it.value() = std::isfinite(value) ? Json(value) : Json(nullptr);
    }
    agg["repetitions"] = iterations.size();
    agg["iterations"] = iterations.size();
  }
  into.gbench_runs = iterations;
  for (const Json& agg : aggregates) into.gbench_runs.push_back(agg);
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
  std::unique_ptr<PeerPool> peers;  // started at the first peer point

  // The variant a point runs: its named target, or (none named) the default target's;
  // nullptr when the kernel (or that variant) is not in this build.
  const Kernel* find(const GridPoint& g) const {
    if (o.kernels.empty()) return find_kernel(g.kernel, g.isa);
    const std::string isa = g.isa.empty() ? default_isa() : g.isa;
    const Kernel* any = nullptr;
    for (const Kernel* k : o.kernels) {
      if (k->name() != g.kernel) continue;
      if (k->isa() == isa) return k;
      if (!any) any = k;
    }
    return g.isa.empty() ? any : nullptr;
  }

  // What a point is, before it runs (also the content of its attempt marker).
  PointRecord base_record(const GridPoint& g) const {
    PointRecord r;
    r.id = g.id();
    r.kernel = g.kernel;
    const Kernel* k = find(g);
    r.isa = is_peer_kernel(g.kernel) ? kPeerIsa : k ? std::string(k->isa()) : g.isa;
    r.model = g.model;
    r.problem = g.problem;
    r.threads = g.threads;
    r.name = point_name(PointView{g.kernel, g.problem, g.threads, g.isa, g.model});
    r.measured_at = now_iso8601();
    const PeakRef ref = peaks.ref(r.isa, g.threads);
    r.peak_flops = ref.flops;
    r.peak_read_bytes = ref.read_bytes;
    return r;
  }

  PointFile decide(const GridPoint& g, const PointRecord& base) {
    if (is_peer_kernel(g.kernel)) return decide_peer(g, base);
    const auto t0 = Clock::now();
    PointFile pf;
    pf.record = base;
    PointRecord& r = pf.record;
    auto skip = [&](const std::string& why) -> PointFile& {
      r.status = PointStatus::Skipped;
      r.reason = why;
      r.seconds_spent = seconds_since(t0);
      return pf;
    };
    const Kernel* k = find(g);
    if (!k) {
      return skip(g.isa.empty() ? "kernel not in this build's registry"
                                : "kernel has no " + g.isa + " variant in this build");
    }
    if (Support a = k->available(); !a) return skip("unavailable: " + a.reason);
    if (Support s = supports_problem(*k, g.problem); !s) return skip("unsupported: " + s.reason);
    const BenchPoint pt{k, g.problem, g.threads, g.isa};
    r.extra_bytes = k->workspace_bytes(g.problem, g.threads);
    r.memory_bytes = point_memory_bytes(pt, static_cast<size_t>(e.verify_rows));
    if (static_cast<double>(r.memory_bytes) > memory_budget) {
      return skip("memory: needs " + fmt_mib(static_cast<double>(r.memory_bytes)) + " > budget " +
                  fmt_mib(memory_budget));
    }
    std::string basis;
    const double run_est = rates.estimate_seconds(pt, &basis, r.peak_flops);
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
      r.tol_o_rel = check.tol.o_rel;
      r.tol_lse = check.tol.lse;
      r.verify_rows = static_cast<int>(rows.size());
      r.err_o_rel_f32_inputs = r.err_o_rel;
      if (g.problem.dtype != DType::F32 && check.verdict == Verdict::Pass) {
        // The same kernel on the same stored inputs, against float64 on the float32 values
        // they were rounded from: the storage dtype's end-to-end cost.
        Problem f32 = g.problem;
        f32.dtype = DType::F32;
        const Tensors source = random_tensors(f32, e.seed);
        const Agreement unrounded = prepare_agreement(f32, source.inputs, rows);
        r.err_o_rel_f32_inputs = check_kernel(*k, g.problem, in, unrounded, g.threads).errors.o_rel;
      }
      if (check.verdict == Verdict::Skip) return skip("verification skipped: " + check.reason);
      if (check.verdict == Verdict::Fail) {
        r.status = PointStatus::Failed;
        r.reason = "disagrees with the float64 reference: " + check.reason;
        r.seconds_spent = seconds_since(t0);
        return pf;
      }
      rates.record(kernel_label(*k), g.threads, g.flops, verify_run);
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
      r.plan_bytes = fixture->session->plan_bytes();
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

  // A peer point (peers.hpp): the same random inputs as the kernels' points, run by the peer's
  // server, O checked against the float64 reference with the float32 tolerance policy (a peer
  // that disagrees is failed and its times dropped), the times recorded as Google Benchmark
  // would (one iteration run per repetition plus the aggregates, so bench.json holds them too).
  PointFile decide_peer(const GridPoint& g, const PointRecord& base) {
    const auto t0 = Clock::now();
    PointFile pf;
    pf.record = base;
    PointRecord& r = pf.record;
    const Problem& p = g.problem;
    auto decided = [&](PointStatus status, const std::string& why) -> PointFile& {
      r.status = status;
      r.reason = why;
      if (status != PointStatus::Ok) r.times.clear();
      r.seconds_spent = seconds_since(t0);
      return pf;
    };
    r.memory_bytes = peer_memory_bytes(g.kernel, p) + verification_bytes(*find_kernel("naive"), p, e.verify_rows, 1);
    if (static_cast<double>(r.memory_bytes) > memory_budget) {
      return decided(PointStatus::Skipped, "memory: needs " + fmt_mib(static_cast<double>(r.memory_bytes)) +
                                               " > budget " + fmt_mib(memory_budget));
    }
    try {
      const Tensors t = random_tensors(p, e.seed);
      const auto rows = sample_rows(p, static_cast<size_t>(e.verify_rows), e.seed);
      const Agreement ag = prepare_agreement(p, t.inputs, rows);
      if (!peers) peers = std::make_unique<PeerPool>(log, o.peers_python, o.peers_serve);
      PeerAnswer a = peers->run(g.kernel, p, t.inputs, g.threads, {e.repetitions, e.min_time_s, e.time_cap_s});
      r.version = a.version;
      r.how = a.how;
      if (a.extra_bytes >= 0) r.extra_bytes = static_cast<size_t>(a.extra_bytes);  // measured, not declared
      if (a.status == PeerAnswer::Status::Skipped) return decided(PointStatus::Skipped, a.reason);
      if (a.status == PeerAnswer::Status::Failed) return decided(PointStatus::Failed, "peer: " + a.reason);
      const MutView ov = make_view<float>(a.o.data.data(), p.batch, p.q_heads, p.q_len, p.dim_v(), Layout::BHSD);
      const Errors err = measure(ag.ref, as_const(ov), nullptr, p);  // peers give no LSE
      r.err_o_rel = r.err_o_rel_f32_inputs = err.o_rel;
      r.err_lse = std::numeric_limits<double>::quiet_NaN();
      r.tol_o_rel = ag.tol.o_rel;
      r.tol_lse = ag.tol.lse;
      r.verify_rows = static_cast<int>(rows.size());
      const std::string why = ag.tol.why_failed(err);
      r.verdict = to_string(why.empty() ? Verdict::Pass : Verdict::Fail);
      if (!why.empty()) return decided(PointStatus::Failed, "disagrees with the float64 reference: " + why);
      r.times = a.times;
      r.iterations = a.iterations;
    } catch (const std::bad_alloc&) {
      return decided(PointStatus::Skipped, "memory: allocation failed");
    } catch (const std::exception& err) {
      return decided(PointStatus::Failed, std::string("error: ") + err.what());
    }
    pf.gbench_context = context_extra;
    pf.gbench_context["attnlab_timed_by"] = "scripts/peers/serve.py (time.perf_counter; " + r.version + ")";
    const std::string name = r.name + "/real_time";
    const double flops = p.flops();
    auto run_json = [&](double seconds) {
      return Json{{"name", name},
                  {"run_name", name},
                  {"repetitions", r.times.size()},
                  {"threads", 1},
                  {"iterations", r.iterations},
                  {"real_time", seconds * 1e3},
                  {"cpu_time", seconds * 1e3},
                  {"time_unit", "ms"},
                  {"flop_count", flops},
                  {"flops_per_second", flops / seconds},
                  {"peak_fraction", r.peak_flops > 0 ? flops / seconds / r.peak_flops : 0.0}};
    };
    for (size_t i = 0; i < r.times.size(); ++i) {
      Json run = run_json(r.times[i]);
      run["run_type"] = "iteration";
      run["repetition_index"] = i;
      pf.gbench_runs.push_back(run);
    }
    const std::pair<const char*, double> aggregates[] = {
        {"mean", mean(r.times)}, {"median", r.time_median()}, {"stddev", stddev(r.times)}};
    for (const auto& [agg, value] : aggregates) {
      Json run = run_json(value);
      run["name"] = name + "_" + agg;
      run["run_type"] = "aggregate";
      run["aggregate_name"] = agg;
      run["aggregate_unit"] = "time";
      pf.gbench_runs.push_back(run);
    }
    return decided(PointStatus::Ok, "");
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
      rates.record(kernel_label(r.kernel, r.isa), r.threads, r.problem.flops(), r.time_median());
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

namespace {
// The date and sequence number (1 without a suffix) of a default folder name
// "<YYYY-MM-DD>-<body>" or "<YYYY-MM-DD>-<body>-<N>"; nullopt for any other name.
std::optional<std::pair<std::string, long>> parse_folder_name(const std::string& name, const std::string& body) {
  if (name.size() < 11 + body.size() || name[10] != '-') return std::nullopt;
  for (int i = 0; i < 10; ++i) {
    const bool ok = (i == 4 || i == 7) ? name[i] == '-' : std::isdigit(static_cast<unsigned char>(name[i])) != 0;
    if (!ok) return std::nullopt;
  }
  const std::string date = name.substr(0, 10), rest = name.substr(11);
  if (rest == body) return std::make_pair(date, 1L);
  if (rest.size() <= body.size() + 1 || rest.compare(0, body.size(), body) != 0 || rest[body.size()] != '-') {
    return std::nullopt;
  }
  const std::string n = rest.substr(body.size() + 1);
  if (n.size() > 9 || n[0] == '0' || !std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::make_pair(date, std::stol(n));
}
}  // namespace

std::string choose_out_dir(const std::string& experiment, const SweepOptions& o) {
  if (!o.out_dir.empty()) return o.out_dir;
  namespace fs = std::filesystem;
  const std::string body =
      experiment +
      (o.shard_count > 1 ? "-shard" + std::to_string(o.shard_index) + "of" + std::to_string(o.shard_count) : "");
  if (o.resume) {
    // Newest by the creation time sweep.json records, then by name date and sequence
    // number (numerically: -10 is newer than -2); lexical order would put -10 first.
    using Key = std::tuple<int64_t, std::string, long>;
    std::optional<std::pair<Key, std::string>> newest;
    std::error_code ec;
    if (fs::is_directory(o.results_root, ec)) {
      for (const auto& d : fs::directory_iterator(o.results_root, ec)) {
        const auto parsed = parse_folder_name(d.path().filename().string(), body);
        const std::string path = d.path().string();
        if (!parsed || !d.is_directory() || !file_exists(path + "/sweep.json")) continue;
        try {
          const SweepPlan plan = SweepPlan::from_json(Json::parse(read_text_file(path + "/sweep.json")));
          // "quick-2" could be experiment quick's second folder or experiment quick-2's.
          if (plan.experiment != experiment || plan.shard_index != o.shard_index || plan.shard_count != o.shard_count) {
            continue;
          }
          const Key key{plan.created_unix_ns, parsed->first, parsed->second};
          if (!newest || newest->first < key) newest = {key, path};
        } catch (const std::exception&) {
          continue;  // not a readable sweep folder: not a candidate
        }
      }
    }
    if (newest) return newest->second;
  }
  const std::string base = o.results_root + "/" + today() + "-" + body;
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
  const int all_threads =
      o.all_threads > 0 ? o.all_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::vector<GridPoint> grid = expand(e, all_threads);

  SweepPlan plan;
  plan.experiment = e.name;
  plan.shard_index = o.shard_index;
  plan.shard_count = o.shard_count;
  plan.all_threads = all_threads;
  for (const auto& g : grid) plan.ids.push_back(g.id());

  Runner run{e, o, log, choose_out_dir(e.name, o), {}, {}, 0, {}, {}, nullptr};
  const std::string& dir = run.dir;
  const bool exists = file_exists(dir + "/sweep.json");
  std::map<std::string, PointFile> done;
  std::map<std::string, Json> attempts;  // points a process died on (resume)
  Json forced_resume;                    // set when --force resumed another build's folder
  if (exists) {
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
      forced_resume = check_same_build(dir, Json::parse(read_text_file(dir + "/machine.json")), o.force, log);
    }
    if (old.ids != plan.ids) {
      log << "note: the plan changed since the sweep started (kernels or core count); finished points are kept\n";
    }
    plan.created = old.created;
    plan.created_unix_ns = old.created_unix_ns;
    for (PointFile& pf : read_points(dir)) done[pf.record.id] = std::move(pf);
    attempts = read_attempts(dir);
  } else {
    plan.set_created_now();
  }
  make_dirs(points_dir(dir));
  // A marker beside its point file: the process died after writing the point.
  for (auto it = attempts.begin(); it != attempts.end();) {
    if (done.count(it->first)) {
      clear_attempt(dir, it->first);
      it = attempts.erase(it);
    } else {
      ++it;
    }
  }
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

  // Peaks: kept from an earlier start of this sweep, read from --peak-json, or measured now;
  // for the default target and every target of a SIMD point still to run (that this CPU
  // runs: the others are skipped), at every thread count still to run.
  std::vector<std::string> peak_isas;
  for (const GridPoint* g : todo) {
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
  bool peaks_from_file = false;
  if (!have_peaks && !o.peak_json.empty()) {
    run.peaks = Peaks::from_json(Json::parse(read_text_file(o.peak_json)));
    have_peaks = peaks_from_file = covers(run.peaks);
    if (!have_peaks) log << "note: " << o.peak_json << " lacks some thread counts or targets; measuring\n";
  }
  if (!have_peaks) {
    PeakOptions po;
    po.threads.assign(thread_counts.begin(), thread_counts.end());
    if (po.threads.empty()) po.threads = {all_threads};
    po.isas = peak_isas;
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
                       {"attnlab_flags", machine.value("flags", "")},
                       {"attnlab_min_time_s", e.min_time_s},  // the timing settings, not in the names
                       {"attnlab_repetitions", e.repetitions}};

  run.timing.repetitions = e.repetitions;
  run.timing.min_time_s = e.min_time_s;
  run.timing.seed = e.seed;
  run.memory_budget =
      e.memory_budget_mib > 0 ? e.memory_budget_mib * (1 << 20) : static_cast<double>(memory_budget_bytes());
  // Rates of points finished earlier (resume) inform the time estimates.
  for (const auto& [id, pf] : done) {
    const PointRecord& r = pf.record;
    if (r.status == PointStatus::Ok && !r.times.empty()) {
      // Points written before the isa column ran the default variant.
      const Kernel* old = r.isa.empty() ? find_kernel(r.kernel) : nullptr;
      run.rates.record(old ? kernel_label(*old) : kernel_label(r.kernel, r.isa), r.threads, r.problem.flops(),
                       r.time_median());
    }
  }

  if (!forced_resume.is_null()) {
    machine["forced_resumes"].push_back(forced_resume);
    write_file_atomic(dir + "/machine.json", machine.dump(2) + "\n");
  }

  std::vector<PointFile> all;
  for (auto& [id, pf] : done) all.push_back(pf);
  write_outputs(dir, plan, all);
  const StopSignals stop_signals;

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
      const Kernel* k = run.find(*todo[j]);
      if (!k) continue;
      const BenchPoint pt{k, todo[j]->problem, todo[j]->threads, todo[j]->isa};
      const double est = estimate_point_seconds(run.rates.estimate_seconds(pt), run.timing, true);
      if (est <= e.time_cap_s) eta += est;
    }
    char head[64];
    std::snprintf(head, sizeof head, "[%zu/%zu] ", sum.already + i + 1, sum.planned);
    log << head << describe_point(g, run.find(g)) << " | elapsed " << fmt_duration(seconds_since(start)) << ", ETA "
        << fmt_duration(eta) << std::flush;

    const PointRecord base = run.base_record(g);
    PointFile pf;
    if (const auto died = attempts.find(base.id); died != attempts.end()) {
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
    if (r.status == PointStatus::Ok) {
      ++sum.ok;
      const double t = r.time_median();
      char buf[160];
      std::snprintf(buf, sizeof buf, " -> ok %.3g ms, %.1f GFLOP/s", t * 1e3, r.problem.flops() / t * 1e-9);
      log << buf;
      if (r.peak_flops > 0) {
        std::snprintf(buf, sizeof buf, " (%.0f%% of the %s peak)", 100.0 * r.problem.flops() / t / r.peak_flops,
                      run.peaks.flops_name(r.isa).c_str());
        log << buf;
      }
      log << "\n";
    } else {
      (r.status == PointStatus::Failed ? sum.failed : sum.skipped)++;
      log << " -> " << to_string(r.status) << ": " << r.reason << "\n";
    }
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
          if (!done.count(pf.record.id)) --sum.ok;  // its first pass was counted ok by this run
        }
      }
    }
  }
  // The machine is shared: measure the peaks again at the end, so the report can show how
  // much they drifted while the points ran (fractions stay relative to the first
  // measurement). Not when the peaks were given (--peak-json).
  if (decided > 0 && !run.peaks.targets.empty() && !peaks_from_file) {
    PeakOptions po;
    for (const TargetPeaks& t : run.peaks.targets) {
      for (const auto& row : t.rows) {
        if (std::find(po.threads.begin(), po.threads.end(), row.threads) == po.threads.end()) {
          po.threads.push_back(row.threads);
        }
      }
      if (is_per_target_isa(t.isa) && cpu_runs_isa(t.isa)) po.isas.push_back(t.isa);
    }
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
      << (sum.passes_remaining
              ? ", " + std::to_string(sum.passes_remaining) + " later passes not run (stopped; --resume continues)"
              : "")
      << " in " << fmt_duration(seconds_since(start)) << " -> " << dir << "\n";
  return sum;
}

}  // namespace attnlab::bench
