#include "bench/sweep/gbench_capture.hpp"

#include <cmath>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "bench/using.hpp"

namespace attnlab::bench {

using Json = nlohmann::json;

void init_benchmark_once() {
  static bool done = false;
  if (done) return;
  done = true;
  static char arg0[] = "attnlab-sweep";
  static char* argv[] = {arg0, nullptr};
  int argc = 1;
  benchmark::Initialize(&argc, argv);
}

CaptureReporter::CaptureReporter() {
  json_.SetOutputStream(&text_);
  json_.SetErrorStream(&errors_);
}

void CaptureReporter::ReportRuns(const std::vector<Run>& runs) {
  std::vector<Run> named = runs;
  for (Run& r : named) r.run_name.min_time.clear(), r.run_name.repetitions.clear();
  json_.ReportRuns(named);
  runs_.insert(runs_.end(), runs.begin(), runs.end());
}

std::string sanitize_gbench_json(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    bool replaced = false;
    if (text[i] == ':') {
      size_t j = i + 1;
      while (j < text.size() && text[j] == ' ') ++j;
      for (const char* tok : {"-NaN", "NaN", "-nan", "nan", "-Infinity", "Infinity", "-inf", "inf"}) {
        const size_t n = std::char_traits<char>::length(tok);
        if (text.compare(j, n, tok) == 0) {
          out += ": null";
          i = j + n;
          replaced = true;
          break;
        }
      }
    }
    if (!replaced) out += text[i++];
  }
  return out;
}

void add_round(PointFile& into, const PointFile& next, int round) {
  PointRecord& r = into.record;
  const PointRecord& n = next.record;
  r.seconds_spent += n.seconds_spent;
  if (n.status == PointStatus::Skipped) return;
  if (n.status == PointStatus::Failed) {
    into = next;
    into.record.reason = "pass " + std::to_string(round) + " of the sweep: " + n.reason;
    return;
  }
  for (const auto& [mine, theirs] :
       {std::pair{&r.err_o_rel, n.err_o_rel}, std::pair{&r.err_lse, n.err_lse},
        std::pair{&r.err_o_rel_f32_inputs, n.err_o_rel_f32_inputs}, std::pair{&r.err_o_rel_dense, n.err_o_rel_dense},
        std::pair{&r.err_grad.dq, n.err_grad.dq}, std::pair{&r.err_grad.dk, n.err_grad.dk},
        std::pair{&r.err_grad.dv, n.err_grad.dv}}) {
    if (!(*mine >= theirs)) *mine = theirs;  // the worst pass (NaN stays)
  }
  r.times.insert(r.times.end(), n.times.begin(), n.times.end());
  r.read_probe.insert(r.read_probe.end(), n.read_probe.begin(), n.read_probe.end());
  r.rounds += 1;

  Json iterations = Json::array(), aggregates = Json::array();
  // Aggregates (Google Benchmark writes them from 2 repetitions on) are the first pass's,
  // recomputed below; every pass has the same repetitions.
  for (const Json& run : into.gbench_runs)
    (run.value("run_type", "") == "iteration" ? iterations : aggregates).push_back(run);
  for (Json& run : iterations) {
    if (!run.contains("attnlab_round")) run["attnlab_round"] = 1;
  }
  for (const Json& run : next.gbench_runs) {
    if (run.value("run_type", "") != "iteration") continue;
    Json added = run;
    added["repetition_index"] = iterations.size();
    added["attnlab_round"] = round;
    iterations.push_back(added);
  }
  for (Json& run : iterations) run["repetitions"] = iterations.size();
  // Fields that name or count rather than measure.
  static const std::set<std::string> kNotMeasured = {
      "family_index", "per_family_instance_index", "repetition_index", "repetitions", "iterations", "threads",
      "attnlab_round"};
  for (Json& agg : aggregates) {
    const std::string what = agg.value("aggregate_name", "");
    for (auto it = agg.begin(); it != agg.end(); ++it) {
      if (!it.value().is_number() || kNotMeasured.count(it.key())) continue;
      std::vector<double> v;
      for (const Json& run : iterations) {
        if (run.contains(it.key()) && run[it.key()].is_number()) v.push_back(run[it.key()].get<double>());
      }
      if (v.empty()) continue;
      const double m = mean(v), sd = stddev(v);
      const double value = what == "mean"     ? m
                           : what == "median" ? median(v)
                           : what == "stddev" ? sd
                           : what == "cv"     ? (m != 0 ? sd / m : std::numeric_limits<double>::quiet_NaN())
                                              : it.value().get<double>();
      it.value() = std::isfinite(value) ? Json(value) : Json(nullptr);
    }
    agg["repetitions"] = iterations.size();
    agg["iterations"] = iterations.size();
  }
  into.gbench_runs = iterations;
  for (const Json& agg : aggregates) into.gbench_runs.push_back(agg);
}

}  // namespace attnlab::bench
