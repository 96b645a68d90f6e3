#include "bench/results.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "attnlab/npy.hpp"
#include "bench/bench_point.hpp"
#include "bench/files.hpp"
#include "bench/machine.hpp"
#include "bench/using.hpp"

namespace attnlab::bench {

namespace {
using Json = nlohmann::json;

// JSON has no inf or NaN (nlohmann writes null, which then fails to load, so a failed
// point's error vanished): non-finite numbers are the strings "inf", "-inf", "nan" and read
// back exactly. null, written before this rule, reads as NaN.
Json real_to_json(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

double real_from_json(const Json& j) {
  if (j.is_number()) return j.get<double>();
  if (j.is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (j.is_string()) {
    const std::string& t = j.get_ref<const std::string&>();
    if (t == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (t == "inf") return std::numeric_limits<double>::infinity();
    if (t == "-inf") return -std::numeric_limits<double>::infinity();
  }
  throw InvalidInput("number: " + j.dump() + " is not allowed; allowed: a JSON number, \"inf\", \"-inf\", \"nan\"");
}

double real_at(const Json& j, const char* key) {
  try {
    return real_from_json(j.at(key));
  } catch (const InvalidInput& e) {
    throw InvalidInput(std::string(key) + ": " + e.what());
  }
}

// Numbers in the CSV (csv_number, point_schema.hpp); callers write "" for "does not apply".
std::string num(double v) { return csv_number(v); }

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += (c == '"') ? std::string("\"\"") : std::string(1, c == '\n' ? ' ' : c);
  return q + "\"";
}

}  // namespace

const char* to_string(PointStatus s) {
  switch (s) {
    case PointStatus::Ok: return "ok";
    case PointStatus::Failed: return "failed";
    case PointStatus::Skipped: return "skipped";
  }
  return "?";
}

PointStatus parse_point_status(const std::string& s) {
  if (s == "ok") return PointStatus::Ok;
  if (s == "failed") return PointStatus::Failed;
  if (s == "skipped") return PointStatus::Skipped;
  throw InvalidInput("status: '" + s + "'; allowed: ok, failed, skipped");
}

double PointRecord::time_median() const { return median(times); }

Json PointRecord::to_json() const {
  Json times_json = Json::array();
  for (double t : times) times_json.push_back(real_to_json(t));
  Json j = {{"id", id},
            {"name", name},
            {"kernel", kernel},
            {"isa", isa},
            {"model", model},
            {"version", version},
            {"how", how},
            {"status", to_string(status)},
            {"reason", reason},
            {"problem", problem_to_json(problem)},
            {"threads", threads},
            {"extra_bytes", extra_bytes},
            {"plan_bytes", plan_bytes},
            {"memory_bytes", memory_bytes},
            {"times_s", times_json},
            {"iterations", iterations},
            {"rounds", rounds},
            {"peak_flops", real_to_json(peak_flops)},
            {"peak_read_bytes", real_to_json(peak_read_bytes)},
            {"read_probe_bytes_per_s", read_probe},
            {"verdict", verdict},
            {"err_o_rel", real_to_json(err_o_rel)},
            {"err_lse", real_to_json(err_lse)},
            {"tol_o_rel", real_to_json(tol_o_rel)},
            {"tol_lse", real_to_json(tol_lse)},
            {"err_o_rel_f32_inputs", real_to_json(err_o_rel_f32_inputs)},
            {"verify_rows", verify_rows},
            {"seconds_spent", real_to_json(seconds_spent)},
            {"measured_at", measured_at}};
  if (problem.pass != Pass::Forward) {
    j["err_grad"] = {real_to_json(err_grad.dq), real_to_json(err_grad.dk), real_to_json(err_grad.dv)};
    j["tol_grad"] = {real_to_json(tol_grad.dq), real_to_json(tol_grad.dk), real_to_json(tol_grad.dv)};
  }
  return j;
}

PointRecord PointRecord::from_json(const Json& j) {
  try {
    PointRecord r;
    r.id = j.at("id").get<std::string>();
    r.name = j.at("name").get<std::string>();
    r.kernel = j.at("kernel").get<std::string>();
    r.isa = j.value("isa", "");
    r.model = j.value("model", "");
    r.version = j.value("version", "");  // absent before peers
    r.how = j.value("how", "");
    r.status = parse_point_status(j.at("status").get<std::string>());
    r.reason = j.at("reason").get<std::string>();
    r.problem = problem_from_json(j.at("problem"));
    r.threads = j.at("threads").get<int>();
    r.extra_bytes = j.at("extra_bytes").get<size_t>();
    r.plan_bytes = j.value("plan_bytes", size_t{0});
    r.memory_bytes = j.at("memory_bytes").get<size_t>();
    for (const Json& t : j.at("times_s")) r.times.push_back(real_from_json(t));
    r.iterations = j.at("iterations").get<int64_t>();
    r.rounds = j.value("rounds", 1);  // absent before rounds: one pass
    r.peak_flops = real_at(j, "peak_flops");
    r.peak_read_bytes = real_at(j, "peak_read_bytes");
    r.read_probe = j.value("read_probe_bytes_per_s", std::vector<double>{});  // absent before the probe
    r.verdict = j.at("verdict").get<std::string>();
    r.err_o_rel = real_at(j, "err_o_rel");
    r.err_lse = real_at(j, "err_lse");
    r.tol_o_rel = real_at(j, "tol_o_rel");
    r.tol_lse = real_at(j, "tol_lse");
    // Absent before 16-bit storage: the inputs were the float32 ones.
    r.err_o_rel_f32_inputs = j.contains("err_o_rel_f32_inputs") ? real_at(j, "err_o_rel_f32_inputs") : r.err_o_rel;
    r.verify_rows = j.at("verify_rows").get<int>();
    r.seconds_spent = real_at(j, "seconds_spent");
    r.measured_at = j.at("measured_at").get<std::string>();
    const auto grads = [&](const char* key, auto& g) {  // [dQ, dK, dV]; absent for a forward point
      if (!j.contains(key)) return;
      const Json& v = j.at(key);
      if (!v.is_array() || v.size() != 3) throw InvalidInput(std::string(key) + ": allowed: [dQ, dK, dV]");
      g.dq = real_from_json(v[0]), g.dk = real_from_json(v[1]), g.dv = real_from_json(v[2]);
    };
    grads("err_grad", r.err_grad);
    grads("tol_grad", r.tol_grad);
    return r;
  } catch (const Json::exception& e) {
    throw InvalidInput(std::string("point record: ") + e.what());
  }
}

void SweepPlan::set_created_now() {
  created = now_iso8601();
  created_unix_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Json SweepPlan::to_json() const {
  return {{"schema", "attnlab-sweep-1"},
          {"experiment", experiment},
          {"shard", {shard_index, shard_count}},
          {"all_threads", all_threads},
          {"created", created},
          {"created_unix_ns", created_unix_ns},
          {"plan", ids}};
}

SweepPlan SweepPlan::from_json(const Json& j) {
  try {
    SweepPlan p;
    p.experiment = j.at("experiment").get<std::string>();
    p.shard_index = j.at("shard").at(0).get<int>();
    p.shard_count = j.at("shard").at(1).get<int>();
    p.all_threads = j.at("all_threads").get<int>();
    p.ids = j.at("plan").get<std::vector<std::string>>();
    p.created = j.value("created", "");
    p.created_unix_ns = j.value("created_unix_ns", int64_t{0});
    return p;
  } catch (const Json::exception& e) {
    throw InvalidInput(std::string("sweep.json: ") + e.what());
  }
}

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

std::vector<std::string> tidy_columns() {
  std::vector<std::string> out;
  PointRecord none;
  for (const auto& c : tidy_row("", none)) out.push_back(c.name);
  return out;
}

std::vector<TidyCell> tidy_row(const std::string& experiment, const PointRecord& r) {
  const Problem& p = r.problem;
  const bool timed = r.status == PointStatus::Ok && !r.times.empty();
  const double t = timed ? r.time_median() : NAN;
  const double tmean = timed ? mean(r.times) : NAN;
  const double tsd = timed ? stddev(r.times) : NAN;
  const double flops = p.flops(), bytes = p.bytes_moved();
  const bool probed = !r.read_probe.empty();
  const double probe_median = probed ? median(r.read_probe) : NAN;
  const double probe_best = probed ? *std::max_element(r.read_probe.begin(), r.read_probe.end()) : NAN;
  // Time columns apply to timed points only; verification columns to verified ones.
  auto if_timed = [&](double v) { return timed ? num(v) : std::string(); };
  auto if_verified = [&](double v) { return r.verdict.empty() ? std::string() : num(v); };
  auto if_grads = [&](double v) { return r.verdict.empty() || p.pass == Pass::Forward ? std::string() : num(v); };
  std::vector<TidyCell> row = {{"experiment", experiment},
                               {"id", r.id},
                               {"kernel", r.kernel},
                               {"isa", r.isa},
                               {"status", to_string(r.status)},
                               {"reason", r.reason},
                               {"model", r.model},
                               {"version", r.version},
                               {"how", r.how}};
  const PointView view{r.kernel, p, r.threads, {}, r.model};
  for (const PointField& f : point_fields()) row.push_back({f.name, f.value(view)});
  const std::vector<TidyCell> measured = {
      {"flops", num(flops)},
      {"bytes", num(bytes)},
      {"kv_bytes", num(p.kv_bytes())},
      {"kv_bytes_per_token", num(p.kv_bytes_per_token())},
      {"visible_pairs", std::to_string(p.visible_pairs())},
      {"extra_bytes", std::to_string(r.extra_bytes)},
      {"plan_bytes", std::to_string(r.plan_bytes)},
      {"memory_bytes", std::to_string(r.memory_bytes)},
      {"repetitions", std::to_string(r.times.size())},
      {"rounds", std::to_string(r.rounds)},
      {"iterations", std::to_string(r.iterations)},
      {"time_median_s", if_timed(t)},
      {"time_min_s", timed ? num(*std::min_element(r.times.begin(), r.times.end())) : ""},
      {"time_max_s", timed ? num(*std::max_element(r.times.begin(), r.times.end())) : ""},
      {"time_mean_s", if_timed(tmean)},
      {"time_stddev_s", if_timed(tsd)},
      {"time_cv", if_timed(tsd / tmean)},
      {"gflops", if_timed(flops / t * 1e-9)},
      {"gbytes_per_s", if_timed(bytes / t * 1e-9)},
      {"peak_gflops", r.peak_flops > 0 ? num(r.peak_flops * 1e-9) : ""},
      {"peak_fraction", r.peak_flops > 0 ? if_timed(flops / t / r.peak_flops) : ""},
      {"read_bw_gbs", r.peak_read_bytes > 0 ? num(r.peak_read_bytes * 1e-9) : ""},
      {"bw_fraction", r.peak_read_bytes > 0 ? if_timed(bytes / t / r.peak_read_bytes) : ""},
      // The probe beside the point: its runs' spread, and % of bandwidth against their median
      // and their best.
      {"probes", std::to_string(r.read_probe.size())},
      {"probe_read_gbs_min", probed ? num(*std::min_element(r.read_probe.begin(), r.read_probe.end()) * 1e-9) : ""},
      {"probe_read_gbs_median", probed ? num(probe_median * 1e-9) : ""},
      {"probe_read_gbs_max", probed ? num(probe_best * 1e-9) : ""},
      {"bw_fraction_probe_median", probed ? if_timed(bytes / t / probe_median) : ""},
      {"bw_fraction_probe_best", probed ? if_timed(bytes / t / probe_best) : ""},
      {"verdict", r.verdict},
      {"err_o_rel", if_verified(r.err_o_rel)},
      {"tol_o_rel", if_verified(r.tol_o_rel)},
      {"err_lse", if_verified(r.err_lse)},
      {"tol_lse", if_verified(r.tol_lse)},
      {"err_o_rel_f32_inputs", if_verified(r.err_o_rel_f32_inputs)},
      // A backward point's gradients (max error over the sampled rows / keys, relative to the
      // tensor's largest reference value) and their tolerances.
      {"err_dq", if_grads(r.err_grad.dq)},
      {"err_dk", if_grads(r.err_grad.dk)},
      {"err_dv", if_grads(r.err_grad.dv)},
      {"tol_dq", if_grads(r.tol_grad.dq)},
      {"tol_dk", if_grads(r.tol_grad.dk)},
      {"tol_dv", if_grads(r.tol_grad.dv)},
      {"verify_rows", std::to_string(r.verify_rows)},
      {"seconds_spent", num(r.seconds_spent)},
      {"measured_at", r.measured_at}};
  row.insert(row.end(), measured.begin(), measured.end());
  return row;
}

std::string tidy_csv(const std::string& experiment, const std::vector<PointRecord>& records) {
  std::ostringstream out;
  const auto cols = tidy_columns();
  for (size_t i = 0; i < cols.size(); ++i) out << (i ? "," : "") << cols[i];
  out << "\n";
  for (const PointRecord& r : records) {
    const auto row = tidy_row(experiment, r);
    for (size_t i = 0; i < row.size(); ++i) out << (i ? "," : "") << csv_field(row[i].text);
    out << "\n";
  }
  return out.str();
}

void write_outputs(const std::string& dir, const SweepPlan& plan, const std::vector<PointFile>& points) {
  std::map<std::string, size_t> order;
  for (size_t i = 0; i < plan.ids.size(); ++i) order[plan.ids[i]] = i;
  std::vector<const PointFile*> sorted;
  for (const auto& pf : points) sorted.push_back(&pf);
  std::stable_sort(sorted.begin(), sorted.end(), [&](const PointFile* a, const PointFile* b) {
    const auto ia = order.find(a->record.id), ib = order.find(b->record.id);
    const size_t ka = ia == order.end() ? SIZE_MAX : ia->second, kb = ib == order.end() ? SIZE_MAX : ib->second;
    return ka < kb;
  });
  std::vector<PointRecord> records;
  Json bench = {{"context", Json::object()}, {"benchmarks", Json::array()}};
  // Each point ran alone (family 0 of its own run): its family index becomes its place in the
  // plan, as if the sweep had been one Google Benchmark run.
  for (size_t i = 0; i < sorted.size(); ++i) {
    const PointFile* pf = sorted[i];
    records.push_back(pf->record);
    if (bench["context"].empty() && pf->gbench_context.is_object()) bench["context"] = pf->gbench_context;
    for (Json run : pf->gbench_runs) {
      run["family_index"] = i;
      run["per_family_instance_index"] = 0;
      bench["benchmarks"].push_back(std::move(run));
    }
  }
  write_file_atomic(dir + "/results.csv", tidy_csv(plan.experiment, records));
  Json schema = schema_json();
  schema["columns"] = tidy_columns();
  write_file_atomic(dir + "/schema.json", schema.dump(1) + "\n");
  // One benchmark per line: compact enough to commit, still readable and diffable.
  std::string text = "{\n\"context\": " + bench["context"].dump() + ",\n\"benchmarks\": [";
  for (size_t i = 0; i < bench["benchmarks"].size(); ++i) {
    text += (i ? ",\n" : "\n") + bench["benchmarks"][i].dump();
  }
  text += "\n]\n}\n";
  write_file_atomic(dir + "/bench.json", text);
}

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
