// The tidy results.csv (one row per decided point: labels, the schema's point fields, the
// measurement), and the outputs regenerated from the point files: results.csv, bench.json,
// schema.json.
#include "bench/results/results.hpp"

#include <cmath>
#include <sstream>

#include "attnlab/atomic_write.hpp"
#include "bench/sweep/bench_point.hpp"
#include "bench/results/files.hpp"
#include "bench/using.hpp"

namespace attnlab::bench {

namespace {
using Json = nlohmann::json;

// Numbers in the CSV (csv_number, point_schema.hpp); callers write "" for "does not apply".
std::string num(double v) { return csv_number(v); }

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += (c == '"') ? std::string("\"\"") : std::string(1, c == '\n' ? ' ' : c);
  return q + "\"";
}

}  // namespace

Roofline roofline(const PointRecord& r) {
  const double bw = !r.read_probe.empty() ? median(r.read_probe) : r.peak_read_bytes;
  if (!(bw > 0) || !(r.unit_peak > 0)) return {};
  const double memory = r.problem.bytes_moved() / bw, compute = r.problem.flops() / r.unit_peak;
  return memory >= compute ? Roofline{memory, "memory"} : Roofline{compute, "compute"};
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
  const Roofline roof = roofline(r);
  // Time columns apply to timed points only; verification columns to verified ones.
  auto if_timed = [&](double v) { return timed ? num(v) : std::string(); };
  auto if_verified = [&](double v) { return r.verdict.empty() ? std::string() : num(v); };
  auto if_topk = [&](double v) { return r.verdict.empty() || !p.topk() ? std::string() : num(v); };
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
      {"roofline_s", roof.seconds > 0 ? num(roof.seconds) : ""},
      {"roofline_fraction", roof.seconds > 0 ? if_timed(roof.seconds / t) : ""},
      {"roofline_bound", roof.bound},
      {"verdict", r.verdict},
      {"err_o_rel", if_verified(r.err_o_rel)},
      {"tol_o_rel", if_verified(r.tol_o_rel)},
      {"err_lse", if_verified(r.err_lse)},
      {"tol_lse", if_verified(r.tol_lse)},
      {"err_o_rel_f32_inputs", if_verified(r.err_o_rel_f32_inputs)},
      // A query-aware sparse decode's accuracy (check_topk): recall over the verified rows, O against
      // the dense float64 reference.
      {"recall_min", if_topk(r.recall_min)},
      {"recall_mean", if_topk(r.recall_mean)},
      {"err_o_rel_dense", if_topk(r.err_o_rel_dense)},
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

}  // namespace attnlab::bench
