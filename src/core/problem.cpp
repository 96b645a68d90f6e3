#include "attnlab/problem.hpp"

#include "attnlab/kv_summary.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "attnlab/backward.hpp"
#include "attnlab/limits.hpp"

namespace attnlab {

const char* to_string(Layout layout) { return layout == Layout::BHSD ? "bhsd" : "bshd"; }

Layout parse_layout(const std::string& text) {
  if (text == "bhsd") return Layout::BHSD;
  if (text == "bshd") return Layout::BSHD;
  throw InvalidInput("layout: '" + text + "' is not a layout; allowed: bhsd, bshd");
}

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
  }
  return "?";
}

DType parse_dtype(const std::string& text, const char* field) {
  for (DType d : {DType::F32, DType::BF16, DType::F16}) {
    if (text == to_string(d)) return d;
  }
  throw InvalidInput(std::string(field) + ": '" + text + "' is not a dtype; allowed: f32, bf16, f16");
}

const char* to_string(Pass pass) {
  switch (pass) {
    case Pass::Forward: return "forward";
    case Pass::Backward: return "backward";
    case Pass::ForwardBackward: return "forward_backward";
  }
  return "?";
}

Pass parse_pass(const std::string& text) {
  for (Pass x : {Pass::Forward, Pass::Backward, Pass::ForwardBackward})
    if (text == to_string(x)) return x;
  throw InvalidInput("pass: '" + text + "' is not a pass; allowed: forward, backward, forward_backward");
}

const char* to_string(CausalAlign causal) {
  switch (causal) {
    case CausalAlign::None: return "none";
    case CausalAlign::BottomRight: return "bottom-right";
    case CausalAlign::TopLeft: return "top-left";
  }
  return "?";
}

namespace {
void require_positive(const char* field, int64_t value) {
  if (value < 1) {
    throw InvalidInput(std::string(field) + ": " + std::to_string(value) + " is not allowed; allowed: an integer >= 1");
  }
}
void require_window(const char* field, int64_t value) {
  if (value < -1) {
    throw InvalidInput(std::string(field) + ": " + std::to_string(value) +
                       " is not allowed; allowed: -1 (unbounded) or an integer >= 0 (a bound "
                       "past the first or last key is unbounded)");
  }
}
// The product of named sizes, at most `limit` (checked: a product that would wrap is too large).
void require_product(const std::string& what, std::initializer_list<std::pair<const char*, int64_t>> factors,
                     int64_t limit, const std::string& unit) {
  std::string names, values;
  bool ok = true;
  int64_t product = 1;
  for (const auto& [name, value] : factors) {
    names += (names.empty() ? "" : " * ") + std::string(name);
    values += (values.empty() ? "" : " * ") + std::to_string(value);
    const auto next = checked_product({product, value}, limit);
    ok = ok && next.has_value();
    if (ok) product = *next;
  }
  if (!ok) {
    throw InvalidInput(what + ": " + names + " = " + values + " is more than " + pow2_text(limit) + " " + unit +
                       "; allowed: at most " + pow2_text(limit) + " " + unit);
  }
}

// Rows [i0, i1) of m (i0 < i1), split into pieces on which lo(i) and hi(i) are both linear;
// f(i0, i1, first row, last row) for each, in order. Each endpoint is a clamp of i + const
// (steps of 0 or 1, at most two bends), so a piece whose endpoints moved by 0 or by its
// length is linear, and halving finds the bends in O(log q_len) row() calls.
template <class F>
void linear_pieces(const MaskSpec& m, int64_t i0, int64_t i1, const F& f) {
  const Interval a = m.row(i0), z = m.row(i1 - 1);
  const int64_t n = i1 - 1 - i0;
  const auto linear = [n](int64_t from, int64_t to) { return to == from || to - from == n; };
  if (n <= 1 || (linear(a.lo, z.lo) && linear(a.hi, z.hi))) {
    f(i0, i1, a, z);
    return;
  }
  const int64_t mid = i0 + (i1 - i0) / 2;
  linear_pieces(m, i0, mid, f);
  linear_pieces(m, mid, i1, f);
}

struct MaskSummary {
  int64_t pairs = 0;  // sum over rows of visible keys
  Interval keys;      // union of the rows' visible intervals (MaskSpec::rows(0, q_len))
};

// In closed form per linear piece, so a sweep can count a huge problem without looping
// over its rows. Nonempty rows are contiguous (row size is concave in i).
MaskSummary summarize(const MaskSpec& m) {
  MaskSummary s;
  if (m.q_len < 1) return s;
  int64_t first = -1, last = -1;
  linear_pieces(m, 0, m.q_len, [&](int64_t i0, int64_t i1, Interval a, Interval z) {
    s.pairs += (i1 - i0) * (a.size() + z.size()) / 2;  // arithmetic series: exact
    if (a.size() + z.size() == 0) return;
    if (first < 0) first = a.size() > 0 ? i0 : i0 + 1;  // else sizes 0, 1, 2, ...
    last = z.size() > 0 ? i1 - 1 : i1 - 2;              // else sizes ..., 2, 1, 0
  });
  if (first >= 0) s.keys = {m.row(first).lo, m.row(last).hi};
  return s;
}

// f(summary, number of batch entries it stands for): one call when every entry has kv_len.
template <class F>
void for_each_batch_mask(const Problem& p, const F& f) {
  if (p.kv_lens.empty()) {
    f(summarize(p.mask_for_batch(0)), p.batch);
    return;
  }
  for (int64_t b = 0; b < p.batch; ++b) f(summarize(p.mask_for_batch(b)), int64_t{1});
}
// The sparse terms (pattern.hpp): each field named with its allowed values.
void validate_pattern(const Problem& p) {
  const bool bounded = pattern_bounded(p);
  const auto needs_window = [&](const char* field, bool given) {
    if (given && !bounded) {
      throw InvalidInput(std::string(field) +
                         ": adds keys to a window, and without --window L,R (or --dilation) every key is "
                         "already visible; allowed: together with a window or a dilation");
    }
  };
  if (p.sinks < 0) {
    throw InvalidInput("sinks: " + std::to_string(p.sinks) + " is not allowed; allowed: an integer >= 0");
  }
  needs_window("sinks", p.sinks > 0);
  if (p.dilation < 1) {
    throw InvalidInput("dilation: " + std::to_string(p.dilation) + " is not allowed; allowed: an integer >= 1");
  }
  for (size_t g = 0; g < p.globals.size(); ++g) {
    if (p.globals[g] < 0 || p.globals[g] >= p.kv_len || (g > 0 && p.globals[g] <= p.globals[g - 1])) {
      throw InvalidInput(
          "global[" + std::to_string(g) + "]: " + std::to_string(p.globals[g]) +
          " is not allowed; allowed: distinct ascending positions in [0, kv_len = " + std::to_string(p.kv_len) + ")");
    }
  }
  needs_window("global", !p.globals.empty());
  if (!p.doc_lens.empty()) {
    int64_t sum = 0;
    for (size_t d = 0; d < p.doc_lens.size(); ++d) {
      if (p.doc_lens[d] < 1 || p.doc_lens[d] > p.kv_len) {
        throw InvalidInput("doc_lens[" + std::to_string(d) + "]: " + std::to_string(p.doc_lens[d]) +
                           " is not allowed; allowed: a length >= 1");
      }
      sum += p.doc_lens[d];
    }
    if (sum != p.q_len || sum != p.kv_len) {
      throw InvalidInput("doc_lens: the lengths add up to " + std::to_string(sum) + " with q_len " +
                         std::to_string(p.q_len) + " and kv_len " + std::to_string(p.kv_len) +
                         "; allowed: lengths adding up to q_len = kv_len (packed documents)");
    }
  }
  const BigBird& bb = p.bigbird;
  if (bb.block != 0 || bb.random != 0) {
    if (bb.block < 1 || bb.block > p.kv_len || bb.random < 0 || bb.random > 64 || bb.seed < 0) {
      throw InvalidInput("bigbird: " + std::to_string(bb.block) + "," + std::to_string(bb.random) + "," +
                         std::to_string(bb.seed) +
                         " is not allowed; allowed: BLOCK,RANDOM,SEED with BLOCK 1 to "
                         "kv_len, RANDOM 0 to 64 key blocks per query block, SEED >= 0");
    }
    needs_window("bigbird", bb.on());
  }
  if (p.mask) {
    const BoolMask& m = *p.mask;
    if (m.q_len != p.q_len || m.kv_len != p.kv_len || (m.batch != 1 && m.batch != p.batch) ||
        (m.heads != 1 && m.heads != p.q_heads)) {
      throw InvalidInput("mask: shape (" + std::to_string(m.batch) + ", " + std::to_string(m.heads) + ", " +
                         std::to_string(m.q_len) + ", " + std::to_string(m.kv_len) + ") of " + m.source +
                         " does not fit the problem; allowed: (q_len, kv_len) = (" + std::to_string(p.q_len) + ", " +
                         std::to_string(p.kv_len) +
                         "), (batch or 1, 1, q_len, kv_len) or (batch or 1, "
                         "q_heads = " +
                         std::to_string(p.q_heads) + ", q_len, kv_len)");
    }
  }
}
// The score modifications (score_mod.hpp): each field named with its allowed values.
void validate_score_mods(const Problem& p) {
  if (!(p.softcap >= 0.f) || !std::isfinite(p.softcap)) {
    throw InvalidInput("softcap: " + std::to_string(p.softcap) +
                       " is not allowed; allowed: a finite number > 0 (c in c tanh(s / c)), or 0 for none");
  }
  const auto per_head = [&](const char* field, const std::vector<float>& v, const char* what, bool one) {
    if (v.empty()) return;
    if (static_cast<int64_t>(v.size()) != p.q_heads && !(one && v.size() == 1)) {
      throw InvalidInput(std::string(field) + ": " + std::to_string(v.size()) +
                         " values given; allowed: one per query head (q_heads = " + std::to_string(p.q_heads) + ")" +
                         (one ? ", one for every head," : "") + " or none");
    }
    for (size_t h = 0; h < v.size(); ++h) {
      if (!std::isfinite(v[h])) {
        throw InvalidInput(std::string(field) + "[" + std::to_string(h) + "]: " + std::to_string(v[h]) +
                           " is not allowed; allowed: " + what);
      }
    }
  };
  if (p.alibi_standard && !p.alibi.empty()) {
    throw InvalidInput("alibi: the standard slopes and a list of " + std::to_string(p.alibi.size()) +
                       " slopes; allowed: one of them");
  }
  per_head("alibi", p.alibi, "a finite slope", false);
  per_head("sink_logits", p.sink_logits, "a finite logit", true);
}
// Query-aware sparse decode's budget (kv_summary.hpp): its fields, and what it does not combine with.
void validate_topk(const Problem& p) {
  for (const auto& [field, v] : {std::pair{"topk_tokens", p.topk_tokens}, std::pair{"topk_sinks", p.topk_sinks},
                                 std::pair{"topk_recent", p.topk_recent}}) {
    if (v < 0) throw InvalidInput(std::string(field) + ": " + std::to_string(v) + " is not allowed; allowed: >= 0");
  }
  if (!p.topk() && (p.topk_sinks > 0 || p.topk_recent > 0)) {
    throw InvalidInput("topk_sinks, topk_recent: set without topk_tokens; allowed: with topk_tokens > 0 (a budget)");
  }
  if (!p.topk()) return;
  if (p.sparse()) {
    throw InvalidInput("topk_tokens: with the sparse pattern " + p.pattern_name() +
                       "; allowed: interval masks only (the pages are the pattern)");
  }
  if (p.score_mods()) {
    throw InvalidInput("topk_tokens: with score modifications " + p.score_mod_name() +
                       "; allowed: none (the page bound is on the scaled dot product)");
  }
  if (p.pass != Pass::Forward) {
    throw InvalidInput(std::string("topk_tokens: with pass ") + to_string(p.pass) + "; allowed: forward");
  }
}
}  // namespace

float standard_alibi_slope(int64_t h, int64_t heads) {
  int64_t pow2 = 1;
  while (pow2 * 2 <= heads) pow2 *= 2;
  // 2^(-8k/p) for the first p heads, then the odd powers of 2p's base: every other slope of 2p heads.
  const double k = h < pow2 ? static_cast<double>(h + 1) : static_cast<double>(2 * (h - pow2) + 1) / 2.0;
  return static_cast<float>(std::exp2(-8.0 * k / static_cast<double>(pow2)));
}

std::vector<float> alibi_slopes(int64_t heads) {
  std::vector<float> out;
  for (int64_t h = 0; h < heads; ++h) out.push_back(standard_alibi_slope(h, heads));
  return out;
}

float Problem::alibi_slope(int64_t h) const {
  if (alibi_standard) return standard_alibi_slope(h, q_heads);
  return alibi.empty() ? 0.f : alibi[h];
}

void Problem::validate() const {
  require_positive("batch", batch);
  require_positive("q_heads", q_heads);
  require_positive("kv_heads", kv_heads);
  require_positive("q_len", q_len);
  require_positive("kv_len", kv_len);
  if (q_heads % kv_heads != 0) {
    throw InvalidInput("kv_heads: " + std::to_string(kv_heads) + " does not divide q_heads (" +
                       std::to_string(q_heads) +
                       "); allowed: a divisor of q_heads (kv_heads == q_heads is MHA, 1 is MQA)");
  }
  if (head_dim < kMinHeadDim || head_dim > kMaxHeadDim) {
    throw InvalidInput("head_dim: " + std::to_string(head_dim) + " is not supported; allowed: " +
                       std::to_string(kMinHeadDim) + " to " + std::to_string(kMaxHeadDim));
  }
  if (head_dim_v != 0 && (head_dim_v < kMinHeadDim || head_dim_v > kMaxHeadDim)) {
    throw InvalidInput("head_dim_v: " + std::to_string(head_dim_v) + " is not supported; allowed: " +
                       std::to_string(kMinHeadDim) + " to " + std::to_string(kMaxHeadDim) + ", or 0 (= head_dim)");
  }
  if (kv_quantized()) {
    if (dtype != DType::F32) {
      throw InvalidInput(std::string("kv_dtype: ") + to_string(kv_dtype) + " with dtype " + to_string(dtype) +
                         "; allowed: dtype f32 (a quantized cache is read beside a float32 Q)");
    }
    const int64_t block = kv_block_values(kv_dtype);
    for (const auto& [name, d] : {std::pair{"head_dim", head_dim}, std::pair{"head_dim_v", dim_v()}}) {
      if (d % block != 0) {
        throw InvalidInput(std::string(name) + ": " + std::to_string(d) + " is not a multiple of " +
                           std::to_string(block) + ", the block of kv_dtype " + to_string(kv_dtype) +
                           "; allowed: a multiple of " + std::to_string(block) + ", or another kv_dtype");
      }
    }
  }
  if (kv_block != 0 && (kv_block < kMinKvBlock || kv_block > kMaxKvBlock || (kv_block & (kv_block - 1)) != 0)) {
    throw InvalidInput("kv_block: " + std::to_string(kv_block) + " is not allowed; allowed: 0 (a contiguous cache) " +
                       "or a power of two " + std::to_string(kMinKvBlock) + ".." + std::to_string(kMaxKvBlock) +
                       " (tokens per block of a paged cache)");
  }
  if (kv_shared && dim_v() > head_dim) {
    throw InvalidInput("kv_shared: head_dim_v " + std::to_string(dim_v()) + " > head_dim " + std::to_string(head_dim) +
                       "; allowed: V as the first head_dim_v <= head_dim columns of K's rows");
  }
  require_window("window_left", window_left);
  require_window("window_right", window_right);
  if (!kv_lens.empty()) {
    if (static_cast<int64_t>(kv_lens.size()) != batch) {
      throw InvalidInput("kv_lens: " + std::to_string(kv_lens.size()) + " entries given; allowed: exactly batch (" +
                         std::to_string(batch) + ") entries, or none");
    }
    for (size_t b = 0; b < kv_lens.size(); ++b) {
      if (kv_lens[b] < 0 || kv_lens[b] > kv_len) {
        throw InvalidInput("kv_lens[" + std::to_string(b) + "]: " + std::to_string(kv_lens[b]) +
                           " is out of range; allowed: 0 to kv_len (" + std::to_string(kv_len) + ")");
      }
    }
  }
  validate_pattern(*this);
  validate_score_mods(*this);
  validate_topk(*this);
  if (pass != Pass::Forward) check_backward_problem(*this);
  if (scale && !std::isfinite(*scale)) {
    throw InvalidInput("scale: " + std::to_string(*scale) + " is not allowed; allowed: a finite number");
  }
  // Every size below is checked once here; element, pair and byte counts of a valid
  // problem then fit int64 with room (limits.hpp).
  require_product("Q", {{"batch", batch}, {"q_heads", q_heads}, {"q_len", q_len}, {"head_dim", head_dim}},
                  kMaxTensorElems, "elements per tensor");
  require_product("K", {{"batch", batch}, {"kv_heads", kv_heads}, {"kv_len", kv_len}, {"head_dim", head_dim}},
                  kMaxTensorElems, "elements per tensor");
  require_product("V", {{"batch", batch}, {"kv_heads", kv_heads}, {"kv_len", kv_len}, {"head_dim_v", dim_v()}},
                  kMaxTensorElems, "elements per tensor");
  require_product("O", {{"batch", batch}, {"q_heads", q_heads}, {"q_len", q_len}, {"head_dim_v", dim_v()}},
                  kMaxTensorElems, "elements per tensor");
  require_product("attention pairs", {{"batch", batch}, {"q_heads", q_heads}, {"q_len", q_len}, {"kv_len", kv_len}},
                  kMaxPairs, "query-key pairs");
}

float Problem::effective_scale() const {
  return scale ? *scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

MaskSpec Problem::mask_for_batch(int64_t b) const {
  return MaskSpec{q_len, kv_len_of(b), causal, window_left, window_right};
}

int64_t Problem::topk_keys(int64_t b) const {
  const int64_t n = kv_len_of(b);
  if (!topk()) return n;
  // The keys of the pages always chosen (kv_summary.hpp's always_pages; an overlap counted twice, the
  // whole sequence at most).
  const AlwaysPages a = always_pages(n, {topk_tokens, topk_sinks, topk_recent});
  const int64_t recent_from = a.recent_begin * kTopkPageKeys;
  const int64_t always = std::min(n, std::min(n, a.sink_end * kTopkPageKeys) + std::max<int64_t>(0, n - recent_from));
  return std::min(n, std::max(topk_tokens, always));
}

int64_t Problem::visible_pairs() const {
  if (sparse()) return count_pattern(*this).pairs;
  if (topk()) {  // each row: its visible keys, at most the budget's
    int64_t pairs = 0;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < q_len; ++i) pairs += std::min(visible(b, i).size(), topk_keys(b));
    return pairs * q_heads;
  }
  int64_t pairs = 0;
  for_each_batch_mask(*this, [&](const MaskSummary& s, int64_t entries) { pairs += s.pairs * entries; });
  return pairs * q_heads;
}

double Problem::forward_flops() const {
  // Two GEMMs per visible (row, key) pair: q.k (2 head_dim) and p*v (2 head_dim_v).
  return 2.0 * static_cast<double>(head_dim + dim_v()) * static_cast<double>(visible_pairs());
}

double Problem::flops() const {
  const double factor = pass == Pass::Forward ? 1.0 : pass == Pass::Backward ? 2.5 : 3.5;
  return factor * forward_flops();
}

double Problem::kv_bytes() const {
  // K and V rows that any query row sees, read once per kv head (GQA's saving shows here).
  // One K and one V row (a shared V is read from K's row: its lines are K's).
  const double row = static_cast<double>(kv_row_bytes(head_dim) + (kv_shared ? 0 : kv_row_bytes(dim_v())));
  if (sparse()) return count_pattern(*this).kv_keys * row;
  if (topk()) {  // the budget's keys, and every page's summary (2 x head_dim floats)
    double bytes = 0;
    for (int64_t b = 0; b < batch; ++b) {
      const double pages = static_cast<double>((kv_len_of(b) + kTopkPageKeys - 1) / kTopkPageKeys);
      bytes += static_cast<double>(topk_keys(b)) * row + pages * 2.0 * static_cast<double>(head_dim) * sizeof(float);
    }
    return bytes * static_cast<double>(kv_heads);
  }
  double keys = 0;
  for_each_batch_mask(*this, [&](const MaskSummary& s, int64_t entries) {
    keys += static_cast<double>(s.keys.size()) * static_cast<double>(entries);
  });
  return keys * static_cast<double>(kv_heads) * row;
}

int64_t Problem::kv_pool_blocks() const {
  if (!kv_paged()) return 0;
  int64_t n = 0;
  for (int64_t b = 0; b < batch; ++b) n += (kv_len_of(b) + kv_block - 1) / kv_block;
  return n;
}

double Problem::kv_bytes_per_token() const {
  return static_cast<double>(kv_heads * (kv_row_bytes(head_dim) + (kv_shared ? 0 : kv_row_bytes(dim_v()))));
}

double Problem::bytes_moved() const {
  const auto f32 = [](int64_t elems) { return sizeof(float) * static_cast<double>(elems); };
  const double q = dtype_bytes(dtype) * static_cast<double>(q_elems());
  const double forward = q + f32(o_elems()) + kv_bytes() + f32(lse_elems());
  // The backward reads Q, K, V, O, dO and LSE and writes dQ, dK, dV.
  const double backward = forward + f32(o_elems()) + f32(q_elems() + kv_elems() + v_elems());
  return pass == Pass::Forward ? forward : pass == Pass::Backward ? backward : forward + backward;
}

std::string Problem::pattern_name() const {
  // Safe in point ids and file names: parts joined by '_', short lists by '.', a long list as
  // its length and a hash of its values.
  std::string n;
  const auto add = [&n](const std::string& part) {
    if (!n.empty()) n += '_';
    n += part;
  };
  const auto list = [](const std::vector<int64_t>& v) {
    std::string t;
    if (v.size() > 4) {
      uint64_t h = 1469598103934665603ull;  // FNV-1a
      for (int64_t x : v) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ull;
      char hex[9];
      std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(h ^ (h >> 32)));
      return std::to_string(v.size()) + "h" + hex;
    }
    for (size_t x = 0; x < v.size(); ++x) {
      if (x) t += '.';  // appended in two steps: gcc 12 warns (-Wrestrict) on "." + to_string()
      t += std::to_string(v[x]);
    }
    return t;
  };
  if (sinks > 0) add("sinks" + std::to_string(sinks));
  if (!globals.empty()) add("global" + list(globals));
  if (!doc_lens.empty()) add("docs" + list(doc_lens));
  if (dilation > 1) add("dilation" + std::to_string(dilation));
  if (bigbird.on()) {
    add("bigbird" + list({bigbird.block, bigbird.random, bigbird.seed}));
  }
  if (mask) add("maskfile");
  return n;
}

std::string Problem::score_mod_name() const {
  // Safe in point ids: the cap as written ("softcap30", "softcap2.5"); "alibi" alone is the standard
  // set, other slopes and the logits a hash of their values (two sets, two ids).
  std::string n;
  const auto add = [&n](const std::string& part) { n += (n.empty() ? "" : "_") + part; };
  const auto hash = [](const std::vector<float>& v) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the bits
    for (float x : v) {
      uint32_t bits = 0;
      std::memcpy(&bits, &x, sizeof bits);
      h = (h ^ bits) * 1099511628211ull;
    }
    char hex[9];
    std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(h ^ (h >> 32)));
    return std::string(hex);
  };
  if (softcap > 0.f) {
    char text[32];
    std::snprintf(text, sizeof text, "softcap%g", static_cast<double>(softcap));
    add(text);
  }
  if (has_alibi()) add(alibi_standard || alibi == alibi_slopes(q_heads) ? "alibi" : "alibi" + hash(alibi));
  if (!sink_logits.empty()) add("sink" + hash(sink_logits));
  return n;
}

std::string Problem::describe() const {
  std::ostringstream s;
  s << "batch=" << batch << " q_heads=" << q_heads << " kv_heads=" << kv_heads << " q_len=" << q_len
    << " kv_len=" << kv_len << " head_dim=" << head_dim;
  if (dim_v() != head_dim) s << " head_dim_v=" << dim_v();
  if (kv_quantized()) s << " kv_dtype=" << to_string(kv_dtype);
  if (kv_paged()) s << " kv_block=" << kv_block;
  if (kv_shared) s << " kv_shared";
  if (causal != CausalAlign::None) s << " causal=" << to_string(causal);
  if (window_left >= 0 || window_right >= 0) s << " window=" << window_left << "," << window_right;
  if (!kv_lens.empty()) {
    s << " kv_lens=";
    for (size_t b = 0; b < kv_lens.size(); ++b) s << (b ? "," : "") << kv_lens[b];
  }
  if (sparse()) s << " pattern=" << pattern_name();
  if (score_mods()) s << " score_mod=" << score_mod_name();
  if (topk()) s << " topk=" << topk_tokens << "," << topk_sinks << "," << topk_recent;
  if (scale) s << " scale=" << *scale;
  s << " layout=" << to_string(layout);
  if (dtype != DType::F32) s << " dtype=" << to_string(dtype);
  if (pass != Pass::Forward) s << " pass=" << to_string(pass);
  return s.str();
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string t = "(";
  for (size_t i = 0; i < shape.size(); ++i) t += (i ? ", " : "") + std::to_string(shape[i]);
  return t + (shape.size() == 1 ? ",)" : ")");
}

void check_array_shape(const std::string& name, const std::vector<int64_t>& shape, Layout layout) {
  if (shape.size() != 4) {
    throw InvalidInput(name + ": shape " + shape_text(shape) + " has " + std::to_string(shape.size()) +
                       " dimensions; allowed: 4, " +
                       (layout == Layout::BHSD ? "(batch, heads, seq, head_dim) for layout bhsd"
                                               : "(batch, seq, heads, head_dim) for layout bshd"));
  }
  for (int64_t s : shape) {
    if (s == 0) throw InvalidInput(name + ": shape " + shape_text(shape) + " has a zero dimension; allowed: all >= 1");
  }
}

void size_from_arrays(Problem& p, const ArrayShapes& a) {
  check_array_shape(a.q_name, a.q, p.layout);
  check_array_shape(a.k_name, a.k, p.layout);
  check_array_shape(a.v_name, a.v, p.layout);
  const auto &qs = a.q, &ks = a.k, &vs = a.v;
  if (!std::equal(ks.begin(), ks.end() - 1, vs.begin())) {
    throw InvalidInput(a.v_name + ": shape " + shape_text(vs) + " differs from K's " + shape_text(ks) +
                       "; allowed: V has K's shape but for its last dimension (head_dim_v)");
  }
  if (ks[0] != qs[0] && !a.pool) {
    throw InvalidInput(a.k_name + ": batch " + std::to_string(ks[0]) + " differs from Q's batch " +
                       std::to_string(qs[0]) +
                       "; allowed: the same batch (a paged pool's first dimension is "
                       "its blocks, with a block table)");
  }
  if (ks[3] != qs[3] && !a.raw) {
    throw InvalidInput(a.k_name + ": head_dim " + std::to_string(ks[3]) + " differs from Q's head_dim " +
                       std::to_string(qs[3]) + "; allowed: K's last dimension = Q's");
  }
  const int hi = p.layout == Layout::BHSD ? 1 : 2, si = p.layout == Layout::BHSD ? 2 : 1;
  p.batch = qs[0];
  p.q_heads = qs[hi];
  p.q_len = qs[si];
  p.head_dim = qs[3];
  p.head_dim_v = vs[3] == qs[3] ? 0 : vs[3];
  p.kv_heads = ks[hi];
  p.kv_len = ks[si];
}

}  // namespace attnlab
