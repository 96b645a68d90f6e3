#include "bench/sweep/bench_point.hpp"

#include <algorithm>
#include <cstdio>

#include "attnlab/kv_summary.hpp"
#include "attnlab/verify.hpp"

namespace attnlab::bench {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

std::string point_name(std::string_view kernel, const Problem& p, int threads, std::string_view named_isa) {
  return point_name(PointView{kernel, p, threads, named_isa, {}});
}

std::string point_id(std::string_view kernel, const Problem& p, int threads, std::string_view named_isa) {
  return point_id(PointView{kernel, p, threads, named_isa, {}});
}

std::string BenchPoint::name() const { return point_name(kernel->name(), problem, threads, named_isa); }
std::string BenchPoint::id() const { return point_id(kernel->name(), problem, threads, named_isa); }

size_t fixture_bytes(const Problem& p) {
  // random_tensors: Q, K, V (at p.dtype), O, LSE, each as alloc_bytes takes it
  // (allocated_bytes); a 16-bit problem also holds the float32 tensors its inputs are rounded
  // from (while converting, and for the sweep's error on the unrounded inputs).
  auto bytes = [](int64_t elems, size_t size) { return allocated_bytes(static_cast<size_t>(elems) * size); };
  const size_t in = static_cast<size_t>(dtype_bytes(p.dtype));
  size_t own = bytes(p.q_elems(), in) + bytes(p.kv_elems(), in) + bytes(p.v_elems(), in) + bytes(p.o_elems(), 4) +
               bytes(p.lse_elems(), 4);
  if (p.topk()) own += bytes(p.batch * p.kv_heads * summary_pages(p.kv_len) * 2 * p.head_dim, 4);  // the summaries
  if (p.dtype == DType::F32) return own;
  Problem f32 = p;
  f32.dtype = DType::F32;
  return own + fixture_bytes(f32);
}

size_t backward_point_bytes(const Kernel& k, const Problem& p, int threads) {
  if (p.pass == Pass::Forward) return 0;
  const auto f32 = [](int64_t elems) { return allocated_bytes(static_cast<size_t>(elems) * sizeof(float)); };
  const size_t grads = f32(p.q_elems()) + f32(p.kv_elems()) + f32(p.v_elems());
  // The fixture's dO and gradients; the check's own O, LSE, gradients, workspace and D per row.
  return f32(p.o_elems()) + 2 * grads + f32(p.o_elems()) + f32(p.lse_elems()) + k.backward_workspace_bytes(p, threads) +
         2 * f32(p.lse_elems());
}

size_t point_memory_bytes(const BenchPoint& pt, size_t verify_rows) {
  const Problem& p = pt.problem;
  const size_t backward = backward_point_bytes(*pt.kernel, p, pt.threads);
  // Timing reuses the verified inputs; its session's workspace replaces the verification's.
  if (verify_rows == 0) return fixture_bytes(p) + pt.kernel->workspace_bytes(p, pt.threads) + backward;
  return fixture_bytes(p) + verification_bytes(*pt.kernel, p, verify_rows, pt.threads) + backward;
}

ConstView PointFixture::d_o_view() const {
  const Problem& p = session->problem();
  return make_view<const float>(d_o.get(), p.batch, p.q_heads, p.q_len, p.dim_v(), p.layout);
}

void PointFixture::run_pass() {
  const Inputs& in = tensors.inputs;
  const Outputs& out = tensors.outputs;
  switch (session->problem().pass) {
    case Pass::Forward: session->run(in, out); break;
    case Pass::Backward: session->run_backward(in, {d_o_view(), as_const(out.o), out.lse}, grads.grads); break;
    case Pass::ForwardBackward:
      session->run(in, out);
      session->run_backward(in, {d_o_view(), as_const(out.o), out.lse}, grads.grads);
      break;
  }
}

std::unique_ptr<float[], AlignedFree> random_d_o(const Problem& p, uint64_t seed) {
  auto d_o = alloc_floats(static_cast<size_t>(p.o_elems()));
  fill_uniform(d_o.get(), p.o_elems(), seed + 1);
  return d_o;
}

void prepare_backward(PointFixture& f, const Problem& p, uint64_t seed) {
  if (p.pass == Pass::Forward) return;
  f.d_o = random_d_o(p, seed);
  f.grads = allocate_gradients(p);
  f.session->run(f.tensors.inputs, f.tensors.outputs);
}

std::unique_ptr<PointFixture> make_fixture(const BenchPoint& pt, uint64_t seed) {
  auto f = std::make_unique<PointFixture>();
  f->id = pt.id();
  f->session = std::make_unique<Session>(*pt.kernel, pt.problem, pt.threads);
  f->tensors = random_tensors(pt.problem, seed);
  prepare_backward(*f, pt.problem, seed);
  return f;
}

PointFixture& FixtureSlot::get(const BenchPoint& pt, uint64_t seed) {
  const std::string id = pt.id();
  if (!held_ || held_->id != id) {
    held_.reset();  // free the previous point's tensors before allocating these
    held_ = make_fixture(pt, seed);
  }
  return *held_;
}

void RateBook::record(const std::string& kernel, int threads, double flops_per_run, double seconds_per_run) {
  if (!(seconds_per_run > 0) || !(flops_per_run > 0)) return;
  Entry& e = entries_[{kernel, threads}];
  if (flops_per_run >= e.flops) e = Entry{flops_per_run, flops_per_run / seconds_per_run};
}

double RateBook::estimate_seconds(const BenchPoint& pt, std::string* basis, double peak_flops) const {
  const std::string kname = kernel_label(*pt.kernel);
  const double flops = pt.problem.flops();
  auto say = [&](const std::string& s) {
    if (basis) *basis = s;
  };
  char buf[160];
  if (auto it = entries_.find({kname, pt.threads}); it != entries_.end()) {
    std::snprintf(buf, sizeof buf, "%s at %.2f GFLOP/s measured on a %.3g GFLOP point", kname.c_str(),
                  it->second.rate * 1e-9, it->second.flops * 1e-9);
    say(buf);
    return flops / it->second.rate;
  }
  const Entry* same_kernel = nullptr;
  const Entry* slowest = nullptr;
  for (const auto& [key, e] : entries_) {
    if (key.first == kname && (!same_kernel || e.flops > same_kernel->flops)) same_kernel = &e;
    if (!slowest || e.rate < slowest->rate) slowest = &e;
  }
  if (same_kernel) {
    std::snprintf(buf, sizeof buf, "%s at %.2f GFLOP/s measured at another thread count", kname.c_str(),
                  same_kernel->rate * 1e-9);
    say(buf);
    return flops / same_kernel->rate;
  }
  // Nothing measured for this kernel: the least time it can take, at the machine's measured
  // peak. The point's verification is then its first call, and the time cap is checked again
  // on that call (run_point), so a slow kernel is caught after one call, a fast one never
  // skipped for what another kernel or a constant would have taken.
  if (peak_flops > 0) {
    std::snprintf(buf, sizeof buf, "no %s point yet; at least this at the measured peak, %.1f GFLOP/s", kname.c_str(),
                  peak_flops * 1e-9);
    say(buf);
    return flops / peak_flops;
  }
  if (slowest) {
    std::snprintf(buf, sizeof buf, "no %s point yet; slowest kernel so far, %.2f GFLOP/s", kname.c_str(),
                  slowest->rate * 1e-9);
    say(buf);
    return flops / slowest->rate;
  }
  std::snprintf(buf, sizeof buf, "nothing measured yet; assumed %.1f GFLOP/s", kDefaultRate * 1e-9);
  say(buf);
  return flops / kDefaultRate;
}

double estimate_point_seconds(double run_seconds, const TimingOptions& t, bool with_verify) {
  // Google Benchmark grows the iteration count until one repetition lasts min_time, then
  // repeats; a run longer than min_time is one iteration per repetition.
  const double min_time = t.min_time_s > 0 ? t.min_time_s : 0.5;
  const double per_rep = std::max(run_seconds, min_time);
  return (with_verify ? run_seconds : 0.0) + std::max(1, t.repetitions) * per_rep + std::min(run_seconds, min_time);
}

void set_point_counters(benchmark::State& state, const BenchPoint& pt, const PeakRef& peak, size_t workspace_bytes) {
  using C = benchmark::Counter;
  const Problem& p = pt.problem;
  const double flops = p.flops();
  const double bytes = p.bytes_moved();
  auto& c = state.counters;
  c["flops_per_second"] = C(flops, C::kIsIterationInvariantRate);
  c["bytes_per_second"] = C(bytes, C::kIsIterationInvariantRate);
  if (peak.flops > 0) c["peak_fraction"] = C(flops / peak.flops, C::kIsIterationInvariantRate);
  if (peak.read_bytes > 0) c["bw_fraction"] = C(bytes / peak.read_bytes, C::kIsIterationInvariantRate);
  c["extra_bytes"] = C(static_cast<double>(workspace_bytes));
  c["flop_count"] = C(flops);
  c["byte_count"] = C(bytes);
  c["kv_byte_count"] = C(p.kv_bytes());
  // The point's fields (point_schema.cpp), so plots read counters and never parse names.
  const PointView view{pt.kernel->name(), p, pt.threads, pt.named_isa, {}};
  for (const PointField& f : point_fields()) {
    if (f.counter) c[f.counter] = C(f.counter_value(view));
  }
}

benchmark::internal::Benchmark* register_point(const BenchPoint& pt, const PeakRef& peak, const TimingOptions& timing,
                                               RegisterHooks hooks) {
  const uint64_t seed = timing.seed;
  auto* b = benchmark::RegisterBenchmark(pt.name().c_str(), [pt, peak, seed, hooks](benchmark::State& state) {
    if (hooks.skip_reason) {
      const std::string why = hooks.skip_reason(pt);
      if (!why.empty()) {
        state.SkipWithError(why.c_str());
        return;
      }
    }
    try {
      PointFixture& f = hooks.slot->get(pt, seed);
      Session& session = *f.session;
      const auto t0 = Clock::now();
      for (auto _ : state) {
        f.run_pass();
        benchmark::ClobberMemory();
      }
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      if (hooks.rates) {
        hooks.rates->record(kernel_label(*pt.kernel), pt.threads, pt.problem.flops(),
                            secs / static_cast<double>(std::max<int64_t>(1, state.iterations())));
      }
      set_point_counters(state, pt, peak, session.workspace_bytes());
      state.SetLabel(pt.problem.describe() + ", isa " + std::string(pt.kernel->isa()));
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
    }
  });
  b->UseRealTime()->Unit(benchmark::kMillisecond);
  if (timing.min_time_s > 0) b->MinTime(timing.min_time_s);
  if (timing.repetitions > 1) b->Repetitions(timing.repetitions);
  return b;
}

}  // namespace attnlab::bench
