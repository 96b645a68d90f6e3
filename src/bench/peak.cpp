#include "bench/peak.hpp"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include <xsimd/xsimd.hpp>

#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"
#include "bench/stats.hpp"

// The exp the kernels use. Its header is owned by the SIMD kernels; fall back to xsimd's
// exp (and say so in the results) when it is absent.
#if __has_include("cpu/simd/vec_math.hpp")
#include "cpu/simd/vec_math.hpp"
#define ATTN_PEAK_EXP(x) ::attnlab::simd::exp2(x)
#define ATTN_PEAK_EXP_NAME "attnlab::simd::exp2 (src/cpu/simd/vec_math.hpp)"
#else
#define ATTN_PEAK_EXP(x) ::xsimd::exp(x)
#define ATTN_PEAK_EXP_NAME "xsimd::exp (src/cpu/simd/vec_math.hpp not found)"
#endif

namespace attnlab::bench {

namespace {

using Batch = xsimd::batch<float>;
using Clock = std::chrono::steady_clock;
constexpr int kLanes = static_cast<int>(Batch::size);
// Independent FMA chains per thread: latency 4 x 2 pipes needs 8; 16 leaves slack and
// still fits the 32 vector registers (plus the two constants).
constexpr int kFmaChains = 16;
// exp buffer: 2 x 8 KiB in and out, L1-resident, so the loop measures the exp itself.
constexpr size_t kExpElems = 2048;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

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

// kFmaChains independent chains acc = acc * a + c, `iters` rounds. The result is returned
// so the compiler must compute it; a just below 1 keeps the values finite and normal.
__attribute__((noinline)) float fma_chains(int64_t iters) {
  Batch acc[kFmaChains];
  for (int j = 0; j < kFmaChains; ++j) acc[j] = Batch(1.0f + 0.001f * static_cast<float>(j));
  const Batch a(0.999999f), c(1e-6f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int j = 0; j < kFmaChains; ++j) acc[j] = xsimd::fma(acc[j], a, c);
  }
  Batch s = acc[0];
  for (int j = 1; j < kFmaChains; ++j) s += acc[j];
  return xsimd::hadd(s);
}

// Sum of data[0, count), count a multiple of 4 * kLanes, data 64-byte aligned.
__attribute__((noinline)) float stream_sum(const float* data, size_t count) {
  Batch s0(0.f), s1(0.f), s2(0.f), s3(0.f);
  for (size_t i = 0; i < count; i += 4 * kLanes) {
    s0 += Batch::load_aligned(data + i);
    s1 += Batch::load_aligned(data + i + kLanes);
    s2 += Batch::load_aligned(data + i + 2 * kLanes);
    s3 += Batch::load_aligned(data + i + 3 * kLanes);
  }
  return xsimd::hadd((s0 + s1) + (s2 + s3));
}

// `rounds` passes of out = exp(in) over kExpElems elements.
__attribute__((noinline)) float exp_rounds(const float* in, float* out, int64_t rounds) {
  for (int64_t r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < kExpElems; i += kLanes) {
      ATTN_PEAK_EXP(Batch::load_aligned(in + i)).store_aligned(out + i);
    }
  }
  float s = 0;
  for (size_t i = 0; i < kExpElems; i += 97) s += out[i];
  return s;
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

int hardware_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

std::string simd_arch_name() { return xsimd::default_arch::name(); }

}  // namespace

const char* exp_function_name() { return ATTN_PEAK_EXP_NAME; }

double measure_fma_flops(int threads, double seconds) {
  const int64_t iters = calibrate([](int64_t n) { g_sink = fma_chains(n); }, seconds);
  const double t = timed_parallel(threads, [&](int) { g_sink = fma_chains(iters); });
  return static_cast<double>(threads) * static_cast<double>(iters) * kFmaChains * kLanes * 2.0 / t;
}

double measure_read_bytes(int threads, const float* buffer, size_t count) {
  // Slices are multiples of the unroll (4 vectors) so every load stays aligned.
  const size_t unit = 4 * kLanes;
  const size_t per_thread = count / unit / static_cast<size_t>(threads) * unit;
  const double t = timed_parallel(threads, [&](int th) {
    g_sink = stream_sum(buffer + static_cast<size_t>(th) * per_thread, per_thread);
  });
  return static_cast<double>(per_thread) * static_cast<double>(threads) * sizeof(float) / t;
}

double measure_exp_per_s(int threads, double seconds) {
  auto make_input = [] {
    auto in = alloc_floats(kExpElems);
    // Softmax arguments after max subtraction (in log2 units): [-24, 0].
    for (size_t i = 0; i < kExpElems; ++i) in[i] = -24.0f * static_cast<float>(i) / kExpElems;
    return in;
  };
  auto in0 = make_input();
  auto out0 = alloc_floats(kExpElems);
  const int64_t rounds =
      calibrate([&](int64_t n) { g_sink = exp_rounds(in0.get(), out0.get(), n); }, seconds);
  std::vector<std::unique_ptr<float[], AlignedFree>> ins, outs;
  for (int t = 0; t < threads; ++t) {
    ins.push_back(make_input());
    outs.push_back(alloc_floats(kExpElems));
  }
  const double t = timed_parallel(threads, [&](int th) {
    g_sink = exp_rounds(ins[th].get(), outs[th].get(), rounds);
  });
  return static_cast<double>(threads) * static_cast<double>(rounds) * kExpElems / t;
}

Peaks measure_peaks(const PeakOptions& options) {
  if (options.repeats < 1) {
    throw InvalidInput("repeats: " + std::to_string(options.repeats) + " is not allowed; allowed: >= 1");
  }
  std::vector<int> counts = options.threads;
  if (counts.empty()) counts = {1, hardware_threads()};
  for (int t : counts) {
    if (t < 1 || t > 1024) {
      throw InvalidInput("threads: " + std::to_string(t) + " is not allowed; allowed: 1 to 1024");
    }
  }
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());

  Peaks peaks;
  peaks.simd_arch = simd_arch_name();
  peaks.lanes = kLanes;
  peaks.exp_function = exp_function_name();
  peaks.repeats = options.repeats;
  peaks.fma_chains = kFmaChains;
  const size_t unit = 4 * kLanes * 64;
  const size_t count = std::max(unit, options.buffer_bytes / sizeof(float) / unit * unit);
  peaks.buffer_bytes = count * sizeof(float);
  auto buffer = alloc_floats(count);
  for (size_t i = 0; i < count; ++i) buffer[i] = static_cast<float>(i & 1023) * 1e-3f;

  for (int t : counts) {
    PeakAtThreads row;
    row.threads = t;
    // Interleave the three probes so a burst of load from other users of the machine
    // hits all of them alike rather than one figure.
    for (int r = 0; r < options.repeats; ++r) {
      row.fma_runs.push_back(measure_fma_flops(t, options.seconds_per_run));
      row.read_runs.push_back(measure_read_bytes(t, buffer.get(), count));
      row.exp_runs.push_back(measure_exp_per_s(t, options.seconds_per_run));
    }
    row.fma_flops = median(row.fma_runs);
    row.read_bytes = median(row.read_runs);
    row.exp_per_s = median(row.exp_runs);
    peaks.rows.push_back(std::move(row));
  }
  return peaks;
}

const PeakAtThreads* Peaks::at(int threads) const {
  for (const auto& r : rows) {
    if (r.threads == threads) return &r;
  }
  return nullptr;
}

nlohmann::json Peaks::to_json() const {
  nlohmann::json j;
  j["schema"] = "attnlab-peak-1";
  j["simd_arch"] = simd_arch;
  j["lanes"] = lanes;
  j["exp_function"] = exp_function;
  j["buffer_bytes"] = buffer_bytes;
  j["repeats"] = repeats;
  j["fma_chains"] = fma_chains;
  j["units"] = {{"fma_flops", "FLOP/s"}, {"read_bytes", "bytes/s"}, {"exp_per_s", "exp/s"}};
  j["rows"] = nlohmann::json::array();
  for (const auto& r : rows) {
    j["rows"].push_back({{"threads", r.threads},
                         {"fma_flops", r.fma_flops},
                         {"read_bytes", r.read_bytes},
                         {"exp_per_s", r.exp_per_s},
                         {"fma_runs", r.fma_runs},
                         {"read_runs", r.read_runs},
                         {"exp_runs", r.exp_runs}});
  }
  return j;
}

Peaks Peaks::from_json(const nlohmann::json& j) {
  try {
    if (j.value("schema", "") != "attnlab-peak-1") {
      throw InvalidInput("peak JSON: schema is not 'attnlab-peak-1'; allowed: the output of attnlab peak --json");
    }
    Peaks p;
    p.simd_arch = j.at("simd_arch").get<std::string>();
    p.lanes = j.at("lanes").get<int>();
    p.exp_function = j.at("exp_function").get<std::string>();
    p.buffer_bytes = j.at("buffer_bytes").get<size_t>();
    p.repeats = j.at("repeats").get<int>();
    p.fma_chains = j.value("fma_chains", 0);
    for (const auto& r : j.at("rows")) {
      PeakAtThreads row;
      row.threads = r.at("threads").get<int>();
      row.fma_flops = r.at("fma_flops").get<double>();
      row.read_bytes = r.at("read_bytes").get<double>();
      row.exp_per_s = r.at("exp_per_s").get<double>();
      row.fma_runs = r.value("fma_runs", std::vector<double>{});
      row.read_runs = r.value("read_runs", std::vector<double>{});
      row.exp_runs = r.value("exp_runs", std::vector<double>{});
      p.rows.push_back(std::move(row));
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
  std::snprintf(line, sizeof line, "  SIMD: %s, %d float lanes; exp: %s; read buffer %.0f MiB\n",
                peaks.simd_arch.c_str(), peaks.lanes, peaks.exp_function.c_str(),
                static_cast<double>(peaks.buffer_bytes) / (1 << 20));
  out += line;
  std::snprintf(line, sizeof line, "  %7s  %-26s  %-24s  %-24s\n", "threads", "FMA GFLOP/s", "read GB/s", "exp Gexp/s");
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
  for (const auto& r : peaks.rows) {
    std::snprintf(line, sizeof line, "  %7d  %-26s  %-24s  %-24s\n", r.threads,
                  cell(r.fma_flops, r.fma_runs, 1e9).c_str(), cell(r.read_bytes, r.read_runs, 1e9).c_str(),
                  cell(r.exp_per_s, r.exp_runs, 1e9).c_str());
    out += line;
  }
  return out;
}

}  // namespace attnlab::bench
