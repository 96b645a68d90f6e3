// A results folder and the records in it.
//
//   <dir>/experiment.json   the experiment file as read
//   <dir>/sweep.json        the plan: every point id in run order, this folder's shard,
//                           what "all" threads meant
//   <dir>/machine.json      machine, build, library versions, git commit, measured peaks
//   <dir>/points/<id>.json  one file per decided point (record + its raw Google Benchmark
//                           runs), written atomically the moment the point is done: an
//                           interrupted sweep loses at most the point it was running
//   <dir>/points/<id>.attempt  written just before the point runs, removed once its
//                           .json is written: one left behind means the process died
//                           while measuring the point (resume records it as failed)
//   <dir>/bench.json        Google Benchmark JSON of all timed points (context + benchmarks),
//                           so google/benchmark's tools/compare.py works on it
//   <dir>/results.csv       tidy table, one row per decided point (ok, failed, skipped)
//   <dir>/schema.json       the point fields of results.csv (point_schema.hpp), for the reports
// bench.json and results.csv are regenerated from points/ after every point. Every file is
// written whole and synced (write_file_atomic). Non-finite numbers in the JSON files are
// the strings "inf", "-inf", "nan" (JSON has no such numbers); the CSV writes inf, -inf,
// nan, and an empty field where a column does not apply (e.g. times of untimed points).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnlab/backward.hpp"
#include "attnlab/problem.hpp"
#include "bench/using.hpp"  // problem_to_json: a point record's problem (also what peer servers read)

namespace attnlab::bench {

enum class PointStatus { Ok, Failed, Skipped };

const char* to_string(PointStatus s);
PointStatus parse_point_status(const std::string& s);

struct PointRecord {
  std::string id, name, kernel;
  // The target the kernel ran (Kernel::isa(): "avx2", ..., or "baseline" / "cuda" for
  // kernels built once); "" in points written before it was recorded (readers take the
  // machine's default target, machine.json isa.default).
  std::string isa;
  std::string model;  // the experiment grid's "model" label ("" when none)
  // Peers (peers.hpp; "" for the lab's kernels): the library and version that ran the point,
  // and how it was driven (the op, how GQA and the mask were expressed).
  std::string version, how;
  PointStatus status = PointStatus::Skipped;
  std::string reason;  // why failed or skipped
  Problem problem;
  int threads = 1;
  size_t extra_bytes = 0;   // kernel workspace
  size_t plan_bytes = 0;    // the kernel's per-problem plan (a sparse pattern's block map)
  size_t memory_bytes = 0;  // everything the point allocated
  // timing (status ok): seconds per run, one entry per repetition
  std::vector<double> times;
  int64_t iterations = 0;  // per repetition (of the first pass)
  int rounds = 1;          // passes of the sweep whose repetitions are in times (Experiment::rounds)
  // machine peaks for this thread count (0 = not measured): the FMA peak of the point's
  // target, the default target's read bandwidth (Peaks::ref)
  double peak_flops = 0, peak_read_bytes = 0;
  // The peak (ops/s) of the unit the kernel multiplies on, the roofline's (roofline()): peak_flops,
  // or for int8 products (Arithmetic::Int8Products) the target's vpdpbusd; 0 = not measured.
  double unit_peak = 0;
  // Memory-bound points (arithmetic intensity under the roofline's ridge): the read bandwidth
  // (bytes/s) measured beside the point, before and after each pass's repetitions (ReadProbe).
  std::vector<double> read_probe;
  // verification against the float64 reference on sampled rows
  std::string verdict;  // PASS, FAIL, SKIP or "" (not verified)
  double err_o_rel = 0, err_lse = 0, tol_o_rel = 0, tol_lse = 0;
  // The same output's O error against the float64 reference on the float32 inputs before
  // they were rounded to the storage dtype or quantized into the KV cache (kv_dtype): what
  // 16-bit storage or a quantized cache costs end to end (equal to err_o_rel for f32).
  double err_o_rel_f32_inputs = 0;
  // A query-aware sparse decode (Problem::topk): the verdict and errors above are its exact part
  // (against the problem masked to the pages it chose); what the choice costs is measured
  // (kv_summary.hpp, check_topk): the chosen keys' softmax mass under dense attention over the
  // verified rows (smallest, mean), and O's error against the dense float64 reference (largest).
  double recall_min = 0, recall_mean = 0, err_o_rel_dense = 0;
  // A backward point (Problem::pass): dQ, dK, dV against the float64 reference gradients on
  // sampled rows and keys (verify.hpp, check_backward_sampled), and their tolerances.
  GradErrors err_grad;
  GradTolerance tol_grad;
  int verify_rows = 0;
  double seconds_spent = 0;  // wall time the point took (verify + timing)
  std::string measured_at;

  double time_median() const;
  nlohmann::json to_json() const;
  static PointRecord from_json(const nlohmann::json& j);  // throws InvalidInput
};

// One point file: the record and the raw Google Benchmark output of its timing.
struct PointFile {
  PointRecord record;
  nlohmann::json gbench_context;  // null for untimed points
  nlohmann::json gbench_runs = nlohmann::json::array();
};

struct SweepPlan {
  std::string experiment;
  std::vector<std::string> ids;  // every point of the experiment, in run order
  int shard_index = 0, shard_count = 1;
  int all_threads = 1;
  // When the folder was started (kept on resume; 0 in folders written before it was
  // recorded): --resume picks the newest folder by it.
  std::string created;
  int64_t created_unix_ns = 0;
  void set_created_now();
  bool in_shard(size_t plan_index) const {
    return static_cast<int>(plan_index % static_cast<size_t>(shard_count)) == shard_index;
  }
  nlohmann::json to_json() const;
  static SweepPlan from_json(const nlohmann::json& j);
};

std::string points_dir(const std::string& dir);
std::string point_path(const std::string& dir, const std::string& id);
void write_point(const std::string& dir, const PointFile& pf);
// All point files of a folder (unreadable ones are reported on stderr and left out, so a
// resume re-runs them).
std::vector<PointFile> read_points(const std::string& dir);

// The attempt marker of a point: {record (the point's description, before it runs),
// started_at, pid, host}, written atomically.
std::string attempt_path(const std::string& dir, const std::string& id);
void mark_attempt(const std::string& dir, const PointRecord& base);
void clear_attempt(const std::string& dir, const std::string& id);  // no error when absent
// Markers left in a folder: point id -> marker (unreadable ones are reported on stderr and
// left out).
std::map<std::string, nlohmann::json> read_attempts(const std::string& dir);
// The point a leftover marker stands for: `base` (the marker's record when null) as failed,
// reason "process died while measuring this point: started <when> by pid <pid> on <host>...".
PointFile died_point(const nlohmann::json& marker, const PointRecord* base = nullptr);

// The tidy CSV (header + one row per record, in the order given): the record's labels, the
// point's fields (point_schema.hpp, in its order), the measurement. tidy_row names each
// column beside its text, so the header and the rows cannot drift apart.
struct TidyCell {
  const char* name;
  std::string text;
};
std::vector<TidyCell> tidy_row(const std::string& experiment, const PointRecord& r);
std::string tidy_csv(const std::string& experiment, const std::vector<PointRecord>& records);
std::vector<std::string> tidy_columns();

// The time a point cannot beat on this machine (issue 64): the larger of its compulsory bytes
// (Problem::bytes_moved) over the read bandwidth - the probe measured beside the point (median),
// else the run's peak - and its products (Problem::flops) over the peak of the unit the kernel
// multiplies on (PointRecord::unit_peak); `bound` says which ("memory" or "compute"). seconds 0
// (bound "") when a peak is missing. roofline_fraction in results.csv is seconds over the median.
struct Roofline {
  double seconds = 0;
  const char* bound = "";
};
Roofline roofline(const PointRecord& r);

// Rewrites results.csv, bench.json and schema.json (point_schema.hpp: the fields results.csv
// holds, which the reports read) from the point files, ordered by the plan.
void write_outputs(const std::string& dir, const SweepPlan& plan, const std::vector<PointFile>& points);

// Joins shard folders of one experiment into `out`: same experiment.json required; a point
// present in two shards must be identical; a point a shard died on (attempt marker, no
// point file) is merged as failed. Returns the number of points in the result.
size_t merge_results(const std::string& out, const std::vector<std::string>& shards);

}  // namespace attnlab::bench
