// Generation experiments (experiments/generation.json; generation.hpp): the runs' keys, read
// with the point schema's axes where a key is one.
#include <fstream>

#include <nlohmann/json.hpp>

#include "attnlab/limits.hpp"
#include "bench/generation/generation.hpp"
#include "bench/using.hpp"

namespace attnlab::bench {

bool is_generation_axis(const Axis& a) {
  static const std::vector<std::string_view> sizes = {"q_heads",  "kv_heads", "gqa_groups",
                                                      "head_dim", "d_model",  "head_dim_v"};
  return a.kind == AxisKind::Setting || std::find(sizes.begin(), sizes.end(), a.key) != sizes.end();
}

namespace {

[[noreturn]] void fail_file(const std::string& path, const std::string& what) {
  throw InvalidInput("experiment " + path + ": " + what);
}
}  // namespace

std::vector<GenerationConfig> load_generation_experiment(const std::string& path, int all_threads) {
  std::ifstream f(path);
  if (!f) throw InvalidInput("experiment " + path + ": cannot be read");
  Json doc;
  try {
    doc = Json::parse(f);
  } catch (const Json::exception& e) {
    throw InvalidInput("experiment " + path + ": not valid JSON: " + e.what());
  }
  const auto fail = [&](const std::string& what) { fail_file(path, what); };
  if (!doc.is_object() || doc.value("kind", std::string()) != "generation") {
    fail("key 'kind' must be \"generation\" (attnlab generate runs generation experiments; sweeps run the others)");
  }
  // The heads, head dims and settings (dtype, ...) are the point schema's axes, one value each.
  std::vector<std::string> head_keys;
  for (const Axis& a : axes()) {
    if (is_generation_axis(a)) head_keys.emplace_back(a.key);
  }
  std::vector<std::string> top = {
      "kind",           "description",        "prompts",      "steps",       "capacity", "threads", "kernel",
      "prefill_kernel", "prefill_max_tokens", "verify_steps", "repetitions", "seed",     "runs"};
  std::vector<std::string> per_run = {"name", "steps", "prompts"};
  top.insert(top.end(), head_keys.begin(), head_keys.end());
  per_run.insert(per_run.end(), head_keys.begin(), head_keys.end());
  const auto set_head = [&](const Json& o, Problem& p, const std::string& where) {
    int threads = 0;
    for (const Axis& a : axes()) {
      if (is_generation_axis(a) && o.contains(a.key)) set_axis(a, Where{path + where}, o[a.key], p, threads);
    }
  };
  const auto check_keys = [&](const Json& o, const std::vector<std::string>& allowed, const std::string& where) {
    for (const auto& [k, v] : o.items()) {
      if (std::find(allowed.begin(), allowed.end(), k) == allowed.end()) {
        std::string list;
        for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
        fail(where + "unknown key '" + k + "'; allowed: " + list);
      }
    }
  };
  check_keys(doc, top, "");
  if (!doc.contains("description") || !doc["description"].is_string()) fail("missing key 'description' (a string)");
  if (!doc.contains("runs") || !doc["runs"].is_array() || doc["runs"].empty()) {
    fail("key 'runs': a non-empty list of objects with keys name, kv_heads, ... is required");
  }
  const auto int_at = [&](const Json& o, const char* key, int64_t dflt, int64_t lo) -> int64_t {
    if (!o.contains(key)) return dflt;
    const Json& v = o[key];
    if (!v.is_number_integer() || v.get<int64_t>() < lo) {
      fail("key '" + std::string(key) + "': bad value " + v.dump() + "; allowed: an integer >= " + std::to_string(lo));
    }
    return v.get<int64_t>();
  };
  const auto prompts_at = [&](const Json& o, const std::vector<int64_t>& dflt) {
    if (!o.contains("prompts")) return dflt;
    const Json& v = o["prompts"];
    std::vector<int64_t> out;
    if (!v.is_array() || v.empty()) fail("key 'prompts': bad value " + v.dump() + "; allowed: a list of integers >= 0");
    for (const Json& x : v) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0) {
        fail("key 'prompts': bad value " + x.dump() + "; allowed: integers >= 0");
      }
      out.push_back(x.get<int64_t>());
    }
    return out;
  };
  GenerationConfig base;
  set_head(doc, base.head, "");
  base.steps = int_at(doc, "steps", base.steps, 1);
  base.capacity = int_at(doc, "capacity", 0, 0);
  base.prefill_max_tokens = int_at(doc, "prefill_max_tokens", base.prefill_max_tokens, 0);
  base.verify_steps = static_cast<int>(int_at(doc, "verify_steps", base.verify_steps, 0));
  base.repetitions = static_cast<int>(int_at(doc, "repetitions", base.repetitions, 1));
  base.seed = static_cast<uint64_t>(int_at(doc, "seed", 1, 0));
  if (doc.contains("kernel")) base.kernel = doc["kernel"].get<std::string>();
  if (doc.contains("prefill_kernel")) base.prefill_kernel = doc["prefill_kernel"].get<std::string>();
  base.threads = all_threads;
  if (doc.contains("threads") && doc["threads"] != "all")
    base.threads = thread_count(int_at(doc, "threads", 1, 1), path + ": threads");
  const std::vector<int64_t> prompts = prompts_at(doc, {1024});

  std::vector<GenerationConfig> out;
  for (const Json& run : doc["runs"]) {
    if (!run.is_object()) fail("key 'runs': bad entry " + run.dump() + "; allowed: objects");
    check_keys(run, per_run, "a run: ");
    GenerationConfig c = base;
    if (!run.contains("name") || !run["name"].is_string()) fail("a run: missing key 'name' (a string)");
    c.name = run["name"].get<std::string>();
    set_head(run, c.head, " run '" + c.name + "'");
    c.steps = int_at(run, "steps", c.steps, 1);
    for (int64_t p : prompts_at(run, prompts)) {
      GenerationConfig x = c;
      x.prompt = p;
      try {
        x.validate();
      } catch (const InvalidInput& e) {
        fail("run '" + x.name + "' with prompt " + std::to_string(p) + ": " + e.what());
      }
      out.push_back(x);
    }
  }
  return out;
}

}  // namespace attnlab::bench
