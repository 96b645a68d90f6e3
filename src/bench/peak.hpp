// The machine's limits, measured: what "% of peak" in every benchmark and report means.
//
// For each requested thread count (1 and all cores by default):
//   fma   float32 FMA throughput (FLOP/s) at the vector width of one instruction-set
//         target (PeakOptions::isa, default: default_isa(), include/attnlab/isa.hpp):
//         16 lanes with avx512, 8 with avx2, 1 with scalar (a multiply and an add).
//         Each thread runs kFmaChains independent register-resident `acc = acc * a + b`
//         chains (16 with 32 vector registers, 12 with 16), more than 4-cycle FMA latency x
//         2 FMA pipes, so the loop is throughput bound, not latency bound. 2 FLOP per lane
//         per FMA. The loops are the target's own (src/cpu/target.cpp).
//   read  streaming read bandwidth (bytes/s): each thread sums its contiguous slice of a
//         buffer far larger than the last-level cache (512 MiB default, 32 MiB L3 here),
//         with 4 vector accumulators. The buffer is written before timing (page faults
//         excluded).
//   exp   throughput (exp/s) of the vector exp the target's kernels use (simd::exp2 from
//         src/cpu/simd/vec_math.hpp, log2(e) folded into the score scale) on an
//         L1-resident buffer: load, exp, store.
// Every figure is the median of `repeats` runs; the runs themselves are kept. All threads
// of a run start together (barrier) and the run's time is first start to last finish.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace attnlab::bench {

struct PeakOptions {
  std::vector<int> threads;       // thread counts to measure; empty = {1, all cores}
  int repeats = 5;                // runs per figure (median reported)
  size_t buffer_bytes = size_t{512} << 20;  // read-bandwidth buffer
  double seconds_per_run = 0.1;   // target length of one run
  std::string isa;                // target whose loops run; "" = default_isa()
};

struct PeakAtThreads {
  int threads = 1;
  double fma_flops = 0;       // FLOP/s, median
  double read_bytes = 0;      // bytes/s, median
  double exp_per_s = 0;       // exp/s, median
  std::vector<double> fma_runs, read_runs, exp_runs;
};

struct Peaks {
  std::vector<PeakAtThreads> rows;  // ascending thread count
  std::string simd_arch;            // the target measured, e.g. "avx512" (isa.hpp)
  int lanes = 0;                    // floats per vector
  std::string exp_function;         // which exp was measured
  size_t buffer_bytes = 0;
  int repeats = 0;
  int fma_chains = 0;

  // The row for exactly this thread count, or nullptr.
  const PeakAtThreads* at(int threads) const;
  nlohmann::json to_json() const;
  static Peaks from_json(const nlohmann::json& j);  // throws InvalidInput on bad JSON
};

Peaks measure_peaks(const PeakOptions& options);

// Each measurement alone (one run, `threads` threads), for tests and the sweep.
// `isa` "" = default_isa(); count: a multiple of 4 * lanes; buffer 64-byte aligned.
double measure_fma_flops(int threads, double seconds, const std::string& isa = {});
double measure_read_bytes(int threads, const float* buffer, size_t count, const std::string& isa = {});
double measure_exp_per_s(int threads, double seconds, const std::string& isa = {});

// A table of the medians (GFLOP/s, GB/s, Gexp/s, with min-max spread over the runs).
std::string format_peaks(const Peaks& peaks);

// Name of the exp measured (and used by the kernels).
const char* exp_function_name();

}  // namespace attnlab::bench
