// Shard folders of one experiment joined into one (attnlab merge; results.hpp).
#include "bench/results/results.hpp"

#include <iostream>
#include <map>
#include <set>

#include "attnlab/atomic_write.hpp"
#include "bench/results/files.hpp"
#include "bench/results/machine.hpp"

namespace attnlab::bench {

namespace {
using Json = nlohmann::json;
}  // namespace

size_t merge_results(const std::string& out, const std::vector<std::string>& shards) {
  if (shards.empty()) throw InvalidInput("merge: no shard folders given; allowed: one or more results folders");
  Json experiment;
  Json machine;
  SweepPlan plan;
  Json shard_list = Json::array();
  std::map<std::string, std::pair<std::string, Json>> by_id;  // id -> (shard, record json)
  std::vector<PointFile> merged;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string& dir = shards[s];
    if (!file_exists(dir + "/sweep.json")) {
      throw InvalidInput("merge: " + dir +
                         " is not a sweep results folder (no sweep.json); allowed: folders written by attnlab sweep");
    }
    const Json exp = Json::parse(read_text_file(dir + "/experiment.json"));
    const SweepPlan sp = SweepPlan::from_json(Json::parse(read_text_file(dir + "/sweep.json")));
    const Json mach =
        file_exists(dir + "/machine.json") ? Json::parse(read_text_file(dir + "/machine.json")) : Json::object();
    if (s == 0) {
      experiment = exp;
      machine = mach;
      plan = sp;
    } else {
      if (exp != experiment) {
        throw InvalidInput("merge: " + dir + " ran a different experiment.json than " + shards[0] +
                           "; allowed: shards of one experiment");
      }
      if (sp.ids != plan.ids) {
        throw InvalidInput("merge: " + dir + " planned different points than " + shards[0] +
                           " (different kernels or core counts?); allowed: shards of one plan");
      }
    }
    shard_list.push_back({{"folder", dir},
                          {"shard", {sp.shard_index, sp.shard_count}},
                          {"host", mach.value("host", "")},
                          {"date", mach.value("date", "")},
                          {"git", mach.value("git", Json())},
                          {"peaks", mach.value("peaks", Json())}});
    std::vector<PointFile> points = read_points(dir);
    std::set<std::string> measured;
    for (const PointFile& pf : points) measured.insert(pf.record.id);
    for (const auto& [id, marker] : read_attempts(dir)) {
      if (!measured.count(id)) points.push_back(died_point(marker));
    }
    for (PointFile& pf : points) {
      const Json rec = pf.record.to_json();
      auto it = by_id.find(pf.record.id);
      if (it != by_id.end()) {
        if (it->second.second != rec) {
          throw InvalidInput("merge: point " + pf.record.id + " was measured in both " + it->second.first + " and " +
                             dir + " with different results; allowed: each point in one shard");
        }
        continue;
      }
      by_id[pf.record.id] = {dir, rec};
      merged.push_back(std::move(pf));
    }
  }
  make_dirs(points_dir(out));
  if (!read_points(out).empty()) {
    throw InvalidInput("merge: " + out + " already holds points; allowed: a new or empty folder");
  }
  plan.shard_index = 0;
  plan.shard_count = 1;
  plan.set_created_now();
  machine["shards"] = shard_list;
  write_file_atomic(out + "/experiment.json", experiment.dump(2) + "\n");
  write_file_atomic(out + "/sweep.json", plan.to_json().dump(1) + "\n");
  write_file_atomic(out + "/machine.json", machine.dump(2) + "\n");
  for (const PointFile& pf : merged) write_point(out, pf);
  write_outputs(out, plan, merged);
  return merged.size();
}

}  // namespace attnlab::bench
