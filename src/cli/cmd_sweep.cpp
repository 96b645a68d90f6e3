// attnlab sweep: run an experiment file's grid into a results folder (src/bench/sweep/sweep.hpp).
// Prints the results folder on stdout (progress goes to stderr), so scripts can do
//   dir=$(attnlab sweep --experiment experiments/quick.json) && python3 scripts/report.py "$dir"
#include <filesystem>
#include <cstdio>
#include <iostream>

#include "attnlab/limits.hpp"
#include "bench/sweep/experiment.hpp"
#include "bench/peers/peers.hpp"
#include "bench/sweep/sweep.hpp"
#include "common.hpp"

namespace attnlab::cli {

namespace {
struct SweepArgs {
  std::string experiment, out, shard = "0/1", peak_json, results_root = "results", peers, peers_python;
  bool resume = false;
  bool force = false;
  bool dry_run = false;
  int max_points = 0;
  int peak_repeats = 3;
  IsaFlag isa;
  AxisFlags settings;  // --dtype, --layout, ...: replace the experiment's values in every grid
};

// A path, or a bare name looked up as experiments/<name>.json.
std::string resolve_experiment(const std::string& arg) {
  namespace fs = std::filesystem;
  if (fs::exists(arg)) return arg;
  if (arg.find('/') == std::string::npos) {
    const std::string candidate = "experiments/" + arg + (arg.ends_with(".json") ? "" : ".json");
    if (fs::exists(candidate)) return candidate;
  }
  throw InvalidInput("experiment: '" + arg +
                     "' is not a file; allowed: a path to an experiment .json, or the name of "
                     "one in experiments/ (e.g. quick)");
}
}  // namespace

Command add_sweep(CLI::App& app) {
  auto args = std::make_shared<SweepArgs>();
  CLI::App* sub = app.add_subcommand(
      "sweep", "run an experiment grid (verify, then time with Google Benchmark) into a results folder");
  sub->footer(
      "Exit codes: 0 every point ok or skipped, 1 some point failed (disagreed with the reference, timing "
      "failed, or the process died measuring it), 2 bad input (experiment, flags, a folder that cannot be "
      "resumed), 3 other error, 4 I/O error (a file could not be written: full disk, read-only or missing "
      "folder; the message names the file and the system's reason).");
  sub->add_option("--experiment", args->experiment, "experiment file, or a name in experiments/ (e.g. quick)")
      ->required();
  sub->add_option("--out", args->out, "results folder (default: results/<date>-<experiment>)");
  sub->add_option("--shard", args->shard, "run only points with index % n == i (0-based), e.g. 2/8");
  sub->add_flag("--resume", args->resume,
                "continue the sweep in --out (default: the newest results/<date>-<experiment>[-N], by the creation "
                "time its sweep.json records): finished points are kept, a point the process died on is recorded "
                "as failed (delete its points/<id>.json to measure it again), the rest run; refused when the "
                "folder holds another experiment, shard, git commit, build type or compiler flags");
  sub->add_flag("--force", args->force,
                "with --resume: resume a folder measured by another commit or build flags "
                "(recorded in its machine.json)");
  sub->add_option("--peak-json", args->peak_json, "use peaks from attnlab peak --json instead of measuring");
  sub->add_option("--peak-repeats", args->peak_repeats, "runs per peak figure when measuring");
  sub->add_option("--results-root", args->results_root, "folder for default results folders");
  sub->add_option(
      "--peers", args->peers,
      "measure peers beside the kernels on every shape: " + bench::allowed_peers() +
          ", comma-separated; replaces the experiment's \"peers\" (recorded in the folder's "
          "experiment.json). They run in .venv-peers (scripts/lab peers-setup; scripts/peers/catalogue.json)");
  sub->add_option("--peers-python", args->peers_python,
                  "the peers' Python (default: $ATTN_PEERS_PYTHON, else .venv-peers/bin/python of the source tree)");
  sub->add_flag("--dry-run", args->dry_run, "print the planned points (FLOP count order) and exit");
  sub->add_option("--max-points", args->max_points, "stop after deciding this many points (a resumable partial run)");
  args->isa.add_to(*sub, false);
  args->settings.add_to(*sub, {schema::AxisKind::Setting, schema::AxisKind::Sweep});
  return {sub, [args] {
            // The default target: what the SIMD kernels of an experiment without an "isa" key run.
            args->isa.apply();
            bench::Experiment e =
                bench::load_experiment(resolve_experiment(args->experiment), bench::registry_kernel_names(),
                                       bench::IsaChoices::here(), args->settings.as_experiment_keys());
            if (!args->peers.empty()) {
              e.peers = bench::parse_peers(bench::split_list(args->peers), "peers");
              e.source["peers"] = e.peers;  // the folder records what ran (and --resume compares it)
            }
            if (args->dry_run) {
              const auto grid = bench::expand(e, all_cores());
              std::printf("%s: %zu points\n", e.name.c_str(), grid.size());
              for (const auto& g : grid) std::printf("  %-66s %10.3g GFLOP\n", g.id().c_str(), g.flops * 1e-9);
              return 0;
            }
            bench::SweepOptions o;
            o.out_dir = args->out;
            o.results_root = args->results_root;
            std::tie(o.shard_index, o.shard_count) = bench::parse_shard(args->shard);
            o.resume = args->resume;
            o.force = args->force;
            o.peak_json = args->peak_json;
            o.peak_repeats = args->peak_repeats;
            o.peers_python = args->peers_python;
            if (args->max_points < 0) throw InvalidInput("max-points: must be >= 0; allowed: 0 (all) or a count");
            o.stop_after = args->max_points;
            const bench::SweepSummary s = bench::run_sweep(e, o);
            std::cout << s.out_dir << "\n";
            return s.failed > 0 ? 1 : 0;
          }};
}

}  // namespace attnlab::cli
