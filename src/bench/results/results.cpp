// A point record and a sweep plan as JSON (results.hpp): the points/<id>.json and sweep.json
// contents, non-finite numbers as strings.
#include "bench/results/results.hpp"

#include <chrono>
#include <cmath>
#include <limits>

#include "bench/results/machine.hpp"
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
            {"unit_peak", real_to_json(unit_peak)},
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
  if (problem.topk()) {
    j["recall_min"] = real_to_json(recall_min);
    j["recall_mean"] = real_to_json(recall_mean);
    j["err_o_rel_dense"] = real_to_json(err_o_rel_dense);
  }
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
    r.unit_peak = j.contains("unit_peak") ? real_at(j, "unit_peak") : r.peak_flops;  // absent before the roofline
    r.read_probe = j.value("read_probe_bytes_per_s", std::vector<double>{});         // absent before the probe
    r.verdict = j.at("verdict").get<std::string>();
    r.err_o_rel = real_at(j, "err_o_rel");
    r.err_lse = real_at(j, "err_lse");
    r.tol_o_rel = real_at(j, "tol_o_rel");
    r.tol_lse = real_at(j, "tol_lse");
    // Absent before 16-bit storage: the inputs were the float32 ones.
    r.err_o_rel_f32_inputs = j.contains("err_o_rel_f32_inputs") ? real_at(j, "err_o_rel_f32_inputs") : r.err_o_rel;
    if (r.problem.topk()) {
      r.recall_min = real_at(j, "recall_min");
      r.recall_mean = real_at(j, "recall_mean");
      r.err_o_rel_dense = real_at(j, "err_o_rel_dense");
    }
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

}  // namespace attnlab::bench
