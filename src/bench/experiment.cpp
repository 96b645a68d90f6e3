#include "bench/experiment.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "attnlab/isa.hpp"
#include "attnlab/kernel.hpp"
#include "attnlab/limits.hpp"
#include "bench/bench_point.hpp"
#include "bench/files.hpp"
#include "bench/peers.hpp"

namespace attnlab::bench {

namespace {

using Json = nlohmann::json;

// Bounds on what a file can ask for, so a hostile file is an error, not an endless loop.
constexpr int64_t kMaxGridPoints = 100000;  // points of all grids together
constexpr int64_t kMaxListLength = 4096;    // values of one key (after expanding pow2 / range)

// Keys of one grid (allowed at the top level and inside "grids" entries).
const std::vector<std::string> kGridKeys = {
    "implementations", "batch",    "q_heads",  "kv_heads", "gqa_groups", "q_len", "kv_len",  "head_dim", "head_dim_v",
    "d_model",         "model",    "causal",   "window",   "layout",     "dtype", "threads", "isa",      "sinks",
    "global",          "doc_lens", "dilation", "bigbird"};
// Keys allowed only at the top level.
const std::vector<std::string> kRunKeys = {"description",       "repetitions", "rounds", "min_time_s", "time_cap_s",
                                           "memory_budget_mib", "verify_rows", "seed",   "grids",      "peers"};
// A grid key that replaces the top-level one's alternative.
const std::vector<std::pair<std::string, std::string>> kExclusive = {{"kv_heads", "gqa_groups"},
                                                                     {"head_dim", "d_model"}};

constexpr const char* kIntsAllowed =
    "a positive integer, a list of them, {\"pow2\": [lo, hi]} (powers of two, lo <= hi) or "
    "{\"range\": [start, stop, step]} (stop inclusive, step >= 1)";

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Error builder: every message names the file, the key, the bad value and what is allowed.
struct Where {
  std::string file;
  [[noreturn]] void bad(const std::string& key, const Json& value, const std::string& allowed) const {
    throw InvalidInput("experiment " + file + ": key '" + key + "': bad value " + value.dump() +
                       "; allowed: " + allowed);
  }
  [[noreturn]] void fail(const std::string& what) const { throw InvalidInput("experiment " + file + ": " + what); }
};

// An integer that fits int64 (nlohmann keeps larger ones as uint64).
bool is_int(const Json& v) {
  return v.is_number_integer() && (!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t{INT64_MAX});
}

// A list `key` may not have more than kMaxListLength values; `count` is how many it has.
void check_list_length(const Where& w, const std::string& key, const Json& v, uint64_t count) {
  if (count > static_cast<uint64_t>(kMaxListLength)) {
    w.bad(key, v,
          "at most " + std::to_string(kMaxListLength) + " values per key (this gives " + std::to_string(count) + ")");
  }
}

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// INTS, each value >= min_value.
std::vector<int64_t> parse_ints(const Where& w, const std::string& key, const Json& v, int64_t min_value) {
  const std::string allowed = std::string(kIntsAllowed) + ", each >= " + std::to_string(min_value);
  std::vector<int64_t> out;
  auto take = [&](const Json& x) {
    if (!is_int(x) || x.get<int64_t>() < min_value) w.bad(key, v, allowed);
    out.push_back(x.get<int64_t>());
  };
  if (is_int(v)) {
    take(v);
  } else if (v.is_array()) {
    if (v.empty()) w.bad(key, v, allowed + " (not an empty list)");
    check_list_length(w, key, v, v.size());
    for (const auto& x : v) take(x);
  } else if (v.is_object() && v.size() == 1 && v.contains("pow2")) {
    const Json& a = v["pow2"];
    if (!a.is_array() || a.size() != 2 || !is_int(a[0]) || !is_int(a[1])) w.bad(key, v, allowed);
    const int64_t lo = a[0].get<int64_t>(), hi = a[1].get<int64_t>();
    if (!is_pow2(lo) || !is_pow2(hi) || lo > hi || lo < min_value) w.bad(key, v, allowed);
    // x <= hi / 2 before doubling: 2 * x never passes INT64_MAX.
    for (int64_t x = lo;; x *= 2) {
      out.push_back(x);
      if (x > hi / 2) break;
    }
  } else if (v.is_object() && v.size() == 1 && v.contains("range")) {
    const Json& a = v["range"];
    if (!a.is_array() || a.size() != 3 || !is_int(a[0]) || !is_int(a[1]) || !is_int(a[2])) w.bad(key, v, allowed);
    const int64_t start = a[0].get<int64_t>(), stop = a[1].get<int64_t>(), step = a[2].get<int64_t>();
    if (step < 1 || start > stop || start < min_value) w.bad(key, v, allowed);
    // start >= 0 here, so stop - start cannot wrap; values are start + n * step, never summed past stop.
    const uint64_t count = static_cast<uint64_t>((stop - start) / step) + 1;
    check_list_length(w, key, v, count);
    for (uint64_t n = 0; n < count; ++n) out.push_back(start + static_cast<int64_t>(n) * step);
  } else {
    w.bad(key, v, allowed);
  }
  std::vector<int64_t> unique;
  for (int64_t x : out) {
    if (std::find(unique.begin(), unique.end(), x) == unique.end()) unique.push_back(x);
  }
  return unique;
}

CausalAlign parse_one_causal(const Where& w, const Json& whole, const Json& v) {
  if (v.is_boolean()) return v.get<bool>() ? CausalAlign::BottomRight : CausalAlign::None;
  if (v.is_string() && v.get<std::string>() == "top_left") return CausalAlign::TopLeft;
  if (v.is_string() && v.get<std::string>() == "bottom_right") return CausalAlign::BottomRight;
  w.bad("causal", whole, "false, true (bottom-right aligned), \"bottom_right\", \"top_left\", or a list of these");
}

std::vector<CausalAlign> parse_causal(const Where& w, const Json& v) {
  std::vector<CausalAlign> out;
  if (v.is_array()) {
    if (v.empty()) w.bad("causal", v, "a non-empty list of false, true, \"top_left\"");
    check_list_length(w, "causal", v, v.size());
    for (const auto& x : v) out.push_back(parse_one_causal(w, v, x));
  } else {
    out.push_back(parse_one_causal(w, v, v));
  }
  return out;
}

std::vector<Window> parse_window(const Where& w, const Json& v) {
  const std::string allowed =
      "null (no window), [L, R] with integers >= -1 (-1 = unbounded), or a list of null / [L, R]";
  auto one = [&](const Json& x) -> Window {
    if (x.is_null() || (x.is_string() && x.get<std::string>() == "none")) return {};
    if (!x.is_array() || x.size() != 2 || !is_int(x[0]) || !is_int(x[1]) || x[0].get<int64_t>() < -1 ||
        x[1].get<int64_t>() < -1) {
      w.bad("window", v, allowed);
    }
    return {x[0].get<int64_t>(), x[1].get<int64_t>()};
  };
  // [L, R] of two integers is one window; any other list is a list of windows.
  if (v.is_array() && v.size() == 2 && is_int(v[0]) && is_int(v[1])) return {one(v)};
  if (v.is_array()) {
    if (v.empty()) w.bad("window", v, allowed);
    check_list_length(w, "window", v, v.size());
    std::vector<Window> out;
    for (const auto& x : v) out.push_back(one(x));
    return out;
  }
  return {one(v)};
}

int64_t parse_one_int(const Where& w, const std::string& key, const Json& v, int64_t min_value,
                      const std::string& allowed) {
  if (!is_int(v) || v.get<int64_t>() < min_value) w.bad(key, v, allowed);
  return v.get<int64_t>();
}

// A list of integers >= min_value, or {"<form>": n} with n >= 1.
void parse_list_or_form(const Where& w, const std::string& key, const Json& v, const char* form, int64_t min_value,
                        std::vector<int64_t>& list, int64_t& n, const std::string& allowed) {
  if (v.is_object() && v.size() == 1 && v.contains(form)) {
    n = parse_one_int(w, key, v[form], 1, allowed);
    return;
  }
  if (!v.is_array() || v.empty()) w.bad(key, v, allowed);
  check_list_length(w, key, v, v.size());
  for (const auto& x : v) list.push_back(parse_one_int(w, key, x, min_value, allowed));
}

PatternKeys parse_pattern(const Where& w, const Json& doc) {
  PatternKeys k;
  if (doc.contains("sinks")) k.sinks = parse_one_int(w, "sinks", doc["sinks"], 0, "an integer >= 0 (keys j < N)");
  if (doc.contains("dilation")) k.dilation = parse_one_int(w, "dilation", doc["dilation"], 1, "an integer >= 1");
  if (doc.contains("global")) {
    parse_list_or_form(w, "global", doc["global"], "spread", 0, k.globals, k.global_spread,
                       "a list of positions >= 0, or {\"spread\": N} (N positions i * kv_len / N)");
  }
  if (doc.contains("doc_lens")) {
    parse_list_or_form(w, "doc_lens", doc["doc_lens"], "mean", 1, k.doc_lens, k.doc_mean,
                       "a list of lengths >= 1 adding up to q_len = kv_len, or {\"mean\": M} (lengths M/2, "
                       "3M/2, M repeating, the last cut to fit)");
  }
  if (doc.contains("bigbird")) {
    const Json& v = doc["bigbird"];
    const std::string allowed = "[BLOCK, RANDOM, SEED]: integers, BLOCK >= 1, RANDOM >= 0, SEED >= 0";
    if (!v.is_array() || v.size() != 3) w.bad("bigbird", v, allowed);
    k.bigbird = BigBird{parse_one_int(w, "bigbird", v[0], 1, allowed), parse_one_int(w, "bigbird", v[1], 0, allowed),
                        parse_one_int(w, "bigbird", v[2], 0, allowed)};
  }
  return k;
}

std::vector<Layout> parse_layouts(const Where& w, const Json& v) {
  auto one = [&](const Json& x) {
    if (x.is_string() && x.get<std::string>() == "bhsd") return Layout::BHSD;
    if (x.is_string() && x.get<std::string>() == "bshd") return Layout::BSHD;
    w.bad("layout", v, "\"bhsd\", \"bshd\", or a list of these");
  };
  std::vector<Layout> out;
  if (v.is_array()) {
    if (v.empty()) w.bad("layout", v, "\"bhsd\", \"bshd\", or a non-empty list of these");
    check_list_length(w, "layout", v, v.size());
    for (const auto& x : v) out.push_back(one(x));
  } else {
    out.push_back(one(v));
  }
  return out;
}

std::vector<DType> parse_dtypes(const Where& w, const Json& v) {
  const char* allowed = "\"f32\", \"bf16\", \"f16\", or a non-empty list of these";
  auto one = [&](const Json& x) {
    for (DType d : {DType::F32, DType::BF16, DType::F16}) {
      if (x.is_string() && x.get<std::string>() == to_string(d)) return d;
    }
    w.bad("dtype", v, allowed);
  };
  std::vector<DType> out;
  if (v.is_array()) {
    if (v.empty()) w.bad("dtype", v, allowed);
    check_list_length(w, "dtype", v, v.size());
    for (const auto& x : v) out.push_back(one(x));
  } else {
    out.push_back(one(v));
  }
  return out;
}

std::vector<int> parse_threads(const Where& w, const Json& v) {
  const std::string allowed = "\"all\" (every core), an integer 1..1024, a list of these, or INTS";
  auto one = [&](const Json& x) -> int {
    if (x.is_string() && x.get<std::string>() == "all") return 0;
    if (is_int(x) && x.get<int64_t>() >= 1 && x.get<int64_t>() <= 1024) return static_cast<int>(x.get<int64_t>());
    w.bad("threads", v, allowed);
  };
  if (v.is_array()) {
    if (v.empty()) w.bad("threads", v, allowed);
    check_list_length(w, "threads", v, v.size());
    std::vector<int> out;
    for (const auto& x : v) out.push_back(one(x));
    return out;
  }
  if (v.is_object()) {
    std::vector<int> out;
    for (int64_t t : parse_ints(w, "threads", v, 1)) {
      if (t > 1024) w.bad("threads", v, allowed);
      out.push_back(static_cast<int>(t));
    }
    return out;
  }
  return {one(v)};
}

// "all" | NAME | [NAME, ...]: the targets, in build order (narrowest first).
std::vector<std::string> parse_isa(const Where& w, const Json& v, const IsaChoices& isas) {
  const std::string allowed = "\"all\" (every target this CPU runs: " + join(isas.runnable) +
                              "), a target of this build (" + join(isas.built) + ") or a list of them";
  if (v.is_string() && v.get<std::string>() == "all") return isas.runnable;
  std::vector<std::string> named;
  auto one = [&](const Json& x) {
    if (!x.is_string() || std::find(isas.built.begin(), isas.built.end(), x.get<std::string>()) == isas.built.end()) {
      w.bad("isa", v, allowed);
    }
    named.push_back(x.get<std::string>());
  };
  if (v.is_array()) {
    if (v.empty()) w.bad("isa", v, allowed + " (not an empty list)");
    check_list_length(w, "isa", v, v.size());
    for (const auto& x : v) one(x);
  } else {
    one(v);
  }
  std::vector<std::string> out;
  for (const std::string& b : isas.built) {
    if (std::find(named.begin(), named.end(), b) != named.end()) out.push_back(b);
  }
  return out;
}

double parse_positive(const Where& w, const std::string& key, const Json& v) {
  if (!v.is_number() || !(v.get<double>() > 0) || v.get<double>() > 1e9) w.bad(key, v, "a number > 0");
  return v.get<double>();
}

int64_t parse_int_at_least(const Where& w, const std::string& key, const Json& v, int64_t lo, int64_t hi) {
  if (!is_int(v) || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
    w.bad(key, v, "an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
  }
  return v.get<int64_t>();
}

// The grid keys of `doc` (a top-level document, or one merged with a "grids" entry).
Grid parse_grid(const Where& w, const Json& doc, const std::vector<std::string>& known_kernels,
                const IsaChoices& isas) {
  Grid g;
  // implementations
  const Json impl = doc.value("implementations", Json("all"));
  const std::string impl_allowed = "\"all\" or a list of kernel names from: " + join(known_kernels);
  if (impl.is_string() && impl.get<std::string>() == "all") {
    g.implementations = known_kernels;
  } else if (impl.is_array() && !impl.empty()) {
    for (const auto& x : impl) {
      if (!x.is_string()) w.bad("implementations", impl, impl_allowed);
      const std::string k = x.get<std::string>();
      if (std::find(known_kernels.begin(), known_kernels.end(), k) == known_kernels.end()) {
        w.bad("implementations", x, impl_allowed);
      }
      if (std::find(g.implementations.begin(), g.implementations.end(), k) == g.implementations.end()) {
        g.implementations.push_back(k);
      }
    }
  } else {
    w.bad("implementations", impl, impl_allowed);
  }

  g.batch = parse_ints(w, "batch", doc.value("batch", Json(1)), 1);
  g.q_heads = parse_ints(w, "q_heads", doc.value("q_heads", Json(8)), 1);

  if (doc.contains("kv_heads") && doc.contains("gqa_groups")) {
    w.fail(
        "keys 'kv_heads' and 'gqa_groups' exclude each other; allowed: one of them (gqa_groups = q_heads / kv_heads)");
  }
  if (doc.contains("gqa_groups")) {
    g.gqa_groups = parse_ints(w, "gqa_groups", doc["gqa_groups"], 1);
    for (int64_t group : g.gqa_groups) {
      for (int64_t h : g.q_heads) {
        if (h % group != 0) {
          w.bad("gqa_groups", Json(group),
                "divisors of every q_heads value (" + std::to_string(h) + " is not divisible)");
        }
      }
    }
  } else if (!doc.contains("kv_heads") || (doc["kv_heads"].is_string() && doc["kv_heads"] == "q_heads")) {
    g.kv_heads_from_q_heads = true;
  } else {
    g.kv_heads = parse_ints(w, "kv_heads", doc["kv_heads"], 1);
  }

  if (!doc.contains("q_len")) w.fail(std::string("missing key 'q_len'; allowed: ") + kIntsAllowed);
  g.q_len = parse_ints(w, "q_len", doc["q_len"], 1);
  if (!doc.contains("kv_len") || (doc["kv_len"].is_string() && doc["kv_len"] == "q_len")) {
    g.kv_len_from_q_len = true;
  } else {
    g.kv_len = parse_ints(w, "kv_len", doc["kv_len"], 0);
  }

  if (doc.contains("head_dim") && doc.contains("d_model")) {
    w.fail("keys 'head_dim' and 'd_model' exclude each other; allowed: one of them (head_dim = d_model / q_heads)");
  }
  if (doc.contains("d_model")) {
    g.d_model = parse_ints(w, "d_model", doc["d_model"], 1);
    for (int64_t dm : g.d_model) {
      for (int64_t h : g.q_heads) {
        if (dm % h != 0) {
          w.bad("d_model", Json(dm), "multiples of every q_heads value (not divisible by " + std::to_string(h) + ")");
        }
      }
    }
  } else {
    g.head_dim = parse_ints(w, "head_dim", doc.value("head_dim", Json(128)), 1);
  }

  g.head_dim_v = parse_ints(w, "head_dim_v", doc.value("head_dim_v", Json(0)), 0);
  if (doc.contains("model")) {
    const Json& m = doc["model"];
    g.model = m.is_string() ? m.get<std::string>() : std::string();
    if (!is_label(g.model)) w.bad("model", m, std::string("a name of ") + kLabelAllowed);
  }
  g.causal = parse_causal(w, doc.value("causal", Json(false)));
  g.window = parse_window(w, doc.value("window", Json(nullptr)));
  g.layout = parse_layouts(w, doc.value("layout", Json("bhsd")));
  g.dtype = parse_dtypes(w, doc.value("dtype", Json("f32")));
  g.threads = parse_threads(w, doc.value("threads", Json("all")));
  if (doc.contains("isa")) g.isa = parse_isa(w, doc["isa"], isas);
  g.pattern = parse_pattern(w, doc);

  return g;
}

}  // namespace

IsaChoices IsaChoices::here() {
  IsaChoices c;
  c.built = built_isas();
  c.runnable = runnable_isas();
  for (const Kernel* k : registry()) {
    if (std::find(c.built.begin(), c.built.end(), k->isa()) != c.built.end())
      c.per_target_kernels.emplace_back(k->name());
  }
  return c;
}

std::vector<std::string> registry_kernel_names() {
  std::vector<std::string> names;
  for (const Kernel* k : registry()) names.emplace_back(k->name());
  return names;
}

Experiment parse_experiment(const Json& doc, const std::string& name, const std::vector<std::string>& known_kernels,
                            const IsaChoices& isas) {
  const Where w{name};
  if (!doc.is_object())
    w.fail("the document must be a JSON object with the keys: " + join(kGridKeys) + ", " + join(kRunKeys));
  if (doc.contains("kind")) {  // generation experiments (src/bench/generation.hpp) are not sweeps
    w.bad("kind", doc["kind"],
          "no 'kind' in a sweep experiment; a \"generation\" experiment runs with attnlab generate "
          "(scripts/lab report NAME picks it)");
  }
  for (const auto& [key, value] : doc.items()) {
    if (std::find(kGridKeys.begin(), kGridKeys.end(), key) == kGridKeys.end() &&
        std::find(kRunKeys.begin(), kRunKeys.end(), key) == kRunKeys.end()) {
      std::vector<std::string> all = kRunKeys;
      all.insert(all.begin() + 1, kGridKeys.begin(), kGridKeys.end());
      w.fail("unknown key '" + key + "'; allowed keys: " + join(all));
    }
  }
  Experiment e;
  e.name = name;
  e.source = doc;
  e.isa_choices = isas;

  if (!doc.contains("description"))
    w.fail("missing key 'description'; allowed: a string saying what the experiment asks");
  if (!doc["description"].is_string() || doc["description"].get<std::string>().empty()) {
    w.bad("description", doc["description"], "a non-empty string");
  }
  e.description = doc["description"].get<std::string>();

  if (doc.contains("grids")) {
    const Json& grids = doc["grids"];
    if (!grids.is_array() || grids.empty()) {
      w.bad("grids", grids, "a non-empty list of objects with grid keys (" + join(kGridKeys) + ")");
    }
    Json base = doc;
    base.erase("grids");
    for (size_t i = 0; i < grids.size(); ++i) {
      const Where wi{name + " grids[" + std::to_string(i) + "]"};
      const Json& sub = grids[i];
      if (!sub.is_object() || sub.empty()) {
        wi.bad("grids", sub, "an object with grid keys (" + join(kGridKeys) + ")");
      }
      Json merged = base;
      for (const auto& [key, value] : sub.items()) {
        if (std::find(kGridKeys.begin(), kGridKeys.end(), key) == kGridKeys.end()) {
          wi.fail("unknown key '" + key + "'; allowed keys in a grid: " + join(kGridKeys));
        }
        for (const auto& [a, b] : kExclusive) {
          if (key == a && !sub.contains(b)) merged.erase(b);
          if (key == b && !sub.contains(a)) merged.erase(a);
        }
        merged[key] = value;
      }
      e.grids.push_back(parse_grid(wi, merged, known_kernels, isas));
    }
  } else {
    e.grids.push_back(parse_grid(w, doc, known_kernels, isas));
  }
  for (const std::string& k : known_kernels) {
    for (const Grid& g : e.grids) {
      if (std::find(g.implementations.begin(), g.implementations.end(), k) != g.implementations.end()) {
        e.implementations.push_back(k);
        break;
      }
    }
  }

  if (doc.contains("repetitions"))
    e.repetitions = static_cast<int>(parse_int_at_least(w, "repetitions", doc["repetitions"], 1, 1000));
  if (doc.contains("rounds")) e.rounds = static_cast<int>(parse_int_at_least(w, "rounds", doc["rounds"], 1, 100));
  if (doc.contains("min_time_s")) e.min_time_s = parse_positive(w, "min_time_s", doc["min_time_s"]);
  if (doc.contains("time_cap_s")) e.time_cap_s = parse_positive(w, "time_cap_s", doc["time_cap_s"]);
  if (doc.contains("memory_budget_mib"))
    e.memory_budget_mib = parse_positive(w, "memory_budget_mib", doc["memory_budget_mib"]);
  if (doc.contains("verify_rows"))
    e.verify_rows = static_cast<int>(parse_int_at_least(w, "verify_rows", doc["verify_rows"], 1, 1 << 20));
  if (doc.contains("seed")) e.seed = static_cast<uint64_t>(parse_int_at_least(w, "seed", doc["seed"], 0, INT64_MAX));
  if (doc.contains("peers")) {
    const Json& v = doc["peers"];
    std::vector<std::string> items;
    if (v.is_string()) items = split_list(v.get<std::string>());
    if (v.is_array()) {
      for (const Json& x : v) {
        if (!x.is_string()) w.bad("peers", v, "a list of peer names (strings)");
        items.push_back(x.get<std::string>());
      }
    }
    if (!v.is_string() && !v.is_array()) w.bad("peers", v, "a list of peer names, or one comma-separated string");
    try {
      e.peers = parse_peers(items, "peers");
    } catch (const InvalidInput& err) {
      w.fail(std::string("key 'peers': ") + err.what());
    }
  }

  // The grid must be small enough to run and every combination valid: expand once now.
  (void)expand(e, 1);
  return e;
}

Experiment parse_experiment_text(const std::string& text, const std::string& name,
                                 const std::vector<std::string>& known_kernels, const IsaChoices& isas) {
  Json doc;
  try {
    doc = Json::parse(text);
  } catch (const Json::exception& err) {  // parse_error, or out_of_range for a number like 1e999
    throw InvalidInput("experiment " + name + ": not valid JSON (" + err.what() + ")");
  }
  return parse_experiment(doc, name, known_kernels, isas);
}

Experiment load_experiment(const std::string& path, const std::vector<std::string>& known_kernels,
                           const IsaChoices& isas) {
  Experiment e = parse_experiment_text(read_text_file(path), path, known_kernels, isas);
  e.name = std::filesystem::path(path).stem().string();
  return e;
}

void PatternKeys::apply(Problem& p) const {
  p.sinks = sinks;
  p.dilation = dilation;
  p.bigbird = bigbird;
  p.globals = globals;
  for (int64_t g = 0; g < global_spread; ++g) {
    const int64_t at = g * p.kv_len / global_spread;
    if (p.globals.empty() || at > p.globals.back()) p.globals.push_back(at);
  }
  p.doc_lens = doc_lens;
  if (doc_mean > 0) {
    const int64_t cycle[3] = {std::max<int64_t>(1, doc_mean / 2), doc_mean + doc_mean / 2, doc_mean};
    for (int64_t at = 0, n = 0; at < p.q_len; ++n) {
      const int64_t len = std::min(cycle[n % 3], p.q_len - at);
      p.doc_lens.push_back(len);
      at += len;
    }
  }
}

std::string GridPoint::id() const { return point_id(PointView{kernel, problem, threads, isa, model}); }

std::vector<GridPoint> expand(const Experiment& e, int all_threads) {
  const Where w{e.name};
  std::vector<GridPoint> out;
  std::set<std::string> seen;
  const std::vector<int64_t> none = {0};
  const std::vector<std::string> default_isa = {""};
  const auto& per_target = e.isa_choices.per_target_kernels;
  int64_t combos = 0;
  for (const Grid& gr : e.grids) {
    const auto& groups_or_kv = !gr.gqa_groups.empty() ? gr.gqa_groups : (gr.kv_heads_from_q_heads ? none : gr.kv_heads);
    const auto& dims = !gr.d_model.empty() ? gr.d_model : gr.head_dim;
    const auto& kv_lens = gr.kv_len_from_q_len ? none : gr.kv_len;
    const std::initializer_list<size_t> sizes = {gr.implementations.size(),
                                                 gr.batch.size(),
                                                 gr.q_heads.size(),
                                                 groups_or_kv.size(),
                                                 gr.q_len.size(),
                                                 kv_lens.size(),
                                                 dims.size(),
                                                 gr.head_dim_v.size(),
                                                 gr.causal.size(),
                                                 gr.window.size(),
                                                 gr.layout.size(),
                                                 gr.dtype.size(),
                                                 gr.threads.size(),
                                                 std::max<size_t>(1, gr.isa.size())};
    std::optional<int64_t> points = 1;
    double shown = 1;  // for the message only: never wraps
    std::string product;
    for (size_t n : sizes) {
      if (points) points = checked_product({*points, static_cast<int64_t>(n)});
      shown *= static_cast<double>(n);
      product += (product.empty() ? "" : " x ") + std::to_string(n);
    }
    if (!points || *points > kMaxGridPoints - combos) {
      char count[32];
      std::snprintf(count, sizeof count, "%.6g", shown + static_cast<double>(combos));
      w.fail("the grids have " + std::string(count) + " points (this grid: " + product +
             " values of implementations x batch x q_heads x kv_heads x q_len x kv_len x head_dim x "
             "head_dim_v x causal x window x layout x dtype x threads x isa); allowed: at most " +
             std::to_string(kMaxGridPoints) + " points");
    }
    combos += *points;
    for (const auto& kernel : gr.implementations) {
      // The isa axis applies to kernels built per target; the others run once.
      const bool per = std::find(per_target.begin(), per_target.end(), kernel) != per_target.end();
      const auto& isas = per && !gr.isa.empty() ? gr.isa : default_isa;
      for (const std::string& isa : isas)
        for (int64_t b : gr.batch)
          for (int64_t hq : gr.q_heads)
            for (int64_t g : groups_or_kv)
              for (int64_t sq : gr.q_len)
                for (int64_t sk : kv_lens)
                  for (int64_t d : dims)
                    for (int64_t dv : gr.head_dim_v)
                      for (CausalAlign c : gr.causal)
                        for (const Window& win : gr.window)
                          for (Layout lay : gr.layout)
                            for (DType dt : gr.dtype)
                              for (int t : gr.threads) {
                                GridPoint gp;
                                gp.kernel = kernel;
                                gp.isa = isa;
                                gp.model = gr.model;
                                gp.threads = t == 0 ? all_threads : t;
                                Problem& p = gp.problem;
                                p.batch = b;
                                p.q_heads = hq;
                                p.kv_heads = !gr.gqa_groups.empty() ? hq / g : (gr.kv_heads_from_q_heads ? hq : g);
                                p.q_len = sq;
                                p.kv_len = gr.kv_len_from_q_len ? sq : sk;
                                p.head_dim = !gr.d_model.empty() ? d / hq : d;
                                p.head_dim_v = dv == p.head_dim ? 0 : dv;
                                p.causal = c;
                                p.window_left = win.left;
                                p.window_right = win.right;
                                p.layout = lay;
                                p.dtype = dt;
                                gr.pattern.apply(p);
                                try {
                                  p.validate();
                                } catch (const InvalidInput& err) {
                                  w.fail("grid point " + p.describe() + " is invalid: " + err.what());
                                }
                                gp.flops = p.flops();
                                if (seen.insert(gp.id()).second) out.push_back(std::move(gp));
                              }
    }
  }
  // Peers run every distinct shape (problem, threads, model) of the grids once each.
  const size_t lab_points = out.size();
  for (const std::string& peer : e.peers) {
    for (size_t i = 0; i < lab_points; ++i) {
      GridPoint gp = out[i];
      gp.kernel = peer;
      gp.isa.clear();
      if (seen.insert(gp.id()).second) out.push_back(std::move(gp));
    }
  }
  std::map<std::string, size_t> kernel_order;  // the lab's kernels, then the peers
  for (size_t i = 0; i < e.implementations.size(); ++i) kernel_order[e.implementations[i]] = i;
  for (size_t i = 0; i < e.peers.size(); ++i) kernel_order[e.peers[i]] = e.implementations.size() + i;
  std::map<std::string, size_t> isa_order;  // "" (default, built once) first, then narrowest first
  for (size_t i = 0; i < e.isa_choices.built.size(); ++i) isa_order[e.isa_choices.built[i]] = i + 1;
  std::stable_sort(out.begin(), out.end(), [&](const GridPoint& a, const GridPoint& b) {
    if (a.flops != b.flops) return a.flops < b.flops;
    const size_t ka = kernel_order[a.kernel], kb = kernel_order[b.kernel];
    if (ka != kb) return ka < kb;
    const size_t ia = isa_order[a.isa], ib = isa_order[b.isa];
    if (ia != ib) return ia < ib;
    return a.id() < b.id();
  });
  return out;
}

}  // namespace attnlab::bench
