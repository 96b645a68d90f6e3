#include "bench/sweep/experiment.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "attnlab/isa.hpp"
#include "attnlab/kernel.hpp"
#include "attnlab/limits.hpp"
#include "bench/sweep/bench_point.hpp"
#include "bench/results/files.hpp"
#include "bench/peers/peers.hpp"

namespace attnlab::bench {

namespace {

// Bounds on what a file can ask for, so a hostile file is an error, not an endless loop.
constexpr int64_t kMaxGridPoints = 100000;  // points of all grids together

// Keys of one grid (allowed at the top level and inside "grids" entries): the kernels, the
// schema's axes (the mask and the sparse pattern terms among them), the grid's label and targets.
const std::vector<std::string>& grid_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k = {"implementations"};
    for (const Axis& a : axes()) k.emplace_back(a.key);
    for (const char* x : {"model", "isa"}) k.emplace_back(x);
    return k;
  }();
  return keys;
}
bool is_grid_key(const std::string& key) {
  const auto& k = grid_keys();
  return std::find(k.begin(), k.end(), key) != k.end();
}
// Keys allowed only at the top level.
const std::vector<std::string> kRunKeys = {
    "description", "repetitions", "rounds", "min_time_s", "time_cap_s", "memory_budget_mib",
    "verify_rows", "seed",        "grids",  "peers",      "needles"};

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

// The grid keys of `doc` (a top-level document, or one merged with a "grids" entry).
Grid parse_grid(const Where& w, const Json& doc, const std::vector<std::string>& known_kernels,
                const IsaChoices& isas) {
  Grid g;
  g.where = w.file;
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

  // The schema's axes: a given key, else its default unless its alternative is given.
  for (const Axis& a : axes()) {
    const bool given = doc.contains(a.key), alternative = a.alternative && doc.contains(a.alternative);
    if (given && alternative && find_axis(a.alternative) > &a) {  // said once, at the first of the two
      w.fail(std::string("keys '") + a.key + "' and '" + a.alternative +
             "' exclude each other; allowed: one of them (" + a.alternative + ": " + find_axis(a.alternative)->help +
             ")");
    }
    if (!given && (alternative || (!a.fallback && a.alternative))) continue;  // the alternative's value counts
    if (!given && !a.fallback) w.fail(std::string("missing key '") + a.key + "'; allowed: " + kIntsAllowed);
    g.axes.push_back({&a, a.parse(w, a.key, given ? doc[a.key] : Json::parse(a.fallback))});
  }
  if (doc.contains("model")) {
    const Json& m = doc["model"];
    g.model = m.is_string() ? m.get<std::string>() : std::string();
    if (!is_label(g.model)) w.bad("model", m, std::string("a name of ") + kLabelAllowed);
  }
  if (doc.contains("isa")) g.isa = parse_isa(w, doc["isa"], isas);
  return g;
}

}  // namespace

const std::vector<Json>* Grid::values(std::string_view key) const {
  for (const AxisValues& a : axes) {
    if (key == a.axis->key) return &a.values;
  }
  return nullptr;
}

void Grid::set(std::string_view key, std::vector<Json> values) {
  const Axis* axis = find_axis(key);
  if (!axis) throw std::logic_error("Grid::set: no axis '" + std::string(key) + "'");
  for (AxisValues& a : axes) {
    if (a.axis == axis) {
      a.values = std::move(values);
      return;
    }
  }
  axes.push_back({axis, std::move(values)});
  std::stable_sort(axes.begin(), axes.end(), [](const AxisValues& x, const AxisValues& y) { return x.axis < y.axis; });
}

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
    w.fail("the document must be a JSON object with the keys: " + join(grid_keys()) + ", " + join(kRunKeys));
  if (doc.contains("kind")) {  // generation experiments (src/bench/generation/generation.hpp) are not sweeps
    w.bad("kind", doc["kind"],
          "no 'kind' in a sweep experiment; a \"generation\" experiment runs with attnlab generate "
          "(scripts/lab report NAME picks it)");
  }
  for (const auto& [key, value] : doc.items()) {
    if (!is_grid_key(key) && std::find(kRunKeys.begin(), kRunKeys.end(), key) == kRunKeys.end()) {
      std::vector<std::string> all = kRunKeys;
      all.insert(all.begin() + 1, grid_keys().begin(), grid_keys().end());
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
      w.bad("grids", grids, "a non-empty list of objects with grid keys (" + join(grid_keys()) + ")");
    }
    Json base = doc;
    base.erase("grids");
    for (size_t i = 0; i < grids.size(); ++i) {
      const Where wi{name + " grids[" + std::to_string(i) + "]"};
      const Json& sub = grids[i];
      if (!sub.is_object() || sub.empty()) {
        wi.bad("grids", sub, "an object with grid keys (" + join(grid_keys()) + ")");
      }
      Json merged = base;
      for (const auto& [key, value] : sub.items()) {
        if (!is_grid_key(key)) {
          wi.fail("unknown key '" + key + "'; allowed keys in a grid: " + join(grid_keys()));
        }
        // A grid's key drops the top level's alternative to it (kv_heads drops gqa_groups).
        const Axis* axis = find_axis(key);
        if (axis && axis->alternative && !sub.contains(axis->alternative)) merged.erase(axis->alternative);
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
  if (doc.contains("needles")) {
    const Json& v = doc["needles"];
    const std::string allowed = "{\"per_row\": N >= 1, \"mass\": a share in (0, 1) (default 0.97)}";
    if (!v.is_object() || !v.contains("per_row")) w.bad("needles", v, allowed);
    for (const auto& [key, x] : v.items()) {
      if (key != "per_row" && key != "mass") w.bad("needles", v, allowed);
    }
    e.needles.per_row = parse_int_at_least(w, "needles.per_row", v["per_row"], 1, 1 << 20);
    if (v.contains("mass")) {
      if (!v["mass"].is_number() || !(v["mass"].get<double>() > 0 && v["mass"].get<double>() < 1)) {
        w.bad("needles", v, allowed);
      }
      e.needles.mass = v["mass"].get<double>();
    }
  }
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

void override_keys(Json& doc, const Json& overrides) {
  for (const auto& item : overrides.items()) {
    const std::string key = item.key();  // (clang 14 cannot capture a structured binding)
    const Axis* axis = find_axis(key);
    const auto drop = [&](Json& d) {
      d.erase(key);
      if (axis && axis->alternative) d.erase(axis->alternative);
    };
    drop(doc);
    if (doc.contains("grids")) {
      for (Json& g : doc["grids"]) drop(g);
    }
    doc[key] = item.value();
  }
}

Experiment load_experiment(const std::string& path, const std::vector<std::string>& known_kernels,
                           const IsaChoices& isas, const Json& overrides) {
  const std::string text = read_text_file(path);
  Experiment e;
  if (overrides.empty()) {
    e = parse_experiment_text(text, path, known_kernels, isas);
  } else {
    Json doc = parse_experiment_text(text, path, known_kernels, isas).source;
    override_keys(doc, overrides);
    e = parse_experiment(doc, path, known_kernels, isas);
  }
  e.name = std::filesystem::path(path).stem().string();
  return e;
}

std::string GridPoint::id() const { return point_id(PointView{kernel, problem, threads, isa, model}); }

std::vector<GridPoint> expand(const Experiment& e, int all_threads) {
  std::vector<GridPoint> out;
  std::set<std::string> seen;
  const std::vector<std::string> default_isa = {""};
  const auto& per_target = e.isa_choices.per_target_kernels;
  int64_t combos = 0;
  for (const Grid& gr : e.grids) {
    const Where w{gr.where.empty() ? e.name : gr.where};
    // The grid's size, checked before any point is made.
    std::vector<std::pair<std::string, size_t>> sizes = {{"implementations", gr.implementations.size()}};
    for (const AxisValues& a : gr.axes) sizes.emplace_back(a.axis->key, a.values.size());
    sizes.emplace_back("isa", std::max<size_t>(1, gr.isa.size()));
    std::optional<int64_t> points = 1;
    double shown = 1;  // for the message only: never wraps
    std::string product, names;
    for (const auto& [name, n] : sizes) {
      if (points) points = checked_product({*points, static_cast<int64_t>(n)});
      shown *= static_cast<double>(n);
      product += (product.empty() ? "" : " x ") + std::to_string(n);
      names += (names.empty() ? "" : " x ") + name;
    }
    if (!points || *points > kMaxGridPoints - combos) {
      char count[32];
      std::snprintf(count, sizeof count, "%.6g", shown + static_cast<double>(combos));
      w.fail("the grids have " + std::string(count) + " points (this grid: " + product + " values of " + names +
             "); allowed: at most " + std::to_string(kMaxGridPoints) + " points");
    }
    combos += *points;
    for (const auto& kernel : gr.implementations) {
      // The isa axis applies to kernels built per target; the others run once.
      const bool per = std::find(per_target.begin(), per_target.end(), kernel) != per_target.end();
      for (const std::string& isa : per && !gr.isa.empty() ? gr.isa : default_isa) {
        // An odometer over the axes, the last one turning fastest; each point applies its
        // values in table order (kv_heads after q_heads, head_dim_v after head_dim).
        std::vector<size_t> at(gr.axes.size(), 0);
        for (bool more = true; more;) {
          GridPoint gp;
          gp.kernel = kernel;
          gp.isa = isa;
          gp.model = gr.model;
          Problem& p = gp.problem;
          int threads = 0;
          for (size_t i = 0; i < at.size(); ++i) {
            const AxisValues& a = gr.axes[i];
            a.axis->apply(w, a.axis->key, a.values[at[i]], p, threads);
          }
          gp.threads = threads == 0 ? all_threads : threads;
          try {
            p.validate();
          } catch (const InvalidInput& err) {
            w.fail("grid point " + p.describe() + " is invalid: " + err.what());
          }
          gp.flops = p.flops();
          if (seen.insert(gp.id()).second) out.push_back(std::move(gp));
          more = false;
          for (size_t i = at.size(); i-- > 0;) {
            if (++at[i] < gr.axes[i].values.size()) {
              more = true;
              break;
            }
            at[i] = 0;
          }
        }
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
