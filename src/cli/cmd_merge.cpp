// attnlab merge: join the folders of a sharded sweep (attnlab sweep --shard i/n) into one.
#include <iostream>

#include "bench/results/results.hpp"
#include "common.hpp"

namespace attnlab::cli {

namespace {
struct MergeArgs {
  std::string out;
  std::vector<std::string> shards;
};
}  // namespace

Command add_merge(CLI::App& app) {
  auto args = std::make_shared<MergeArgs>();
  CLI::App* sub = app.add_subcommand("merge", "join shard results folders of one experiment into one folder");
  sub->add_option("--out", args->out, "merged results folder (new or empty)")->required();
  sub->add_option("shards", args->shards, "shard folders written by attnlab sweep --shard i/n")->required();
  sub->footer(
      "A point a shard's process died on (attempt marker, no result) is merged as failed. Exit codes: 0 ok, "
      "2 bad input (folders of different experiments or plans, conflicting points, a non-empty --out), "
      "4 I/O error (a file could not be written).");
  return {sub, [args] {
            const size_t n = bench::merge_results(args->out, args->shards);
            std::cerr << "merged " << n << " points from " << args->shards.size() << " folders\n";
            std::cout << args->out << "\n";
            return 0;
          }};
}

}  // namespace attnlab::cli
