// A results folder's layout (results.hpp): point files written whole as each point is decided,
// and the attempt markers that tell a resume which point the process died on.
#include "bench/results/results.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "attnlab/atomic_write.hpp"
#include "bench/results/files.hpp"
#include "bench/results/machine.hpp"

namespace attnlab::bench {

namespace {
using Json = nlohmann::json;
}  // namespace

std::string points_dir(const std::string& dir) { return dir + "/points"; }
std::string point_path(const std::string& dir, const std::string& id) { return points_dir(dir) + "/" + id + ".json"; }

void write_point(const std::string& dir, const PointFile& pf) {
  Json j = {{"schema", "attnlab-point-1"},
            {"record", pf.record.to_json()},
            {"gbench_context", pf.gbench_context},
            {"gbench_runs", pf.gbench_runs}};
  write_file_atomic(point_path(dir, pf.record.id), j.dump(1) + "\n");
}

std::vector<PointFile> read_points(const std::string& dir) {
  std::vector<PointFile> out;
  for (const std::string& name : list_files(points_dir(dir), ".json")) {
    const std::string path = points_dir(dir) + "/" + name;
    try {
      const Json j = Json::parse(read_text_file(path));
      PointFile pf;
      pf.record = PointRecord::from_json(j.at("record"));
      pf.gbench_context = j.value("gbench_context", Json());
      pf.gbench_runs = j.value("gbench_runs", Json::array());
      out.push_back(std::move(pf));
    } catch (const std::exception& e) {
      std::cerr << "warning: " << path << " is unreadable (" << e.what() << "); the point will be run again\n";
    }
  }
  return out;
}

std::string attempt_path(const std::string& dir, const std::string& id) {
  return points_dir(dir) + "/" + id + ".attempt";
}

void mark_attempt(const std::string& dir, const PointRecord& base) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const Json j = {{"record", base.to_json()},
                  {"started_at", now_iso8601()},
                  {"pid", static_cast<int64_t>(::getpid())},
                  {"host", std::string(host)}};
  write_file_atomic(attempt_path(dir, base.id), j.dump() + "\n");
}

void clear_attempt(const std::string& dir, const std::string& id) {
  const std::string path = attempt_path(dir, id);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    throw IoError(path + ": removing the attempt marker failed: " + std::strerror(errno));
  }
}

std::map<std::string, Json> read_attempts(const std::string& dir) {
  std::map<std::string, Json> out;
  const std::string ext = ".attempt";
  for (const std::string& name : list_files(points_dir(dir), ext)) {
    const std::string path = points_dir(dir) + "/" + name;
    try {
      Json j = Json::parse(read_text_file(path));
      PointRecord::from_json(j.at("record"));  // a marker must describe its point
      out[name.substr(0, name.size() - ext.size())] = std::move(j);
    } catch (const std::exception& e) {
      std::cerr << "warning: " << path << " is unreadable (" << e.what() << "); ignored\n";
    }
  }
  return out;
}

PointFile died_point(const Json& marker, const PointRecord* base) {
  PointFile pf;
  pf.record = base ? *base : PointRecord::from_json(marker.at("record"));
  PointRecord& r = pf.record;
  r.status = PointStatus::Failed;
  r.reason =
      "process died while measuring this point: started " + marker.value("started_at", std::string("?")) + " by pid " +
      std::to_string(marker.value("pid", int64_t{0})) + " on " + marker.value("host", std::string("?")) +
      ", no result written (an out-of-memory kill, SIGKILL, power loss or a crash in the kernel); delete points/" +
      r.id + ".json to measure it again";
  r.times.clear();
  return pf;
}

}  // namespace attnlab::bench
