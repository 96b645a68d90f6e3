// The sweep's point runner: decides one grid point - skipped (not in this build, over the
// memory budget or the time cap, the CPU lacks its target), failed (it disagrees with the
// float64 reference, or timing failed) or timed through Google Benchmark - and records it.
// Peer points (peers.hpp) go to their server instead. run_sweep (sweep.cpp) drives it.
#pragma once

#include <chrono>
#include <memory>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "attnlab/kernel.hpp"
#include "bench/sweep/bench_point.hpp"
#include "bench/sweep/experiment.hpp"
#include "bench/using.hpp"
#include "bench/peers/peers.hpp"
#include "bench/results/results.hpp"
#include "bench/sweep/sweep.hpp"

namespace attnlab::bench {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Runner {
  using Json = nlohmann::json;

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
  ReadProbe read_probe;             // memory-bound points: the read bandwidth beside them

  // The variant a point runs: its named target, or (none named) the default target's;
  // nullptr when the kernel (or that variant) is not in this build.
  const Kernel* find(const GridPoint& g) const;

  // What a point is, before it runs (also the content of its attempt marker).
  PointRecord base_record(const GridPoint& g) const;

  PointFile decide(const GridPoint& g, const PointRecord& base);

  // A peer point (peers.hpp): the same random inputs as the kernels' points, run by the peer's
  // server, O checked against the float64 reference with the float32 tolerance policy (a peer
  // that disagrees is failed and its times dropped), the times recorded as Google Benchmark
  // would (one iteration run per repetition plus the aggregates, so bench.json holds them too).
  PointFile decide_peer(const GridPoint& g, const PointRecord& base);
  Agreement unrounded_agreement(const Problem& p, const std::vector<RowId>& rows) const;

  PointFile time_point(const BenchPoint& pt, const PointRecord& base, const RegisterHooks& hooks);

  // Whether a point measures the read bandwidth beside itself (ReadProbe): a decode, or a point
  // whose FLOP per byte is under the ridge of the CPU peaks measured in this run (FMA peak /
  // read bandwidth).
  static bool memory_bound(const PointRecord& r);
};

}  // namespace attnlab::bench
