#include "peaks/peak.hpp"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "attnlab/cuda.hpp"
#include "attnlab/isa.hpp"
#include "attnlab/kernel.hpp"
#include "attnlab/limits.hpp"
#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"
#include "peaks/stats.hpp"
#include "cpu/dispatch/isa_internal.hpp"

namespace attnlab::peaks {

namespace {

using Clock = std::chrono::steady_clock;

// The target whose loops are timed: `isa`, or default_isa() when empty (checked).
const TargetTable& table_for(const std::string& isa) {
  const std::string name = isa.empty() ? default_isa() : isa;
  require_isa(name);
  return *target_table_for(name);
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Runs body(thread_index) on `threads` threads that start together; returns the time from
// the first start to the last finish.
template <class Body>
double timed_parallel(int threads, Body&& body) {
  std::barrier sync(threads);
  std::vector<Clock::time_point> start(threads), end(threads);
  auto worker = [&](int t) {
    sync.arrive_and_wait();
    start[t] = Clock::now();
    body(t);
    end[t] = Clock::now();
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker, t);
  worker(0);
  for (auto& th : pool) th.join();
  const auto first = *std::min_element(start.begin(), start.end());
  const auto last = *std::max_element(end.begin(), end.end());
  return std::chrono::duration<double>(last - first).count();
}

volatile float g_sink = 0;

// Smallest iteration count whose single-thread run takes `seconds` (doubling, then scaled).
template <class Fn>
int64_t calibrate(Fn&& run_iters, double seconds) {
  int64_t n = 64;
  for (;;) {
    const auto t0 = Clock::now();
    run_iters(n);
    const double t = seconds_since(t0);
    if (t > 0.01 || n > (int64_t{1} << 40)) {
      return std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(n) * seconds / std::max(t, 1e-9)));
    }
    n *= 2;
  }
}

}  // namespace

const char* exp_function_name() { return "attnlab::<target>::simd::exp2 (src/cpu/simd/vec_math.hpp)"; }

namespace {
// FLOP/s of `threads` threads each running loop(iters), flop_per_iter FLOP per iteration, with
// iters calibrated on one thread to take `seconds`.
double loop_flops(int threads, double seconds, float (*loop)(int64_t), double flop_per_iter) {
  const int64_t iters = calibrate([&](int64_t n) { g_sink = loop(n); }, seconds);
  const double t = timed_parallel(threads, [&](int) { g_sink = loop(iters); });
  return static_cast<double>(threads) * static_cast<double>(iters) * flop_per_iter / t;
}
}  // namespace

double measure_fma_flops(int threads, double seconds, const std::string& isa) {
  const TargetTable& tt = table_for(isa);
  return loop_flops(threads, seconds, tt.peak.fma_chains, tt.peak.fma_chain_count * tt.lanes * 2.0);
}

namespace {
// About `bytes` of floats, a multiple of 4 vectors x 64 of `lanes` (the streaming loops' unroll),
// written (page faults happen here, not in the timed runs).
std::pair<std::unique_ptr<float[], AlignedFree>, size_t> read_buffer(size_t bytes, int lanes) {
  const size_t unit = 4 * static_cast<size_t>(lanes) * 64;
  const size_t count = std::max(unit, bytes / sizeof(float) / unit * unit);
  auto buffer = alloc_floats(count);
  for (size_t i = 0; i < count; ++i) buffer[i] = static_cast<float>(i & 1023) * 1e-3f;
  return {std::move(buffer), count};
}
}  // namespace

double measure_read_bandwidth(int threads, size_t bytes, int runs) {
  const auto [buffer, count] = read_buffer(bytes, 16);
  std::vector<double> v;
  for (int r = 0; r < std::max(1, runs); ++r) v.push_back(measure_read_bytes(threads, buffer.get(), count));
  return median(v);
}

ReadProbe::~ReadProbe() { AlignedFree{}(buffer_); }

double ReadProbe::measure(int threads) {
  if (!buffer_) {
    auto [buffer, count] = read_buffer(bytes_, 16);
    buffer_ = buffer.release(), count_ = count;
  }
  return measure_read_bytes(threads, buffer_, count_);
}

bool runs_disagree(const std::vector<double>& runs, double limit) {
  if (runs.size() < 2) return false;
  const auto [lo, hi] = std::minmax_element(runs.begin(), runs.end());
  const double mid = median(runs);
  return mid > 0 && (*hi - *lo) > limit * mid;
}

double measure_read_bytes(int threads, const float* buffer, size_t count, const std::string& isa) {
  const TargetTable& tt = table_for(isa);
  // Slices are multiples of the unroll (4 vectors) so every load stays aligned.
  const size_t unit = 4 * static_cast<size_t>(tt.lanes);
  const size_t per_thread = count / unit / static_cast<size_t>(threads) * unit;
  const double t = timed_parallel(
      threads, [&](int th) { g_sink = tt.peak.stream_sum(buffer + static_cast<size_t>(th) * per_thread, per_thread); });
  return static_cast<double>(per_thread) * static_cast<double>(threads) * sizeof(float) / t;
}

double measure_exp_per_s(int threads, double seconds, const std::string& isa) {
  const TargetTable& tt = table_for(isa);
  const size_t kExpElems = tt.peak.exp_elems;
  auto make_input = [&] {
    auto in = alloc_floats(kExpElems);
    // Softmax arguments after max subtraction (in log2 units): [-24, 0].
    for (size_t i = 0; i < kExpElems; ++i) in[i] = -24.0f * static_cast<float>(i) / kExpElems;
    return in;
  };
  auto in0 = make_input();
  auto out0 = alloc_floats(kExpElems);
  const int64_t rounds = calibrate([&](int64_t n) { g_sink = tt.peak.exp_rounds(in0.get(), out0.get(), n); }, seconds);
  std::vector<std::unique_ptr<float[], AlignedFree>> ins, outs;
  for (int t = 0; t < threads; ++t) {
    ins.push_back(make_input());
    outs.push_back(alloc_floats(kExpElems));
  }
  const double t =
      timed_parallel(threads, [&](int th) { g_sink = tt.peak.exp_rounds(ins[th].get(), outs[th].get(), rounds); });
  return static_cast<double>(threads) * static_cast<double>(rounds) * kExpElems / t;
}

bool bf16_dot_runnable() { return bf16_table() != nullptr && cpu_runs_isa(kBf16Isa); }

double measure_bf16_dot_flops(int threads, double seconds) {
  if (!bf16_dot_runnable()) return 0;
  return loop_flops(threads, seconds, bf16_table()->dot_chains, bf16_table()->dot_chain_count * 64.0);
}

bool amx_bf16_runnable() {
  const Bf16Table* bt = bf16_table();
  return bt && cpu_runs_isa(kAmxIsa) && bt->flash_amx->available();  // (which requests the tile state)
}

double measure_amx_bf16_flops(int threads, double seconds) {
  if (!amx_bf16_runnable()) return 0;
  return loop_flops(threads, seconds, bf16_table()->amx_rounds, bf16_table()->amx_tiles * 16384.0);
}

bool amx_int8_runnable() {
  const Bf16Table* bt = bf16_table();
  return bt && cpu_runs_isa(kAmxInt8Isa) && bt->flash_int8_amx->available();  // (which requests the tile state)
}

double measure_amx_int8_ops(int threads, double seconds) {
  if (!amx_int8_runnable()) return 0;
  return loop_flops(threads, seconds, bf16_table()->amx_int8_rounds, bf16_table()->amx_tiles * 32768.0);
}

// The target's vpdpbusd, where it has one and this CPU runs it (0 otherwise).
double measure_i8_dot_ops(int threads, double seconds, const TargetTable& tt) {
  if (!tt.peak.i8_chains || !cpu_runs_isa(tt.peak.i8_unit)) return 0;
  return loop_flops(threads, seconds, tt.peak.i8_chains, tt.peak.i8_chain_count * 8.0 * tt.lanes);
}

Peaks measure_peaks(const PeakOptions& options) {
  if (options.repeats < 1) {
    throw InvalidInput("repeats: " + std::to_string(options.repeats) + " is not allowed; allowed: >= 1");
  }
  std::vector<int> counts = options.threads;
  if (counts.empty()) counts = {1, all_cores()};
  for (int& t : counts) t = thread_count(t);
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());

  // The targets, checked, in build order (narrowest first), the default one always.
  Peaks peaks;
  peaks.simd_arch = default_isa();
  std::vector<std::string> wanted = options.isas;
  wanted.push_back(peaks.simd_arch);
  for (const std::string& isa : wanted) require_isa(isa);
  std::vector<const TargetTable*> tables;
  for (const std::string& isa : built_isas()) {
    if (std::find(wanted.begin(), wanted.end(), isa) == wanted.end()) continue;
    const TargetTable& tt = table_for(isa);
    tables.push_back(&tt);
    TargetPeaks tp;
    tp.isa = tt.isa;
    tp.lanes = tt.lanes;
    tp.fma_chains = tt.peak.fma_chain_count;
    peaks.targets.push_back(std::move(tp));
  }
  peaks.exp_function = exp_function_name();
  peaks.repeats = options.repeats;
  if (const auto gpu = cuda::device_info()) {
    peaks.gpu.name = gpu->name;
    peaks.gpu.fp32_flops = gpu->fp32_peak_tflops * 1e12;
    peaks.gpu.read_bytes = gpu->mem_bandwidth_gbs * 1e9;
  }
  // One buffer for every target: a multiple of the widest unroll.
  int max_lanes = 1;
  for (const TargetTable* tt : tables) max_lanes = std::max(max_lanes, tt->lanes);
  const auto [buffer, count] = read_buffer(options.buffer_bytes, max_lanes);
  peaks.buffer_bytes = count * sizeof(float);

  const bool bf16 = bf16_dot_runnable(), amx = amx_bf16_runnable(), amx_i8 = amx_int8_runnable();
  size_t def = 0;  // the default target's index: its rows carry the bf16 dot-product peak
  while (def + 1 < tables.size() && tables[def]->isa != peaks.simd_arch) ++def;
  for (int t : counts) {
    std::vector<PeakAtThreads> rows(tables.size());
    // Interleave the probes and the targets so a burst of load from other users of the
    // machine hits all of them alike rather than one figure or one target.
    for (int r = 0; r < options.repeats; ++r) {
      for (size_t i = 0; i < tables.size(); ++i) {
        const std::string isa = tables[i]->isa;
        rows[i].fma_runs.push_back(measure_fma_flops(t, options.seconds_per_run, isa));
        rows[i].read_runs.push_back(measure_read_bytes(t, buffer.get(), count, isa));
        rows[i].exp_runs.push_back(measure_exp_per_s(t, options.seconds_per_run, isa));
        if (const double ops = measure_i8_dot_ops(t, options.seconds_per_run, *tables[i]); ops > 0)
          rows[i].i8_dot_runs.push_back(ops);
      }
      if (bf16) rows[def].bf16_dot_runs.push_back(measure_bf16_dot_flops(t, options.seconds_per_run));
      if (amx) rows[def].amx_bf16_runs.push_back(measure_amx_bf16_flops(t, options.seconds_per_run));
      if (amx_i8) rows[def].amx_int8_runs.push_back(measure_amx_int8_ops(t, options.seconds_per_run));
    }
    for (size_t i = 0; i < tables.size(); ++i) {
      PeakAtThreads& row = rows[i];
      row.threads = t;
      row.fma_flops = median(row.fma_runs);
      row.read_bytes = median(row.read_runs);
      row.exp_per_s = median(row.exp_runs);
      if (!row.bf16_dot_runs.empty()) row.bf16_dot_flops = median(row.bf16_dot_runs);
      if (!row.amx_bf16_runs.empty()) row.amx_bf16_flops = median(row.amx_bf16_runs);
      if (!row.i8_dot_runs.empty()) row.i8_dot_ops = median(row.i8_dot_runs);
      if (!row.amx_int8_runs.empty()) row.amx_int8_ops = median(row.amx_int8_runs);
      peaks.targets[i].rows.push_back(std::move(row));
    }
  }
  return peaks;
}

const PeakAtThreads* TargetPeaks::at(int threads) const {
  for (const auto& r : rows) {
    if (r.threads == threads) return &r;
  }
  return nullptr;
}

const TargetPeaks* Peaks::target(std::string_view isa) const {
  for (const auto& t : targets) {
    if (t.isa == isa) return &t;
  }
  return nullptr;
}

const PeakAtThreads* Peaks::at(int threads) const { return at(simd_arch, threads); }

const PeakAtThreads* Peaks::at(std::string_view isa, int threads) const {
  const TargetPeaks* t = target(isa);
  return t ? t->at(threads) : nullptr;
}

PeakRef Peaks::ref(std::string_view kernel_isa, int threads) const {
  PeakRef ref;
  if (kernel_isa == cuda::kIsa) return {gpu.fp32_flops, gpu.read_bytes};
  if (const PeakAtThreads* d = at(threads)) ref.read_bytes = d->read_bytes;
  // flash_int8_amx (amx_int8): against the AMX bf16 tile peak, the unit of its P.V (its int8
  // scores run on TDPBSSD, up to twice that rate).
  if (kernel_isa == kBf16Isa || kernel_isa == kAmxIsa || kernel_isa == kAmxInt8Isa) {
    if (const PeakAtThreads* d = at(threads))
      ref.flops = kernel_isa == kBf16Isa ? d->bf16_dot_flops : d->amx_bf16_flops;
    return ref;
  }
  const PeakAtThreads* fma = is_per_target_isa(kernel_isa) ? at(kernel_isa, threads) : at(threads);
  if (fma) ref.flops = fma->fma_flops;
  return ref;
}

double Peaks::int8_ops(std::string_view kernel_isa, int threads) const {
  if (kernel_isa == kAmxInt8Isa) {
    const PeakAtThreads* d = at(threads);
    return d ? d->amx_int8_ops : 0;
  }
  const PeakAtThreads* t = is_per_target_isa(kernel_isa) ? at(kernel_isa, threads) : at(threads);
  return t ? t->i8_dot_ops : 0;
}

std::string Peaks::flops_name(std::string_view kernel_isa) const {
  if (kernel_isa == kBf16Isa) return std::string(kBf16Isa) + " dot-product";
  if (kernel_isa == kAmxIsa || kernel_isa == kAmxInt8Isa) return std::string(kAmxIsa) + " tile";
  if (kernel_isa == cuda::kIsa) return "GPU FP32" + (gpu.name.empty() ? std::string() : " (" + gpu.name + ")");
  return is_per_target_isa(kernel_isa) ? std::string(kernel_isa) : simd_arch;
}

bool Peaks::covers(const std::vector<std::string>& isas, const std::vector<int>& threads) const {
  for (int t : threads) {
    if (!at(t)) return false;
    for (const std::string& isa : isas) {
      if (!at(isa, t)) return false;
    }
  }
  return true;
}

namespace {

nlohmann::json rows_to_json(const std::vector<PeakAtThreads>& rows) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& r : rows) {
    a.push_back({{"threads", r.threads},
                 {"fma_flops", r.fma_flops},
                 {"read_bytes", r.read_bytes},
                 {"exp_per_s", r.exp_per_s},
                 {"fma_runs", r.fma_runs},
                 {"read_runs", r.read_runs},
                 {"exp_runs", r.exp_runs}});
    if (r.bf16_dot_flops > 0) {
      a.back()["bf16_dot_flops"] = r.bf16_dot_flops;
      a.back()["bf16_dot_runs"] = r.bf16_dot_runs;
    }
    if (r.amx_bf16_flops > 0) {
      a.back()["amx_bf16_flops"] = r.amx_bf16_flops;
      a.back()["amx_bf16_runs"] = r.amx_bf16_runs;
    }
    if (r.i8_dot_ops > 0) {
      a.back()["i8_dot_ops"] = r.i8_dot_ops;
      a.back()["i8_dot_runs"] = r.i8_dot_runs;
    }
    if (r.amx_int8_ops > 0) {
      a.back()["amx_int8_ops"] = r.amx_int8_ops;
      a.back()["amx_int8_runs"] = r.amx_int8_runs;
    }
  }
  return a;
}

std::vector<PeakAtThreads> rows_from_json(const nlohmann::json& a) {
  std::vector<PeakAtThreads> rows;
  for (const auto& r : a) {
    PeakAtThreads row;
    row.threads = r.at("threads").get<int>();
    row.fma_flops = r.at("fma_flops").get<double>();
    row.read_bytes = r.at("read_bytes").get<double>();
    row.exp_per_s = r.at("exp_per_s").get<double>();
    row.fma_runs = r.value("fma_runs", std::vector<double>{});
    row.read_runs = r.value("read_runs", std::vector<double>{});
    row.exp_runs = r.value("exp_runs", std::vector<double>{});
    row.bf16_dot_flops = r.value("bf16_dot_flops", 0.0);
    row.bf16_dot_runs = r.value("bf16_dot_runs", std::vector<double>{});
    row.amx_bf16_flops = r.value("amx_bf16_flops", 0.0);
    row.amx_bf16_runs = r.value("amx_bf16_runs", std::vector<double>{});
    row.i8_dot_ops = r.value("i8_dot_ops", 0.0);
    row.i8_dot_runs = r.value("i8_dot_runs", std::vector<double>{});
    row.amx_int8_ops = r.value("amx_int8_ops", 0.0);
    row.amx_int8_runs = r.value("amx_int8_runs", std::vector<double>{});
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace

nlohmann::json Peaks::to_json() const {
  nlohmann::json j;
  j["schema"] = "attnlab-peak-2";
  // The default target's figures where schema attnlab-peak-1 had them (its readers keep working).
  const TargetPeaks* d = target(simd_arch);
  j["simd_arch"] = simd_arch;
  j["lanes"] = d ? d->lanes : 0;
  j["fma_chains"] = d ? d->fma_chains : 0;
  j["exp_function"] = exp_function;
  j["buffer_bytes"] = buffer_bytes;
  j["repeats"] = repeats;
  j["units"] = {{"fma_flops", "FLOP/s"}, {"read_bytes", "bytes/s"}, {"exp_per_s", "exp/s"}};
  j["rows"] = rows_to_json(d ? d->rows : std::vector<PeakAtThreads>{});
  j["targets"] = nlohmann::json::array();
  for (const auto& t : targets) {
    j["targets"].push_back(
        {{"isa", t.isa}, {"lanes", t.lanes}, {"fma_chains", t.fma_chains}, {"rows", rows_to_json(t.rows)}});
  }
  if (!gpu.name.empty()) {
    j["gpu"] = {{"name", gpu.name},
                {"fp32_flops", gpu.fp32_flops},
                {"read_bytes", gpu.read_bytes},
                {"source", "device properties: SMs x FP32 lanes x 2 x peak clock; nominal memory bandwidth"}};
  }
  return j;
}

Peaks Peaks::from_json(const nlohmann::json& j) {
  try {
    const std::string schema = j.value("schema", "");
    if (schema != "attnlab-peak-1" && schema != "attnlab-peak-2") {
      throw InvalidInput(
          "peak JSON: schema '" + schema +
          "' is not allowed; allowed: attnlab-peak-1 or attnlab-peak-2 (the output of attnlab peak --json)");
    }
    Peaks p;
    p.simd_arch = j.at("simd_arch").get<std::string>();
    p.exp_function = j.at("exp_function").get<std::string>();
    p.buffer_bytes = j.at("buffer_bytes").get<size_t>();
    p.repeats = j.at("repeats").get<int>();
    if (j.contains("targets")) {
      for (const auto& t : j.at("targets")) {
        TargetPeaks tp;
        tp.isa = t.at("isa").get<std::string>();
        tp.lanes = t.at("lanes").get<int>();
        tp.fma_chains = t.value("fma_chains", 0);
        tp.rows = rows_from_json(t.at("rows"));
        p.targets.push_back(std::move(tp));
      }
    } else {  // attnlab-peak-1: one target, the one simd_arch names
      TargetPeaks tp;
      tp.isa = p.simd_arch;
      tp.lanes = j.at("lanes").get<int>();
      tp.fma_chains = j.value("fma_chains", 0);
      tp.rows = rows_from_json(j.at("rows"));
      p.targets.push_back(std::move(tp));
    }
    if (j.contains("gpu")) {
      const auto& g = j.at("gpu");
      p.gpu.name = g.at("name").get<std::string>();
      p.gpu.fp32_flops = g.at("fp32_flops").get<double>();
      p.gpu.read_bytes = g.at("read_bytes").get<double>();
    }
    if (!p.target(p.simd_arch)) {
      throw InvalidInput("peak JSON: simd_arch '" + p.simd_arch + "' names none of its targets");
    }
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw InvalidInput(std::string("peak JSON: ") + e.what());
  }
}

std::string format_peaks(const Peaks& peaks) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "machine peaks (median of %d runs; min-max in brackets)\n", peaks.repeats);
  out += line;
  std::snprintf(line, sizeof line, "  exp: %s; read buffer %.0f MiB; default target %s\n", peaks.exp_function.c_str(),
                static_cast<double>(peaks.buffer_bytes) / (1 << 20), peaks.simd_arch.c_str());
  out += line;
  auto cell = [](double med, const std::vector<double>& runs, double unit) {
    char c[64];
    const auto [lo, hi] = std::minmax_element(runs.begin(), runs.end());
    if (runs.empty()) {
      std::snprintf(c, sizeof c, "%.1f", med / unit);
    } else {
      std::snprintf(c, sizeof c, "%.1f [%.1f-%.1f]", med / unit, *lo / unit, *hi / unit);
    }
    return std::string(c);
  };
  const TargetPeaks* narrowest = peaks.targets.empty() ? nullptr : &peaks.targets.front();
  for (const TargetPeaks& t : peaks.targets) {
    std::snprintf(line, sizeof line, "  %s: %d float lanes, %d FMA chains%s\n", t.isa.c_str(), t.lanes, t.fma_chains,
                  t.isa == peaks.simd_arch ? " (default)" : "");
    out += line;
    std::snprintf(line, sizeof line, "  %7s  %-26s  %-24s  %-24s%s\n", "threads", "FMA GFLOP/s", "read GB/s",
                  "exp Gexp/s", peaks.targets.size() > 1 ? "  FMA vs " : "");
    out += line;
    if (peaks.targets.size() > 1) {
      out.pop_back();
      out += narrowest->isa + "\n";
    }
    for (const auto& r : t.rows) {
      std::snprintf(line, sizeof line, "  %7d  %-26s  %-24s  %-24s", r.threads,
                    cell(r.fma_flops, r.fma_runs, 1e9).c_str(), cell(r.read_bytes, r.read_runs, 1e9).c_str(),
                    cell(r.exp_per_s, r.exp_runs, 1e9).c_str());
      out += line;
      const PeakAtThreads* base = narrowest->at(r.threads);
      if (peaks.targets.size() > 1 && base && base->fma_flops > 0) {
        std::snprintf(line, sizeof line, "  %.1fx", r.fma_flops / base->fma_flops);
        out += line;
      }
      out += "\n";
    }
  }
  // A spread past 20% of the median: the machine moved while the runs ran (a shared host).
  for (const TargetPeaks& t : peaks.targets) {
    for (const auto& r : t.rows) {
      for (const auto& [what, runs] : {std::pair{"FMA", &r.fma_runs}, std::pair{"read", &r.read_runs}}) {
        if (!runs_disagree(*runs)) continue;
        const auto [lo, hi] = std::minmax_element(runs->begin(), runs->end());
        std::snprintf(line, sizeof line,
                      "  warning: %s %s at %d threads: runs disagree by %.0f%% of their median (%.1f-%.1f): the "
                      "machine moved; the sweep measures read bandwidth beside each memory-bound point\n",
                      t.isa.c_str(), what, r.threads, 100.0 * (*hi - *lo) / median(*runs), *lo / 1e9, *hi / 1e9);
        out += line;
      }
    }
  }
  if (const TargetPeaks* d = peaks.target(peaks.simd_arch)) {
    const auto bf16_line = [&](const char* what, int threads, double med, const std::vector<double>& runs, double fma) {
      std::snprintf(line, sizeof line, "  %s, %d threads: %s GFLOP/s, %.2fx the %s FMA peak\n", what, threads,
                    cell(med, runs, 1e9).c_str(), fma > 0 ? med / fma : 0.0, d->isa.c_str());
      out += line;
    };
    for (const auto& r : d->rows) {
      if (r.bf16_dot_flops > 0) {
        bf16_line("bf16 dot products (vdpbf16ps, flash_bf16's peak)", r.threads, r.bf16_dot_flops, r.bf16_dot_runs,
                  r.fma_flops);
      }
      if (r.amx_bf16_flops > 0) {
        bf16_line("AMX bf16 tiles (tdpbf16ps, flash_amx's peak)", r.threads, r.amx_bf16_flops, r.amx_bf16_runs,
                  r.fma_flops);
      }
      if (r.amx_int8_ops > 0) {
        std::snprintf(line, sizeof line,
                      "  AMX int8 tiles (tdpbssd, flash_int8_amx's scores), %d threads: %s GOP/s, "
                      "%.2fx the %s FMA peak\n",
                      r.threads, cell(r.amx_int8_ops, r.amx_int8_runs, 1e9).c_str(),
                      r.fma_flops > 0 ? r.amx_int8_ops / r.fma_flops : 0.0, d->isa.c_str());
        out += line;
      }
    }
  }
  // Each target's int8 unit (vpdpbusd: decode_i8's and flash_int8's scores).
  for (const TargetPeaks& t : peaks.targets) {
    for (const auto& r : t.rows) {
      if (r.i8_dot_ops <= 0) continue;
      std::snprintf(line, sizeof line, "  int8 dot products (vpdpbusd, %s), %d threads: %s GOP/s, %.2fx its FMA peak\n",
                    t.isa.c_str(), r.threads, cell(r.i8_dot_ops, r.i8_dot_runs, 1e9).c_str(),
                    r.fma_flops > 0 ? r.i8_dot_ops / r.fma_flops : 0.0);
      out += line;
    }
  }
  return out;
}

}  // namespace attnlab::peaks
