// `attnlab sweep`: runs an experiment's grid, one point at a time, into a results folder
// (layout in results.hpp). run_sweep (sweep.cpp) orchestrates; the parts are apart: the
// folder and resume rules (sweep_folder.hpp), the point runner - skip, verify, time, peers
// (point_runner.hpp) -, Google Benchmark's capture and the passes' aggregates
// (gbench_capture.hpp), and the stop signals and attempt markers (stop_signals.hpp).
//
// Per point, in the experiment's order (ascending FLOP count, so cheap points give rate
// estimates before expensive ones):
//   1. skip, with the reason recorded, when the kernel is unavailable (e.g. its target is
//      one this CPU cannot run: "unavailable: this CPU cannot run avx512; it runs ...") or
//      does not support the problem, when the point needs more memory than the budget, or
//      when its estimated time (RateBook: rates measured on earlier points) exceeds the
//      time cap;
//   2. verify: random inputs (the experiment's seed), the float64 reference on sampled rows
//      (sample_rows, verify_rows of them), check_kernel with the point's thread count; a
//      disagreeing kernel is recorded as failed and not timed;
//   3. time with Google Benchmark (register_point, the attn_bench registration), repetitions
//      x min_time, wall-clock; the raw runs are kept in the point file;
//   4. write the point file atomically, then regenerate results.csv and bench.json.
// Before step 1 the point's attempt marker is written (results.hpp); it is removed once the
// point file is written, on an exception, and on SIGINT/SIGTERM.
// A progress line per point goes to stderr (done/total, point, result, elapsed, ETA).
// --resume continues a folder: points whose file exists are kept; a point whose marker was
// left behind (the process died measuring it: out-of-memory kill, crash) is recorded as
// failed with that reason, not run again; the rest run. The folder must hold the same
// experiment.json and shard, and machine.json the same git commit, build type and compiler
// flags and default target (machine.json isa.default: the points of an experiment without
// an "isa" key ran it) (else InvalidInput naming both values; --force resumes anyway and
// records it).
// Peaks (machine.json) are measured for the default target and every target a SIMD point
// runs; each point's % of peak is against its own target's FMA peak (Peaks::ref).
// --shard i/n runs the plan's points with index % n == i (0-based), so shards can run
// anywhere and `attnlab merge` joins them.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "attnlab/kernel.hpp"
#include "bench/sweep/experiment.hpp"
#include "bench/sweep/sweep_folder.hpp"  // parse_shard, choose_out_dir

namespace attnlab::bench {

struct SweepOptions {
  std::string out_dir;  // empty: <results_root>/<date>-<experiment>
  std::string results_root = "results";
  int shard_index = 0, shard_count = 1;
  bool resume = false;
  bool force = false;     // resume a folder measured by another build
  std::string peak_json;  // reuse a measured peak (attnlab peak --json)
  int peak_repeats = 3;
  size_t peak_buffer_bytes = size_t{512} << 20;
  int stop_after = 0;                  // > 0: stop after deciding this many points (as if killed;
                                       // a later pass of a point counts as one)
  int all_threads = 0;                 // what "all" threads means; 0 = every core
  std::vector<const Kernel*> kernels;  // empty = registry()
  std::string peers_python;            // the peers' interpreter ("" = PeerPool::default_python())
  std::string peers_serve;             // their server script ("" = scripts/peers/serve.py; tests)
  std::ostream* progress = nullptr;    // nullptr = std::cerr
};

struct SweepSummary {
  std::string out_dir;
  size_t planned = 0;                      // points in this shard
  size_t already = 0;                      // found done on resume
  size_t ok = 0, failed = 0, skipped = 0;  // decided by this run
  size_t remaining = 0;                    // not decided (stop_after)
  size_t passes_remaining = 0;             // later passes (Experiment::rounds) of timed points not run (stop_after)
};

// Throws InvalidInput for a bad shard spec, an existing folder without --resume, or a
// folder holding another experiment, shard or build (see --resume above); IoError when a
// file cannot be written.
SweepSummary run_sweep(const Experiment& e, const SweepOptions& o);

}  // namespace attnlab::bench
