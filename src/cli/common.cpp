#include "common.hpp"

#include <algorithm>
#include <sstream>

#include "attnlab/isa.hpp"
#include "attnlab/limits.hpp"
#include "attnlab/npy.hpp"

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
  app.add_flag("--causal", causal, "causal mask, bottom-right aligned (query i sees keys j <= i + kv_len - q_len)");
  app.add_flag("--causal-top-left", causal_top_left, "causal mask aligned top-left (PyTorch is_causal: j <= i)");
  app.add_option("--window", window, "sliding window L,R (inclusive bounds, -1 = unbounded)");
  app.add_option("--kv-lens", kv_lens, "per-batch kv lengths a,b,... (each in [0, kv_len])");
  app.add_option("--sinks", sinks, "sparse: keys j < N are seen by every row (with --window: StreamingLLM)");
  app.add_option("--global", globals,
                 "sparse: global positions i,j,... (their keys seen by every row, their rows see "
                 "every key; with --window: Longformer)");
  app.add_option("--doc-lens", doc_lens,
                 "sparse: packed documents a,b,... (sum = q_len = kv_len); a token sees only "
                 "its own document's keys");
  app.add_option("--dilation", dilation,
                 "sparse: window keys only at distances from the diagonal that are multiples of D");
  app.add_option("--bigbird", bigbird,
                 "sparse: BLOCK,RANDOM,SEED: RANDOM random key blocks per query block (with --window)");
  app.add_option("--mask", mask_file,
                 "sparse: boolean mask .npy (bool or uint8, nonzero = attend) of shape (q_len, "
                 "kv_len), (batch|1, 1, q_len, kv_len) or (batch|1, q_heads, q_len, kv_len)");
  app.add_option("--scale", scale, "softmax scale (default 1/sqrt(head_dim))");
  settings.add_to(app, {bench::AxisKind::Setting});
  app.add_option("--threads", threads, "threads (default: all cores)");
}

BoolMask read_mask(const std::string& path) {
  NpyArray a = read_npy_mask(path);
  BoolMask m;
  m.source = path;
  if (a.shape.size() == 2) {
    m.q_len = a.shape[0], m.kv_len = a.shape[1];
  } else if (a.shape.size() == 4) {
    m.batch = a.shape[0], m.heads = a.shape[1], m.q_len = a.shape[2], m.kv_len = a.shape[3];
  } else {
    throw InvalidInput("mask: " + path + " has " + std::to_string(a.shape.size()) +
                       " dimensions; allowed: 2 (q_len, kv_len) or 4 (batch|1, 1|q_heads, q_len, kv_len)");
  }
  m.data = std::move(a.bytes8);
  for (uint8_t& x : m.data) x = x != 0;
  return m;
}

void MaskFlags::apply(Problem& p) const {
  if (causal && causal_top_left) {
    throw InvalidInput("causal: --causal and --causal-top-left exclude each other; allowed: one of them");
  }
  p.causal = causal ? CausalAlign::BottomRight : (causal_top_left ? CausalAlign::TopLeft : CausalAlign::None);
  if (!window.empty()) {
    const auto w = parse_int_list("window", window);
    if (w.size() != 2) throw InvalidInput("window: '" + window + "' must be two integers L,R (-1 = unbounded)");
    p.window_left = w[0];
    p.window_right = w[1];
  }
  if (!kv_lens.empty()) p.kv_lens = parse_int_list("kv-lens", kv_lens);
  p.sinks = sinks;
  p.dilation = dilation;
  if (!globals.empty()) p.globals = parse_int_list("global", globals);
  if (!doc_lens.empty()) p.doc_lens = parse_int_list("doc-lens", doc_lens);
  if (!bigbird.empty()) {
    const auto v = parse_int_list("bigbird", bigbird);
    if (v.size() != 3) throw InvalidInput("bigbird: '" + bigbird + "' must be three integers BLOCK,RANDOM,SEED");
    p.bigbird = BigBird{v[0], v[1], v[2]};
  }
  if (!mask_file.empty()) {
    if (!mask_) mask_ = std::make_shared<const BoolMask>(read_mask(mask_file));
    p.mask = mask_;
  }
  p.scale = scale;
  settings.apply(p);
}

int MaskFlags::thread_count() const { return attnlab::thread_count(threads); }

void AxisFlags::add_to(CLI::App& app, std::initializer_list<bench::AxisKind> kinds) {
  for (const bench::Axis& a : bench::axes()) {
    if (std::find(kinds.begin(), kinds.end(), a.kind) != kinds.end())
      app.add_option(bench::flag_of(a.key), text_[a.key], a.help);
  }
}

void AxisFlags::add_to(CLI::App& app, bool (*pick)(const bench::Axis&)) {
  for (const bench::Axis& a : bench::axes()) {
    if (pick(a)) app.add_option(bench::flag_of(a.key), text_[a.key], a.help);
  }
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
  const bench::Where w{"", "command line", true};
  int threads = 0;
  for (const bench::Axis& a : bench::axes()) {
    if (given(a.key)) bench::set_axis(a, w, bench::json_of_flag_text(text(a.key)), p, threads);
  }
}

nlohmann::json AxisFlags::as_experiment_keys() const {
  nlohmann::json keys = nlohmann::json::object();
  for (const auto& [key, text] : text_) {
    if (!text.empty()) keys[key] = bench::json_of_flag_text(text);
  }
  return keys;
}

void ShapeFlags::add_to(CLI::App& app) {
  sizes.add_to(app, {bench::AxisKind::Size});
  app.add_option("--seed", seed, "seed of the random inputs");
}

void ShapeFlags::apply(Problem& p) const {
  p.batch = 1, p.q_heads = 8, p.kv_heads = 2, p.q_len = 65, p.kv_len = 127, p.head_dim = 64;
  sizes.apply(p);
}

}  // namespace attnlab::cli
