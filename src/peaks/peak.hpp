// The machine's limits, measured: what "% of peak" in every benchmark and report means.
//
// For each requested instruction-set target (PeakOptions::isas, include/attnlab/isa.hpp;
// `attnlab peak` measures every target this CPU runs, a sweep the targets its points use)
// and each requested thread count (1 and all cores by default):
//   fma   float32 FMA throughput (FLOP/s) at the target's vector width: 16 lanes with
//         avx512, 8 with avx2, 1 with scalar (a multiply and an add).
//         Each thread runs kFmaChains independent register-resident `acc = acc * a + b`
//         chains (16 with 32 vector registers, 12 with 16), more than 4-cycle FMA latency x
//         2 FMA pipes, so the loop is throughput bound, not latency bound. 2 FLOP per lane
//         per FMA. The loops are the target's own (src/cpu/dispatch/target.cpp).
//   read  streaming read bandwidth (bytes/s): each thread sums its contiguous slice of a
//         buffer far larger than the last-level cache (512 MiB default, 32 MiB L3 here),
//         with 4 vector accumulators. The buffer is written before timing (page faults
//         excluded).
//   exp   throughput (exp/s) of the vector exp the target's kernels use (simd::exp2 from
//         src/cpu/simd/vec_math.hpp, log2(e) folded into the score scale) on an
//         L1-resident buffer: load, exp, store.
//   bf16 dot  where the CPU has AVX512_BF16 (and the build its avx512_bf16 object): the
//         vdpbf16ps throughput (FLOP/s; 32 bf16 products = 64 FLOP per instruction), in the
//         default target's rows, kDotChains register-resident chains per thread like fma.
//   amx bf16  where the CPU has AMX-BF16 (and the OS grants the tile state): the TDPBF16PS
//         throughput (16 x 16 x 32 products = 16384 FLOP per instruction; four independent
//         accumulator tiles per thread), in the default target's rows.
//   int8 dot  per target, where the CPU has that target's int8 unit (AVX512-VNNI for avx512,
//         AVX-VNNI for avx2): the vpdpbusd throughput in integer ops/s (4 byte products and their
//         sums per 32-bit lane = 8 ops), chains as fma; the unit decode_i8 and flash_int8 score on.
//   amx int8  where the CPU has AMX-INT8: TDPBSSD (16 x 16 x 64 products = 32768 ops), as amx bf16.
// Every figure is the median of `repeats` runs; the runs themselves are kept. All threads
// of a run start together (barrier) and the run's time is first start to last finish. The
// targets are measured in turn inside each repetition, so a burst of load from other users
// of the machine hits every target alike and their ratios stay meaningful.
//
// What a point's "% of peak" is relative to (Peaks::ref, the one rule): the FMA peak of the
// point's own target (a SIMD kernel's isa()); for kernels built once ("baseline", "cuda")
// the default target's; the bf16 dot-product peak for flash_bf16 (isa avx512_bf16), the AMX
// bf16 peak for flash_amx (isa amx_bf16). Read bandwidth does not depend on the vector width: always the
// default target's figure. CUDA kernels (isa "cuda") are measured against the GPU, never the CPU: its
// FP32 (non-tensor) peak and nominal memory bandwidth from the device's properties (Peaks::gpu,
// recorded when a device is usable; without one their fractions are omitted).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace attnlab {
struct TargetTable;  // src/cpu/dispatch/target.hpp
}  // namespace attnlab

namespace attnlab::peaks {

struct PeakOptions {
  std::vector<int> threads;                 // thread counts to measure; empty = {1, all cores}
  int repeats = 5;                          // runs per figure (median reported)
  size_t buffer_bytes = size_t{512} << 20;  // read-bandwidth buffer
  double seconds_per_run = 0.1;             // target length of one run
  // Targets whose loops run (each checked: built and run by this CPU); empty = the
  // default target only. The default target (default_isa()) is always measured too.
  std::vector<std::string> isas;
};

struct PeakAtThreads {
  int threads = 1;
  double fma_flops = 0;       // FLOP/s, median
  double read_bytes = 0;      // bytes/s, median
  double exp_per_s = 0;       // exp/s, median
  double bf16_dot_flops = 0;  // FLOP/s, median (default target's rows; 0 = not measured)
  double amx_bf16_flops = 0;  // FLOP/s, median (default target's rows; 0 = not measured)
  double i8_dot_ops = 0;      // integer ops/s of the target's vpdpbusd, median (0 = no such unit here)
  double amx_int8_ops = 0;    // integer ops/s of TDPBSSD, median (default target's rows; 0 = not measured)
  std::vector<double> fma_runs, read_runs, exp_runs, bf16_dot_runs, amx_bf16_runs, i8_dot_runs, amx_int8_runs;
};

// The peaks of one target.
struct TargetPeaks {
  std::string isa;  // e.g. "avx2"
  int lanes = 0;    // floats per vector
  int fma_chains = 0;
  std::vector<PeakAtThreads> rows;  // ascending thread count
  // The row for exactly this thread count, or nullptr.
  const PeakAtThreads* at(int threads) const;
};

// What a point's fractions are relative to (0 = not measured: fraction omitted).
struct PeakRef {
  double flops = 0;       // FLOP/s
  double read_bytes = 0;  // bytes/s
};

// The CUDA device's limits, from its properties (cuda::DeviceInfo): not measured, computed.
struct GpuPeaks {
  std::string name;       // empty: no usable device when the peaks were taken
  double fp32_flops = 0;  // FLOP/s: SMs x FP32 lanes x 2 x peak clock
  double read_bytes = 0;  // bytes/s: nominal memory bandwidth
};

// JSON (schema attnlab-peak-2): "targets": [{isa, lanes, fma_chains, rows}, ...] narrowest
// first, and, as in schema attnlab-peak-1 (which from_json still reads: one target, named
// by simd_arch), "simd_arch", "lanes", "fma_chains" and "rows" of the default target.
struct Peaks {
  std::vector<TargetPeaks> targets;  // narrowest first
  std::string simd_arch;             // the default target when measured (isa.hpp)
  std::string exp_function;          // which exp was measured
  size_t buffer_bytes = 0;
  int repeats = 0;
  GpuPeaks gpu;  // JSON "gpu", present only with a device

  // The target's peaks, or nullptr when it was not measured.
  const TargetPeaks* target(std::string_view isa) const;
  // The default target's row for exactly this thread count, or nullptr.
  const PeakAtThreads* at(int threads) const;
  // The row of `isa` for exactly this thread count, or nullptr.
  const PeakAtThreads* at(std::string_view isa, int threads) const;
  // The peaks a point of a kernel built for `kernel_isa` (Kernel::isa()) at `threads`
  // threads is measured against: the FMA peak of that target when it is a per-target
  // build (0 when that target was not measured), the default target's for kernels built
  // once ("baseline"); the default target's read bandwidth for all; for "cuda" the GPU's
  // FP32 peak and memory bandwidth (0 without a device: fractions omitted, never the CPU's).
  PeakRef ref(std::string_view kernel_isa, int threads) const;
  // The integer dot-product peak (ops/s) of a kernel built for `kernel_isa`: that target's
  // vpdpbusd (sdot), or TDPBSSD for amx_int8; 0 when not measured or the CPU has no such unit.
  double int8_ops(std::string_view kernel_isa, int threads) const;
  // What ref's flops is, in words: "avx512" (that target's FMA), "avx512_bf16 dot-product".
  std::string flops_name(std::string_view kernel_isa) const;
  // Whether every target in `isas` (and the default target) has a row for every thread
  // count in `threads`.
  bool covers(const std::vector<std::string>& isas, const std::vector<int>& threads) const;
  nlohmann::json to_json() const;
  static Peaks from_json(const nlohmann::json& j);  // throws InvalidInput on bad JSON
};

Peaks measure_peaks(const PeakOptions& options);

// Each measurement alone (one run, `threads` threads), for tests and the sweep.
// `isa` "" = default_isa(); count: a multiple of 4 * lanes; buffer 64-byte aligned.
double measure_fma_flops(int threads, double seconds, const std::string& isa = {});
double measure_read_bytes(int threads, const float* buffer, size_t count, const std::string& isa = {});
// The read bandwidth (default target) at `threads` threads over a buffer of about `bytes`,
// written before timing: the median of `runs` measure_read_bytes runs (attnlab generate, the
// Python module; measure_peaks shares its buffer between targets instead).
double measure_read_bandwidth(int threads, size_t bytes, int runs);
// The read bandwidth measured beside a memory-bound point (the sweep: before and after each
// pass of its repetitions), so its % of bandwidth is against what the machine gave while it
// ran - on a shared host the 2-thread read rate moves by up to 2x within an hour. The buffer
// (PeakOptions::buffer_bytes, far above the L3) is written once and kept between points.
class ReadProbe {
 public:
  ReadProbe() : ReadProbe(PeakOptions{}.buffer_bytes) {}
  explicit ReadProbe(size_t bytes) : bytes_(bytes) {}
  ~ReadProbe();
  ReadProbe(const ReadProbe&) = delete;
  ReadProbe& operator=(const ReadProbe&) = delete;
  double measure(int threads);  // bytes/s, one pass over the buffer (default target)
  void set_bytes(size_t bytes) { bytes_ = buffer_ ? bytes_ : bytes; }  // before the first measure
  size_t buffer_bytes() const { return bytes_; }                       // at most this is allocated

 private:
  size_t bytes_;
  float* buffer_ = nullptr;
  size_t count_ = 0;
};
// Runs (bytes/s, FLOP/s, ...) whose spread (max - min) exceeds `limit` of their median: the
// machine moved while they ran (attnlab peak warns; 0.2 = 20%).
bool runs_disagree(const std::vector<double>& runs, double limit = 0.2);
double measure_exp_per_s(int threads, double seconds, const std::string& isa = {});
// 0 when this build or CPU has no AVX512_BF16 (bf16_dot_runnable()), resp. no usable AMX-BF16.
bool bf16_dot_runnable();
double measure_bf16_dot_flops(int threads, double seconds);
bool amx_bf16_runnable();
double measure_amx_bf16_flops(int threads, double seconds);
// The int8 units: AMX-INT8's TDPBSSD (0 without a usable one) and a target's vpdpbusd (0 where the
// target has no VNNI path or this CPU lacks it), in integer ops/s.
bool amx_int8_runnable();
double measure_amx_int8_ops(int threads, double seconds);
double measure_i8_dot_ops(int threads, double seconds, const TargetTable& tt);

// A table of the medians per target (GFLOP/s, GB/s, Gexp/s, with min-max spread over the
// runs), and the ratio of each target's FMA peak to the narrowest one's.
std::string format_peaks(const Peaks& peaks);

// Name of the exp measured (and used by the kernels).
const char* exp_function_name();

}  // namespace attnlab::peaks
