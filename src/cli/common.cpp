#include "common.hpp"

#include <algorithm>
#include <sstream>

#include "attnlab/isa.hpp"
#include "attnlab/limits.hpp"

namespace attnlab::cli {

std::vector<int64_t> parse_int_list(const std::string& field, const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    try {
      size_t used = 0;
      const long long v = std::stoll(tok, &used);
      if (used != tok.size()) throw std::invalid_argument(tok);
      out.push_back(v);
    } catch (const std::exception&) {
      throw InvalidInput(field + ": '" + text + "' is not a comma-separated list of integers");
    }
  }
  if (out.empty()) throw InvalidInput(field + ": empty list; allowed: integers separated by commas");
  return out;
}

void IsaFlag::add_to(CLI::App& app, bool accept_lists) {
  lists = accept_lists;
  const std::string help = std::string("instruction-set target of the SIMD kernels (this CPU runs: ") +
                           isa_names(runnable_isas()) + "; default: ATTN_ISA, else " + best_isa() + ")" +
                           (lists ? "; or several, comma separated, or all" : "");
  app.add_option("--isa", value, help);
}

std::vector<std::string> IsaFlag::targets() const {
  if (value.empty()) return {};
  std::vector<std::string> out;
  if (value == "all") {
    out = runnable_isas();
  } else {
    std::stringstream ss(value);
    std::string tok;
    while (std::getline(ss, tok, ',')) {
      require_isa(tok);
      if (std::find(out.begin(), out.end(), tok) == out.end()) out.push_back(tok);
    }
    if (out.empty()) require_isa("");
  }
  if (!lists && (value == "all" || out.size() > 1)) {
    throw InvalidInput("isa: '" + value + "' names several targets; allowed: one target this CPU runs (" + [] {
      std::string r;
      for (const auto& t : runnable_isas()) r += (r.empty() ? "" : ", ") + t;
      return r;
    }() + ")");
  }
  return out;
}

std::vector<std::string> IsaFlag::apply() const {
  const std::vector<std::string> t = targets();
  if (t.size() == 1 && value != "all") set_default_isa(t.front());
  return t;
}

void MaskFlags::add_to(CLI::App& app) {
  masks.add_to(app, {schema::AxisKind::Mask, schema::AxisKind::Score});
  masks
      .alias(app, "causal", "--causal-top-left", "top_left",
             "causal mask aligned top-left (PyTorch is_causal: j <= i); the same as --causal=top_left")
      ->excludes("--causal");
  masks.alias(app, "mask_file", "--mask", nullptr, "the same as --mask-file");
  app.add_option("--scale", scale, "softmax scale (default 1/sqrt(head_dim))");
  settings.add_to(app, {schema::AxisKind::Setting});
  app.add_option("--threads", threads, "threads (default: all cores)");
}

void MaskFlags::apply(Problem& p) const {
  masks.apply(p);
  p.scale = scale;
  settings.apply(p);
}

int MaskFlags::thread_count() const { return attnlab::thread_count(threads); }

namespace {
// An axis's flag: an option taking the value, or (Axis::bare) a flag that alone means that
// value and takes another as --flag=VALUE.
void add_axis_flag(CLI::App& app, const schema::Axis& a, std::string& text) {
  const std::string flag = schema::flag_of(a.key);
  if (a.bare) {
    app.add_flag(flag + "{" + a.bare + "}", text,
                 std::string(a.help) + " (alone: " + a.bare + "; another value: " + flag + "=VALUE)");
  } else {
    app.add_option(flag, text, a.help);
  }
}
}  // namespace

void AxisFlags::add_to(CLI::App& app, std::initializer_list<schema::AxisKind> kinds) {
  for (const schema::Axis& a : schema::axes()) {
    if (std::find(kinds.begin(), kinds.end(), a.kind) != kinds.end()) add_axis_flag(app, a, text_[a.key]);
  }
}

void AxisFlags::add_to(CLI::App& app, bool (*pick)(const schema::Axis&)) {
  for (const schema::Axis& a : schema::axes()) {
    if (pick(a)) add_axis_flag(app, a, text_[a.key]);
  }
}

CLI::Option* AxisFlags::alias(CLI::App& app, const std::string& key, const std::string& name, const char* value,
                              const std::string& help) {
  std::string& text = text_[key];
  return value ? app.add_flag(name + "{" + value + "}", text, help) : app.add_option(name, text, help);
}

AxisFlags& AxisFlags::operator=(const AxisFlags& o) {
  for (auto& [key, text] : text_) {
    const auto it = o.text_.find(key);
    text = it == o.text_.end() ? std::string() : it->second;
  }
  return *this;
}

bool AxisFlags::given(const std::string& key) const {
  const auto it = text_.find(key);
  return it != text_.end() && !it->second.empty();
}

bool AxisFlags::any_given() const {
  for (const auto& [key, text] : text_) {
    if (!text.empty()) return true;
  }
  return false;
}

std::string AxisFlags::text(const std::string& key) const { return given(key) ? text_.at(key) : std::string(); }

void AxisFlags::apply(Problem& p) const {
  const schema::Where w{"", "command line", true};
  int threads = 0;
  for (const schema::Axis& a : schema::axes()) {
    if (given(a.key)) schema::set_axis(a, w, schema::json_of_flag_text(text(a.key)), p, threads);
  }
}

nlohmann::json AxisFlags::as_experiment_keys() const {
  const schema::Where w{"", "command line", true};
  nlohmann::json keys = nlohmann::json::object();
  for (const auto& [key, text] : text_) {
    if (text.empty()) continue;
    keys[key] = schema::json_of_flag_text(text);
    schema::find_axis(key)->parse(w, key, keys[key]);  // a bad value is the flag's error, not the grid's
  }
  return keys;
}

void ShapeFlags::add_to(CLI::App& app) {
  sizes.add_to(app, {schema::AxisKind::Size});
  app.add_option("--seed", seed, "seed of the random inputs");
}

void ShapeFlags::apply(Problem& p) const {
  p.batch = 1, p.q_heads = 8, p.kv_heads = 2, p.q_len = 65, p.kv_len = 127, p.head_dim = 64;
  sizes.apply(p);
}

}  // namespace attnlab::cli
