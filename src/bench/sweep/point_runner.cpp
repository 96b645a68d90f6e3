#include "bench/sweep/point_runner.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include <benchmark/benchmark.h>

#include "attnlab/isa.hpp"
#include "attnlab/kv_summary.hpp"
#include "attnlab/limits.hpp"
#include "attnlab/npy.hpp"
#include "attnlab/verify.hpp"
#include "bench/results/files.hpp"
#include "bench/sweep/gbench_capture.hpp"
#include "bench/results/machine.hpp"
#include "bench/using.hpp"

namespace attnlab::bench {

namespace {

using Clock = std::chrono::steady_clock;

std::string fmt_mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f MiB", bytes / (1 << 20));
  return buf;
}

// Whether a point's inputs are stored other than as float32 (16-bit, or a quantized cache).
bool stored_not_float32(const Problem& p) { return p.dtype != DType::F32 || p.kv_quantized(); }

}  // namespace

const Kernel* Runner::find(const GridPoint& g) const {
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

PointRecord Runner::base_record(const GridPoint& g) const {
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
  // The roofline's unit (PointRecord::unit_peak): an int8-products kernel's vpdpbusd; a peer's bf16
  // point in its own bf16 arithmetic (the bf16_products policy), the bf16 dot product's peak.
  r.unit_peak = ref.flops;
  if (is_peer_kernel(g.kernel)) {
    if (peer_policy(g.kernel) == PeerPolicy::Bf16Products && peer_keeps_own_cache(g.kernel, g.problem)) {
      if (const PeakAtThreads* d = peaks.at(g.threads); d && d->bf16_dot_flops > 0) r.unit_peak = d->bf16_dot_flops;
    }
  } else if (k && k->arithmetic() == Arithmetic::Int8Products) {
    if (const double i8 = peaks.int8_ops(r.isa, g.threads); i8 > 0) r.unit_peak = i8;
  }
  return r;
}

// The agreement on the float32 values a point's stored inputs were rounded (or quantized) from,
// on the same rows: O against it is the storage's end-to-end cost.
Agreement Runner::unrounded_agreement(const Problem& p, const std::vector<RowId>& rows) const {
  Problem f32 = p;
  f32.dtype = DType::F32;
  f32.kv_dtype = KvDType::Same;
  f32.kv_block = 0;  // the same values; the reference reads a paged cache as a contiguous one anyway
  const Tensors source = workload_tensors(f32, e.seed, e.needles);
  return prepare_agreement(f32, source.inputs, rows);
}

PointFile Runner::decide(const GridPoint& g, const PointRecord& base) {
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
  // The session's: a backward point's is the larger of the two passes' workspaces.
  r.extra_bytes = k->workspace_bytes(g.problem, g.threads);
  if (g.problem.pass != Pass::Forward) {
    r.extra_bytes = std::max(r.extra_bytes, k->backward_workspace_bytes(g.problem, g.threads));
  }
  // A memory-bound point also holds the read probe's buffer (allocated at the first one).
  r.memory_bytes =
      point_memory_bytes(pt, static_cast<size_t>(e.verify_rows)) + (memory_bound(r) ? read_probe.buffer_bytes() : 0);
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
    fixture->tensors = workload_tensors(g.problem, e.seed, e.needles);
    const Inputs& in = fixture->tensors.inputs;
    const auto rows = sample_rows(g.problem, static_cast<size_t>(e.verify_rows), e.seed);
    KernelCheck check;
    double verify_run = 0;
    if (g.problem.topk()) {
      // An approximation: its exact part by the agreement rule, its accuracy measured (check_topk;
      // its runs are not one forward's time).
      const auto tv = Clock::now();
      const TopkCheck tc = check_topk(*k, g.problem, in, rows, g.threads);
      verify_run = seconds_since(tv);
      check = tc.exact;
      r.recall_min = tc.recall_min, r.recall_mean = tc.recall_mean, r.err_o_rel_dense = tc.err_dense;
    } else {
      const Agreement ag = prepare_agreement(g.problem, in, rows);
      const auto tv = Clock::now();
      check = check_kernel(*k, g.problem, in, ag, g.threads);
      verify_run = seconds_since(tv);
    }
    r.verdict = to_string(check.verdict);
    r.err_o_rel = check.errors.o_rel;
    r.err_lse = check.errors.lse;
    r.tol_o_rel = check.tol.o_rel;
    r.tol_lse = check.tol.lse;
    r.verify_rows = static_cast<int>(rows.size());
    r.err_o_rel_f32_inputs = r.err_o_rel;
    if (stored_not_float32(g.problem) && !g.problem.topk() && check.verdict == Verdict::Pass) {
      // The same kernel on the same stored inputs, against float64 on the float32 values
      // they were rounded (or quantized) from: the storage's end-to-end cost.
      r.err_o_rel_f32_inputs =
          check_kernel(*k, g.problem, in, unrounded_agreement(g.problem, rows), g.threads).errors.o_rel;
    }
    if (check.verdict == Verdict::Skip) return skip("verification skipped: " + check.reason);
    if (check.verdict == Verdict::Fail) {
      r.status = PointStatus::Failed;
      r.reason = "disagrees with the float64 reference: " + check.reason;
      r.seconds_spent = seconds_since(t0);
      return pf;
    }
    // The verification ran the forward: its rate, not the pass's (a topk check's runs and references
    // are not one forward's).
    if (!g.problem.topk()) rates.record(kernel_label(*k), g.threads, g.problem.forward_flops(), verify_run);
    fixture->session = std::make_unique<Session>(*k, g.problem, g.threads);
    if (g.problem.pass != Pass::Forward) {
      // The gradients too: on sampled rows and keys (a sparse pattern or score modifications: every
      // element, naive's sizes), from the kernel's own forward and the dO the timing uses.
      prepare_backward(*fixture, g.problem, e.seed);
      const ConstView d_o = fixture->d_o_view();
      const BackwardCheck bc =
          g.problem.sparse() || g.problem.score_mods()
              ? check_backward(*k, g.problem, in, d_o, prepare_backward_agreement(g.problem, in, d_o), g.threads)
              : check_backward_sampled(*k, g.problem, in, d_o,
                                       sample_grads(g.problem, static_cast<size_t>(e.verify_rows), e.seed), g.threads);
      r.err_grad = bc.errors;
      r.tol_grad = bc.tol;
      if (bc.verdict == Verdict::Skip) return skip("backward verification skipped: " + bc.reason);
      if (bc.verdict == Verdict::Fail) {
        r.verdict = to_string(Verdict::Fail);
        r.status = PointStatus::Failed;
        r.reason = "gradients disagree with the float64 reference: " + bc.reason;
        r.seconds_spent = seconds_since(t0);
        return pf;
      }
    }
    // The verification run is a measurement too: a first point of a slow kernel that
    // turns out to exceed the cap stops here.
    // (a backward's call: the forward's time scaled by the FLOP ratio)
    const double fwd = g.problem.forward_flops();
    double pass_run = fwd > 0 ? verify_run * g.problem.flops() / fwd : verify_run;
    if (g.problem.topk()) {  // check_topk's time is mostly its references: one run of the session instead
      const auto tr = Clock::now();
      fixture->session->run(in, fixture->tensors.outputs);
      pass_run = seconds_since(tr);
    }
    const double timing_est = estimate_point_seconds(pass_run, timing, false);
    if (timing_est > e.time_cap_s) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "time cap: verified, but timing estimated %.0f s > %.0f s (one run %.2f s)",
                    timing_est, e.time_cap_s, pass_run);
      return skip(buf);
    }
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

PointFile Runner::decide_peer(const GridPoint& g, const PointRecord& base) {
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
  if (p.topk()) {
    return decided(PointStatus::Skipped, "unsupported: topk_tokens " + std::to_string(p.topk_tokens) +
                                             " (no peer runs a query-aware sparse decode on a CPU; its dense points "
                                             "are the comparison)");
  }
  r.memory_bytes = peer_memory_bytes(g.kernel, p) + verification_bytes(*find_kernel("naive"), p, e.verify_rows, 1);
  if (static_cast<double>(r.memory_bytes) > memory_budget) {
    return decided(PointStatus::Skipped, "memory: needs " + fmt_mib(static_cast<double>(r.memory_bytes)) +
                                             " > budget " + fmt_mib(memory_budget));
  }
  try {
    const Tensors t = workload_tensors(p, e.seed, e.needles);
    const auto rows = sample_rows(p, static_cast<size_t>(e.verify_rows), e.seed);
    const Agreement ag = prepare_agreement(p, t.inputs, rows);
    const bool backward = p.pass != Pass::Forward;
    if (backward && p.sparse()) {
      return decided(PointStatus::Skipped, "a peer's backward on a sparse pattern is not checked (naive's is)");
    }
    const auto d_o = backward ? random_d_o(p, e.seed) : nullptr;  // the lab's points' dO
    if (!peers) peers = std::make_unique<PeerPool>(log, o.peers_python, o.peers_serve);
    PeerAnswer a = peers->run(g.kernel, p, t.inputs, g.threads, {e.repetitions, e.min_time_s, e.time_cap_s}, d_o.get());
    r.version = a.version;
    r.how = a.how;
    if (a.extra_bytes >= 0) r.extra_bytes = static_cast<size_t>(a.extra_bytes);  // measured, not declared
    if (a.status == PeerAnswer::Status::Skipped) return decided(PointStatus::Skipped, a.reason);
    if (a.status == PeerAnswer::Status::Failed) return decided(PointStatus::Failed, "peer: " + a.reason);
    const MutView ov = make_view<float>(a.o.data.data(), p.batch, p.q_heads, p.q_len, p.dim_v(), Layout::BHSD);
    const Errors err = measure(ag.ref, as_const(ov), nullptr, p);  // peers give no LSE
    const PeerTolerance pt = peer_tolerance(g.kernel, p, t.inputs, ag);
    if (!pt.rule.empty()) r.how += "; " + pt.rule;
    r.err_o_rel = r.err_o_rel_f32_inputs = err.o_rel;
    if (stored_not_float32(p)) {  // as a kernel's row: what the cache type costs, end to end
      r.err_o_rel_f32_inputs = measure(unrounded_agreement(p, rows).ref, as_const(ov), nullptr, p).o_rel;
    }
    r.err_lse = std::numeric_limits<double>::quiet_NaN();
    r.tol_o_rel = pt.tol.o_rel;
    r.tol_lse = pt.tol.lse;
    r.verify_rows = static_cast<int>(rows.size());
    const std::string why = pt.tol.why_failed(err);
    r.verdict = to_string(why.empty() ? Verdict::Pass : Verdict::Fail);
    if (!why.empty()) return decided(PointStatus::Failed, "disagrees with the float64 reference: " + why);
    if (backward) {
      // The reference gradients given an O and LSE: the lab's flash forward's (the peer gives no
      // LSE; flash's agrees with float64 within its tolerance), sampled rows and keys.
      Problem forward = p;
      forward.pass = Pass::Forward;
      Tensors fo = allocate_outputs(forward);
      Session(*find_kernel("flash"), forward, g.threads).run(t.inputs, fo.outputs);
      const ConstView dov = make_view<const float>(d_o.get(), p.batch, p.q_heads, p.q_len, p.dim_v(), p.layout);
      const SampledGradAgreement sa =
          prepare_sampled_backward(p, t.inputs, dov, as_const(fo.outputs.o), fo.outputs.lse,
                                   sample_grads(p, static_cast<size_t>(e.verify_rows), e.seed));
      const auto view = [&](NpyArray& x, int64_t heads, int64_t seq, int64_t dim) {
        return make_view<float>(x.data.data(), p.batch, heads, seq, dim, Layout::BHSD);
      };
      const Gradients pg{view(a.dq, p.q_heads, p.q_len, p.head_dim), view(a.dk, p.kv_heads, p.kv_len, p.head_dim),
                         view(a.dv, p.kv_heads, p.kv_len, p.dim_v())};
      r.err_grad = measure_sampled_grads(sa, pg, p);
      r.tol_grad = sa.tol;
      if (const std::string gwhy = sa.tol.why_failed(r.err_grad); !gwhy.empty()) {
        r.verdict = to_string(Verdict::Fail);
        return decided(PointStatus::Failed, "gradients disagree with the float64 reference: " + gwhy);
      }
    }
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

bool Runner::memory_bound(const PointRecord& r) {
  const Problem& p = r.problem;
  // A decode (a few query rows against a longer cache, the report's rule: scripts/report/load.py
  // is_decode) reads the cache per token whatever its FLOP per byte: a quantized cache's can sit
  // above the ridge while the cache's bytes are still what the point is about.
  const bool decode = p.q_len <= 16 && p.q_len < p.kv_len;
  return r.peak_flops > 0 && r.peak_read_bytes > 0 && r.isa != "cuda" &&
         (decode || p.flops() / p.bytes_moved() < r.peak_flops / r.peak_read_bytes);
}

PointFile Runner::time_point(const BenchPoint& pt, const PointRecord& base, const RegisterHooks& hooks) {
  PointFile pf;
  pf.record = base;
  PointRecord& r = pf.record;
  init_benchmark_once();
  const PeakRef peak{r.peak_flops, r.peak_read_bytes};
  register_point(pt, peak, timing, hooks);
  // A memory-bound point: the read bandwidth just before and just after its repetitions, by the
  // same loop as `attnlab peak`.
  const bool probe = memory_bound(r);
  if (probe) r.read_probe.push_back(read_probe.measure(r.threads));
  CaptureReporter capture;
  benchmark::RunSpecifiedBenchmarks(&capture);
  benchmark::ClearRegisteredBenchmarks();
  if (probe) r.read_probe.push_back(read_probe.measure(r.threads));
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

}  // namespace attnlab::bench
