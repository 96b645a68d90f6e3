// One benchmark point (kernel x problem x threads) and its Google Benchmark registration:
// the single place that decides what is timed and which counters are reported. Both the
// attn_bench binary and `attnlab sweep` register points through register_point().
//
// Timed region: Session::run only (inputs, outputs, workspace and arena exist before the
// loop), wall-clock time (UseRealTime: the kernels run on a TBB arena, so the main thread's
// CPU time would be wrong).
//
// Counters (names as they appear in Google Benchmark's JSON):
//   flops_per_second   Problem::flops() per second (visible pairs only)
//   bytes_per_second   Problem::bytes_moved() per second (compulsory Q, K, V, O, LSE)
//   peak_fraction      FLOP/s / measured FMA peak for this thread count (attnlab peak)
//   bw_fraction        bytes/s / measured read bandwidth for this thread count
//   extra_bytes        the kernel's workspace for this problem and thread count
//   flop_count, byte_count, kv_byte_count   per run
//   and each point field's counter (point_schema.cpp: batch, q_heads, kv_heads, q_len,
//   kv_len, head_dim, head_dim_v, causal, window_left, window_right, bshd, dtype_bytes,
//   threads), so plots read fields and never parse names.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <benchmark/benchmark.h>

#include "attnlab/kernel.hpp"
#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"
#include "bench/using.hpp"

namespace attnlab::bench {

struct BenchPoint {
  const Kernel* kernel = nullptr;
  Problem problem;
  int threads = 1;
  // The target named in the id and name: set when an experiment lists targets (its `isa`
  // key) for a kernel with per-target variants; empty otherwise, so a point of the default
  // target keeps the id it had before the isa axis (old results folders still resume).
  std::string named_isa;

  // Google Benchmark name: attn/flash/b:1/hq:8/hkv:8/sq:4096/sk:4096/d:128/mask:none/t:2
  // (plus /isa:avx2 when named_isa is set)
  std::string name() const;
  // File-system safe id, unique within an experiment: flash-b1-hq8-hkv8-sq4096-sk4096-d128-none-t2
  // (plus -avx2 when named_isa is set)
  std::string id() const;
};

// The id and name of a point given the kernel's name (point_schema.hpp; BenchPoint::id/name
// call these).
std::string point_id(std::string_view kernel, const Problem& p, int threads, std::string_view named_isa = {});
std::string point_name(std::string_view kernel, const Problem& p, int threads, std::string_view named_isa = {});

// Memory a point needs while it is verified (on up to `verify_rows` sampled rows) and
// timed: its Q, K, V, O, LSE (fixture_bytes) plus verification_bytes (verify.hpp), which
// holds the workspace; with verify_rows 0 (not verified), the fixture and the workspace.
size_t fixture_bytes(const Problem& p);
size_t point_memory_bytes(const BenchPoint& pt, size_t verify_rows);

struct TimingOptions {
  int repetitions = 1;      // <= 1: Google Benchmark's --benchmark_repetitions applies
  double min_time_s = 0.5;  // <= 0: --benchmark_min_time applies
  uint64_t seed = 1;
};

// The inputs, outputs and session of the point being timed. One slot is kept alive at a
// time: a big point's tensors are freed as soon as another point is run.
struct PointFixture {
  std::string id;
  Tensors tensors;
  std::unique_ptr<Session> session;
  // A point whose pass is not the forward (Problem::pass): dO (random, O's shape and layout)
  // and the gradients; tensors.outputs then hold the forward's O and LSE the backward reads.
  std::unique_ptr<float[], AlignedFree> d_o;
  GradientTensors grads;
  ConstView d_o_view() const;
  // One timed call of the point's pass.
  void run_pass();
};
// A backward point's dO: O's shape and layout, uniform in [-1, 1) from seed + 1 (as attnlab verify
// --backward), the same for the lab's points and the peers'.
std::unique_ptr<float[], AlignedFree> random_d_o(const Problem& p, uint64_t seed);
// Allocates dO (random_d_o) and the gradients of a
// fixture whose problem is not a forward, and runs the forward once (the backward alone reads
// its O and LSE); nothing for a forward.
void prepare_backward(PointFixture& f, const Problem& p, uint64_t seed);
// Bytes prepare_backward and a sampled backward check add to a point (0 for a forward).
size_t backward_point_bytes(const Kernel& k, const Problem& p, int threads);
class FixtureSlot {
 public:
  // The fixture for this point, creating it (random inputs from seed) when the slot holds
  // another one or none.
  PointFixture& get(const BenchPoint& pt, uint64_t seed);
  void put(std::unique_ptr<PointFixture> f) { held_ = std::move(f); }
  void clear() { held_.reset(); }

 private:
  std::unique_ptr<PointFixture> held_;
};
std::unique_ptr<PointFixture> make_fixture(const BenchPoint& pt, uint64_t seed);

// Observed FLOP rates, to estimate how long a point will take before running it (the time
// cap). Kernels are told apart by kernel_label (each target of a SIMD kernel has its own
// rate: scalar is many times slower than avx512). The estimate for a kernel uses the rate
// it reached on its largest point so far at the same thread count, else at any thread
// count, else (nothing measured for it) the machine's measured peak `peak_flops` - a lower
// bound: the point's first call then measures it -, else the slowest rate of any kernel, else
// kDefaultRate.
class RateBook {
 public:
  static constexpr double kDefaultRate = 1e9;  // FLOP/s, the naive kernel's order
  // One run of a point: its FLOP count and how long the run took. `kernel`: kernel_label.
  void record(const std::string& kernel, int threads, double flops_per_run, double seconds_per_run);
  // Seconds one run of the point should take, and what the estimate rests on.
  double estimate_seconds(const BenchPoint& pt, std::string* basis = nullptr, double peak_flops = 0) const;

 private:
  struct Entry {
    double flops = 0;  // of the largest point so far
    double rate = 0;   // FLOP/s on it
  };
  std::map<std::pair<std::string, int>, Entry> entries_;
};

// Seconds a point will take: one verification run, then `repetitions` repetitions of at
// least min_time_s each (at least one run each).
double estimate_point_seconds(double run_seconds, const TimingOptions& t, bool with_verify);

struct RegisterHooks {
  std::shared_ptr<FixtureSlot> slot;  // required
  std::shared_ptr<RateBook> rates;    // optional: record observed rates
  // Optional: a non-empty reason skips the point (SkipWithError) before any allocation.
  std::function<std::string(const BenchPoint&)> skip_reason;
};

benchmark::internal::Benchmark* register_point(const BenchPoint& pt, const PeakRef& peak, const TimingOptions& timing,
                                               RegisterHooks hooks);

// The counters above, for `iterations`-independent per-run values.
void set_point_counters(benchmark::State& state, const BenchPoint& pt, const PeakRef& peak, size_t workspace_bytes);

}  // namespace attnlab::bench
