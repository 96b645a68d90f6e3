#include "schema/point_schema.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>

#include "attnlab/limits.hpp"
#include "attnlab/npy.hpp"
#include "attnlab/pattern.hpp"

namespace attnlab::schema {

namespace {

std::string bound(int64_t v) { return v < 0 ? "inf" : std::to_string(v); }

bool never(const PointView&) { return false; }

// "1024.4096.65536": safe in ids and file names.
std::string kv_lens_text(const Problem& p) {
  std::string s;
  for (int64_t len : p.kv_lens) {
    if (!s.empty()) s += '.';
    s += std::to_string(len);
  }
  return s;
}

// One row per field. Lambdas without captures convert to the table's function pointers.
#define ATTN_INT(expr) [](const PointView& v) { return std::to_string(expr); }
#define ATTN_NUM(expr) [](const PointView& v) { return static_cast<double>(expr); }

std::vector<PointField> make_fields() {
  using V = const PointView&;
  return {
      {"batch", "int", "batch entries", true, 1, "-b", "/b:", never, ATTN_INT(v.problem.batch), "batch",
       ATTN_NUM(v.problem.batch)},
      {"q_heads", "int", "query heads", true, 2, "-hq", "/hq:", never, ATTN_INT(v.problem.q_heads), "q_heads",
       ATTN_NUM(v.problem.q_heads)},
      {"kv_heads", "int", "key/value heads (GQA: q_heads / kv_heads query heads share one)", true, 3, "-hkv",
       "/hkv:", never, ATTN_INT(v.problem.kv_heads), "kv_heads", ATTN_NUM(v.problem.kv_heads)},
      {"gqa_group", "int", "q_heads / kv_heads (derived)", false, 0, "", "", never, ATTN_INT(v.problem.group()),
       nullptr, nullptr},
      {"q_len", "int", "query rows per head", true, 4, "-sq", "/sq:", never, ATTN_INT(v.problem.q_len), "q_len",
       ATTN_NUM(v.problem.q_len)},
      {"kv_len", "int", "keys per head (the cache length for decode)", true, 5, "-sk", "/sk:", never,
       ATTN_INT(v.problem.kv_len), "kv_len", ATTN_NUM(v.problem.kv_len)},
      {"head_dim", "int", "d of Q and K", true, 6, "-d", "/d:", never, ATTN_INT(v.problem.head_dim), "head_dim",
       ATTN_NUM(v.problem.head_dim)},
      // In ids and names only when it differs from head_dim (then "...-d192v128-...").
      {"head_dim_v", "int", "d of V and O (MLA's d_v != d_qk)", true, 7, "v",
       "/dv:", [](V v) { return v.problem.dim_v() == v.problem.head_dim; }, ATTN_INT(v.problem.dim_v()), "head_dim_v",
       ATTN_NUM(v.problem.dim_v())},
      {"mask", "text", "causal alignment, window and sparse pattern, as one name", true, 8, "-", "/mask:", never,
       [](V v) { return mask_name(v.problem); }, nullptr, nullptr},
      {"causal", "int", "0 none, 1 bottom-right, 2 top-left", false, 0, "", "", never,
       ATTN_INT(static_cast<int>(v.problem.causal)), "causal", ATTN_NUM(static_cast<int>(v.problem.causal))},
      {"window_left", "int", "keys before the diagonal a row sees (-1: unbounded)", false, 0, "", "", never,
       ATTN_INT(v.problem.window_left), "window_left", ATTN_NUM(v.problem.window_left)},
      {"window_right", "int", "keys after the diagonal a row sees (-1: unbounded)", false, 0, "", "", never,
       ATTN_INT(v.problem.window_right), "window_right", ATTN_NUM(v.problem.window_right)},
      {"pattern", "text", "the sparse pattern's name (\"\" dense)", false, 0, "", "", never,
       [](V v) { return v.problem.pattern_name(); }, nullptr, nullptr},
      {"density", "real", "visible pairs / all pairs", false, 0, "", "", never,
       [](V v) { return csv_number(density(v.problem)); }, nullptr, nullptr},
      {"layout", "text", "bhsd or bshd", true, 9, "-", "/layout:", [](V v) { return v.problem.layout == Layout::BHSD; },
       [](V v) { return std::string(to_string(v.problem.layout)); }, "bshd",
       ATTN_NUM(v.problem.layout == Layout::BSHD ? 1 : 0)},
      {"dtype", "text", "storage of Q, K, V: f32, bf16, f16", true, 10, "-", "/dtype:",
       [](V v) { return v.problem.dtype == DType::F32; }, [](V v) { return std::string(to_string(v.problem.dtype)); },
       "dtype_bytes", ATTN_NUM(dtype_bytes(v.problem.dtype))},
      {"kv_dtype", "text", "K/V storage when it is not Q's dtype: a quantized cache (q8_0, q4_0, u8, u4, fp8_*)", true,
       11, "-kv", "/kv:", [](V v) { return !v.problem.kv_quantized(); },
       [](V v) { return std::string(to_string(v.problem.kv_dtype)); }, nullptr, nullptr},
      {"kv_block", "int", "tokens per block of a paged cache (0: contiguous)", true, 12, "-kb",
       "/kvb:", [](V v) { return !v.problem.kv_paged(); }, ATTN_INT(v.problem.kv_block), "kv_block",
       ATTN_NUM(v.problem.kv_block)},
      {"kv_shared", "int", "1: V is the first head_dim_v columns of K's rows (one cache tensor, MLA's latent cache)",
       true, 13, "-kvshared", "/kvshared:", [](V v) { return !v.problem.kv_shared; },
       ATTN_INT(v.problem.kv_shared ? 1 : 0), "kv_shared", ATTN_NUM(v.problem.kv_shared ? 1 : 0)},
      {"kv_lens", "text", "per batch entry its cache length (a mixed-length batch; \"\" all kv_len)", true, 14, "-lens",
       "/lens:", [](V v) { return v.problem.kv_lens.empty(); }, [](V v) { return kv_lens_text(v.problem); }, nullptr,
       nullptr},
      {"pass", "text", "forward (O, LSE), backward (dQ, dK, dV) or forward_backward", true, 16, "-",
       "/pass:", [](V v) { return v.problem.pass == Pass::Forward; },
       [](V v) { return std::string(to_string(v.problem.pass)); }, nullptr, nullptr},
      {"score_mod", "text", "score modifications: softcap C, alibi (slopes), sink logits (\"\" none)", true, 17, "-",
       "/score:", [](V v) { return !v.problem.score_mods(); }, [](V v) { return v.problem.score_mod_name(); }, nullptr,
       nullptr},
      {"threads", "int", "threads the kernel ran on", true, 15, "-t", "/t:", never, ATTN_INT(v.threads), "threads",
       ATTN_NUM(v.threads)},
      // Query-aware sparse decode (kv_summary.hpp): in ids only when set ("...-topk4096s64r256-...").
      {"topk_tokens", "int", "query-aware sparse decode: keys attended per sequence and kv head (0: every key)", true,
       18, "-topk", "/topk:", [](V v) { return !v.problem.topk(); }, ATTN_INT(v.problem.topk_tokens), "topk_tokens",
       ATTN_NUM(v.problem.topk_tokens)},
      {"topk_sinks", "int", "the first keys a sparse decode always attends", true, 19, "s",
       "/topks:", [](V v) { return !v.problem.topk(); }, ATTN_INT(v.problem.topk_sinks), nullptr, nullptr},
      {"topk_recent", "int", "the last keys a sparse decode always attends", true, 20, "r",
       "/topkr:", [](V v) { return !v.problem.topk(); }, ATTN_INT(v.problem.topk_recent), nullptr, nullptr},
  };
}

#undef ATTN_INT
#undef ATTN_NUM

// ---- The input side: axes ----

using W = const Where&;
using K = const std::string&;

// Parsers: a key's JSON -> its values, normalized.
template <int64_t Min>
std::vector<Json> ints(W w, K key, const Json& v) {
  std::vector<Json> out;
  for (int64_t x : parse_ints(w, key, v, Min)) out.emplace_back(x);
  return out;
}
// INTS, or the name of the field it defaults to ("q_heads" for kv_heads), alone or in a list.
template <int64_t Min>
std::vector<Json> ints_or(W w, K key, const Json& v, const char* same) {
  const auto is_same = [&](const Json& x) { return x.is_string() && x.get<std::string>() == same; };
  if (is_same(v)) return {v};
  if (!v.is_array() || std::none_of(v.begin(), v.end(), is_same)) return ints<Min>(w, key, v);
  check_list_length(w, key, v, v.size());
  std::vector<Json> out;
  for (const Json& x : v) {
    for (const Json& y : is_same(x) ? std::vector<Json>{x} : ints<Min>(w, key, x)) {
      if (std::find(out.begin(), out.end(), y) == out.end()) out.push_back(y);
    }
  }
  return out;
}
std::vector<Json> names(W w, K key, const Json& v, const std::vector<std::string>& allowed) {
  std::vector<Json> out;
  for (const std::string& x : parse_names(w, key, v, allowed)) out.emplace_back(x);
  return out;
}
std::vector<Json> causal_values(W w, K key, const Json& v) {
  const std::string allowed =
      "false, true (bottom-right aligned), \"bottom_right\", \"top_left\", 0, 1, 2 (as results.csv writes them), "
      "or a list of these";
  return parse_list(w, key, v, allowed, [&](const Json& x) -> Json {
    if (x.is_boolean()) return x;
    if (is_int(x) && x.get<int64_t>() >= 0 && x.get<int64_t>() <= 1) return x.get<int64_t>() == 1;
    if (is_int(x) && x.get<int64_t>() == 2) return "top_left";
    if (x.is_string() && x.get<std::string>() == "top_left") return x;
    if (x.is_string() && x.get<std::string>() == "bottom_right") return true;
    w.bad(key, v, allowed);
  });
}
// false/true (or 0/1, as results.csv writes them), alone or in a list; normalized to booleans.
std::vector<Json> bool_values(W w, K key, const Json& v) {
  return parse_list(w, key, v, "false, true, or a list of these", [&](const Json& x) -> Json {
    if (x.is_boolean()) return x;
    if (is_int(x) && (x.get<int64_t>() == 0 || x.get<int64_t>() == 1)) return x.get<int64_t>() == 1;
    w.bad(key, v, "false, true, or a list of these");
  });
}
std::vector<Json> window_values(W w, K key, const Json& v) {
  const std::string allowed =
      "null (no window), [L, R] with integers >= -1 (-1 = unbounded), or a list of null / [L, R]";
  const auto one = [&](const Json& x) -> Json {
    if (x.is_null() || (x.is_string() && x.get<std::string>() == "none")) return Json::array({-1, -1});
    if (!x.is_array() || x.size() != 2 || !is_int(x[0]) || !is_int(x[1]) || x[0].get<int64_t>() < -1 ||
        x[1].get<int64_t>() < -1) {
      w.bad(key, v, allowed);
    }
    return x;
  };
  // [L, R] of two integers is one window; any other list is a list of windows.
  if (v.is_array() && v.size() == 2 && is_int(v[0]) && is_int(v[1])) return {one(v)};
  return parse_list(w, key, v, allowed, one);
}
std::vector<Json> thread_values(W w, K key, const Json& v) {
  // thread_count's rule (limits.hpp); 0 stands for "all" until the sweep resolves it.
  const std::string allowed =
      "\"all\" (every core), an integer 1.." + std::to_string(kMaxThreads) + ", a list of these, or INTS";
  if (v.is_object()) {
    std::vector<Json> out;
    for (int64_t t : parse_ints(w, key, v, 1)) {
      if (t > kMaxThreads) w.bad(key, v, allowed);
      out.emplace_back(t);
    }
    return out;
  }
  return parse_list(w, key, v, allowed, [&](const Json& x) -> Json {
    if (x.is_string() && x.get<std::string>() == "all") return 0;
    if (is_int(x) && x.get<int64_t>() >= 1 && x.get<int64_t>() <= kMaxThreads) return x;
    w.bad(key, v, allowed);
  });
}
template <class E, size_t N>
std::vector<std::string> enum_names(const E (&all)[N]) {
  std::vector<std::string> out;
  for (E e : all) out.emplace_back(to_string(e));
  return out;
}
constexpr Layout kLayouts[] = {Layout::BHSD, Layout::BSHD};
std::vector<std::string> kv_dtype_names() {
  std::vector<std::string> out = {to_string(KvDType::Same)};
  for (KvDType t : quantized_kv_dtypes()) out.emplace_back(to_string(t));
  return out;
}
std::vector<std::string> pass_names() {
  std::vector<std::string> out;
  for (Pass x : {Pass::Forward, Pass::Backward, Pass::ForwardBackward}) out.emplace_back(to_string(x));
  return out;
}
constexpr DType kDTypes[] = {DType::F32, DType::BF16, DType::F16};

// A value that is itself a list (positions, lengths, [B, R, S]) or an object ({"spread": N}):
// `one` reads one such value (null: off); a list of values that are lists, objects or null is
// an axis of several.
template <class One>
std::vector<Json> list_values(W w, K key, const Json& v, const std::string& allowed, One one) {
  const auto composite = [](const Json& x) { return x.is_array() || x.is_object() || x.is_null(); };
  if (v.is_array() && !v.empty() && std::all_of(v.begin(), v.end(), composite))
    return parse_list(w, key, v, allowed, one);
  return {one(v)};
}
// null, [] (off), an integer (a list of one) or a list of integers >= min_value; or the
// object {form: N} with N >= 1 when `form` is given. Normalized: null, a list, or the object.
std::vector<Json> int_list_values(W w, K key, const Json& v, int64_t min_value, const char* form,
                                  const std::string& allowed) {
  return list_values(w, key, v, allowed, [&](const Json& x) -> Json {
    if (x.is_null() || (x.is_array() && x.empty())) return nullptr;
    if (form && x.is_object() && x.size() == 1 && x.contains(form)) {
      return Json{{form, parse_one_int(w, key, x[form], 1, allowed)}};
    }
    if (is_int(x)) return Json::array({parse_one_int(w, key, x, min_value, allowed)});
    if (!x.is_array()) w.bad(key, v, allowed);
    check_list_length(w, key, x, x.size());
    Json out = Json::array();
    for (const Json& y : x) out.push_back(parse_one_int(w, key, y, min_value, allowed));
    return out;
  });
}
std::vector<int64_t> int_list(const Json& v) {
  return v.is_null() ? std::vector<int64_t>{} : v.get<std::vector<int64_t>>();
}
Json list_or_null(const std::vector<int64_t>& v) { return v.empty() ? Json() : Json(v); }

std::vector<Json> bigbird_values(W w, K key, const Json& v) {
  const std::string allowed = "[BLOCK, RANDOM, SEED]: integers, BLOCK >= 1, RANDOM >= 0, SEED >= 0; or null (off)";
  return list_values(w, key, v, allowed, [&](const Json& x) -> Json {
    if (x.is_null()) return nullptr;
    if (!x.is_array() || x.size() != 3) w.bad(key, v, allowed);
    return Json::array({parse_one_int(w, key, x[0], 1, allowed), parse_one_int(w, key, x[1], 0, allowed),
                        parse_one_int(w, key, x[2], 0, allowed)});
  });
}

// A number, or a list of values that are lists, null or booleans (an axis of several): the score
// terms' values, one value each checked by `one`.
template <class One>
std::vector<Json> score_values(W w, K key, const Json& v, const std::string& allowed, One one) {
  const auto composite = [](const Json& x) { return x.is_array() || x.is_null() || x.is_boolean(); };
  if (v.is_array() && !v.empty() && std::all_of(v.begin(), v.end(), composite))
    return parse_list(w, key, v, allowed, one);
  return {one(v)};
}
// A list of finite numbers (one per query head), checked for length when applied.
Json real_list(W w, K key, const Json& v, const Json& x, const std::string& allowed) {
  if (!x.is_array() || x.empty()) w.bad(key, v, allowed);
  check_list_length(w, key, x, x.size());
  for (const Json& y : x) {
    if (!y.is_number() || !std::isfinite(y.get<double>())) w.bad(key, v, allowed);
  }
  return x;
}
std::vector<Json> softcap_values(W w, K key, const Json& v) {
  const std::string allowed = "a number > 0 (c in c tanh(s / c)), 0 or null (none), or a list of these";
  return parse_list(w, key, v, allowed, [&](const Json& x) -> Json {
    if (x.is_null()) return 0.0;
    if (!x.is_number() || !(x.get<double>() >= 0) || x.get<double>() > 1e30) w.bad(key, v, allowed);
    return x.get<double>();
  });
}
std::vector<Json> alibi_values(W w, K key, const Json& v) {
  const std::string allowed =
      "false (none), true (the standard slopes for q_heads), a list of one slope per query head, or a list of "
      "these";
  return score_values(w, key, v, allowed, [&](const Json& x) -> Json {
    if (x.is_boolean()) return x;
    if (x.is_null()) return false;
    return real_list(w, key, v, x, allowed);
  });
}
std::vector<Json> sink_logit_values(W w, K key, const Json& v) {
  const std::string allowed =
      "null (none), a number (every query head's sink logit), a list of one per query head, or a list of these";
  return score_values(w, key, v, allowed, [&](const Json& x) -> Json {
    if (x.is_null()) return x;
    if (x.is_number()) {
      if (!std::isfinite(x.get<double>())) w.bad(key, v, allowed);
      return x;
    }
    return real_list(w, key, v, x, allowed);
  });
}
std::vector<float> floats(const Json& v) {
  std::vector<float> out;
  for (const Json& x : v) out.push_back(static_cast<float>(x.get<double>()));
  return out;
}

// A mask file: a boolean .npy (bool or uint8, nonzero = attend) of shape (q_len, kv_len),
// (batch|1, 1, q_len, kv_len) or (batch|1, q_heads, q_len, kv_len). Read once per path while
// any problem holds it (a sweep's points share it).
std::shared_ptr<const BoolMask> mask_of_file(const std::string& path) {
  static std::mutex lock;
  static std::map<std::string, std::weak_ptr<const BoolMask>> read;
  const std::lock_guard<std::mutex> hold(lock);
  if (auto m = read[path].lock()) return m;
  NpyArray a = read_npy_mask(path);
  BoolMask m = bool_mask(a.shape, std::move(a.bytes8), path, "mask_file");
  auto shared = std::make_shared<const BoolMask>(std::move(m));
  read[path] = shared;
  return shared;
}

#define ATTN_SET(...)                                                                          \
  []([[maybe_unused]] W w, [[maybe_unused]] K key, const Json& v, [[maybe_unused]] Problem& p, \
     [[maybe_unused]] int& threads) { __VA_ARGS__; }
#define ATTN_READ(...) [](const Problem& p) -> Json { return __VA_ARGS__; }

std::vector<Axis> make_axes() {
  return {
      {"batch", AxisKind::Size, "batch size", nullptr, "1", ints<1>, ATTN_SET(p.batch = v.get<int64_t>()),
       ATTN_READ(p.batch)},
      {"q_heads", AxisKind::Size, "query heads", nullptr, "8", ints<1>, ATTN_SET(p.q_heads = v.get<int64_t>()),
       ATTN_READ(p.q_heads)},
      {"kv_heads", AxisKind::Size, "key/value heads (divides q_heads), or \"q_heads\"", "gqa_groups", "\"q_heads\"",
       [](W w, K key, const Json& v) { return ints_or<1>(w, key, v, "q_heads"); },
       ATTN_SET(p.kv_heads = v.is_string() ? p.q_heads : v.get<int64_t>()), ATTN_READ(p.kv_heads)},
      {"gqa_groups", AxisKind::Size, "query heads per key/value head (instead of kv_heads)", "kv_heads", nullptr,
       ints<1>, ATTN_SET({
         const int64_t g = v.get<int64_t>();
         if (p.q_heads % g != 0)
           w.bad(key, v, "divisors of every q_heads value (" + std::to_string(p.q_heads) + " is not divisible)");
         p.kv_heads = p.q_heads / g;
       })},
      {"q_len", AxisKind::Size, "query length", nullptr, nullptr, ints<1>, ATTN_SET(p.q_len = v.get<int64_t>()),
       ATTN_READ(p.q_len)},
      {"kv_len", AxisKind::Size, "key/value length, or \"q_len\"", nullptr, "\"q_len\"",
       [](W w, K key, const Json& v) { return ints_or<0>(w, key, v, "q_len"); },
       ATTN_SET(p.kv_len = v.is_string() ? p.q_len : v.get<int64_t>()), ATTN_READ(p.kv_len)},
      {"head_dim", AxisKind::Size, "head dimension of Q and K", "d_model", "128", ints<1>,
       ATTN_SET(p.head_dim = v.get<int64_t>()), ATTN_READ(p.head_dim)},
      {"d_model", AxisKind::Size, "model width: head_dim = d_model / q_heads (instead of head_dim)", "head_dim",
       nullptr, ints<1>, ATTN_SET({
         const int64_t dm = v.get<int64_t>();
         if (dm % p.q_heads != 0)
           w.bad(key, v, "multiples of every q_heads value (not divisible by " + std::to_string(p.q_heads) + ")");
         p.head_dim = dm / p.q_heads;
       })},
      {"head_dim_v", AxisKind::Size, "head dimension of V and O (0 = head_dim; MLA's d_v != d_qk)", nullptr, "0",
       ints<0>, ATTN_SET({
         const int64_t dv = v.get<int64_t>();
         p.head_dim_v = dv == p.head_dim ? 0 : dv;
       }),
       ATTN_READ(p.dim_v())},
      {"causal", AxisKind::Mask, "false, true (bottom-right) or \"top_left\"", nullptr, "false", causal_values,
       ATTN_SET(p.causal = v.is_string() ? CausalAlign::TopLeft
                                         : (v.get<bool>() ? CausalAlign::BottomRight : CausalAlign::None)),
       ATTN_READ(p.causal == CausalAlign::TopLeft ? Json("top_left") : Json(p.causal == CausalAlign::BottomRight)),
       "true"},
      {"window", AxisKind::Mask, "sliding window [L, R] (-1 = unbounded), or null", nullptr, "null", window_values,
       ATTN_SET({
         p.window_left = v[0].get<int64_t>();
         p.window_right = v[1].get<int64_t>();
       }),
       ATTN_READ(p.window_left < 0 && p.window_right < 0 ? Json() : Json::array({p.window_left, p.window_right}))},
      // The lengths and the pattern terms read the sizes (a spread of global positions over
      // kv_len, documents filling q_len), so they come after them.
      {"kv_lens", AxisKind::Mask,
       "per batch entry its cache length (a mixed-length batch): a list of lengths, each in [0, kv_len]; null: all "
       "kv_len",
       nullptr, "null",
       [](W w, K key, const Json& v) {
         return int_list_values(w, key, v, 0, nullptr, "null, or a list of cache lengths >= 0 (each <= kv_len)");
       },
       ATTN_SET(p.kv_lens = int_list(v)), ATTN_READ(list_or_null(p.kv_lens))},
      {"sinks", AxisKind::Mask, "sparse: keys j < N are seen by every row (with a window: StreamingLLM)", nullptr, "0",
       ints<0>, ATTN_SET(p.sinks = v.get<int64_t>()), ATTN_READ(p.sinks)},
      {"global", AxisKind::Mask,
       "sparse: global positions (their keys seen by every row, their rows see every key; with a window: "
       "Longformer), a list, or {\"spread\": N} (N positions i * kv_len / N)",
       nullptr, "null",
       [](W w, K key, const Json& v) {
         return int_list_values(w, key, v, 0, "spread",
                                "null, a list of positions >= 0, or {\"spread\": N} (N positions i * kv_len / N)");
       },
       ATTN_SET({
         if (!v.is_object()) {
           p.globals = int_list(v);
           return;
         }
         p.globals.clear();
         const int64_t n = v["spread"].get<int64_t>();
         for (int64_t g = 0; g < n; ++g) {
           const int64_t at = g * p.kv_len / n;
           if (p.globals.empty() || at > p.globals.back()) p.globals.push_back(at);
         }
       }),
       ATTN_READ(list_or_null(p.globals))},
      {"doc_lens", AxisKind::Mask,
       "sparse: packed documents, a list of lengths adding up to q_len = kv_len (a token sees only its own "
       "document's keys), or {\"mean\": M} (lengths M/2, 3M/2, M repeating, the last cut to fit)",
       nullptr, "null",
       [](W w, K key, const Json& v) {
         return int_list_values(w, key, v, 1, "mean",
                                "null, a list of lengths >= 1 adding up to q_len = kv_len, or {\"mean\": M}");
       },
       ATTN_SET({
         if (!v.is_object()) {
           p.doc_lens = int_list(v);
           return;
         }
         p.doc_lens.clear();
         const int64_t mean = v["mean"].get<int64_t>();
         const int64_t cycle[3] = {std::max<int64_t>(1, mean / 2), mean + mean / 2, mean};
         for (int64_t at = 0, n = 0; at < p.q_len; ++n) {
           const int64_t len = std::min(cycle[n % 3], p.q_len - at);
           p.doc_lens.push_back(len);
           at += len;
         }
       }),
       ATTN_READ(list_or_null(p.doc_lens))},
      {"dilation", AxisKind::Mask, "sparse: window keys only at distances from the diagonal that are multiples of D",
       nullptr, "1", ints<1>, ATTN_SET(p.dilation = v.get<int64_t>()), ATTN_READ(p.dilation)},
      {"bigbird", AxisKind::Mask,
       "sparse: [BLOCK, RANDOM, SEED]: RANDOM random key blocks per query block of BLOCK (with a window), or null",
       nullptr, "null", bigbird_values,
       ATTN_SET(p.bigbird =
                    v.is_null() ? BigBird{} : BigBird{v[0].get<int64_t>(), v[1].get<int64_t>(), v[2].get<int64_t>()}),
       ATTN_READ(p.bigbird.block > 0 ? Json::array({p.bigbird.block, p.bigbird.random, p.bigbird.seed}) : Json())},
      {"mask_file", AxisKind::Mask,
       "sparse: a boolean mask .npy (bool or uint8, nonzero = attend) of shape (q_len, kv_len), (batch|1, 1, q_len, "
       "kv_len) or (batch|1, q_heads, q_len, kv_len); null: none",
       nullptr, "null",
       [](W w, K key, const Json& v) {
         // One file per grid: a point's id names "maskfile", not which file, so the points of two
         // files would share an id (and the second would vanish as a duplicate).
         const std::string allowed = "the path of a boolean .npy file, or null, or a list of null and one path";
         int64_t files = 0;
         auto values = parse_list(w, key, v, allowed, [&](const Json& x) -> Json {
           if (!x.is_null() && (!x.is_string() || x.get<std::string>().empty())) w.bad(key, v, allowed);
           files += x.is_string();
           return x;
         });
         if (files > 1) w.bad(key, v, allowed + " (one file per grid: \"grids\" for several)");
         return values;
       },
       ATTN_SET(p.mask = v.is_null() ? nullptr : mask_of_file(v.get<std::string>())),
       ATTN_READ(p.mask ? Json(p.mask->source) : Json())},
      // The score modifications read q_heads (a slope or logit per query head).
      {"softcap", AxisKind::Score, "logit soft-capping: scores s -> c tanh(s / c) before the softmax (0: none)",
       nullptr, "0", softcap_values, ATTN_SET(p.softcap = static_cast<float>(v.get<double>())),
       ATTN_READ(static_cast<double>(p.softcap))},
      {"alibi", AxisKind::Score,
       "ALiBi: s += m_h (j - i) with the standard slopes (true) or one slope per query head (a list); false: none",
       nullptr, "false", alibi_values, ATTN_SET({
         p.alibi_standard = v.is_boolean() && v.get<bool>();
         p.alibi = v.is_boolean() ? std::vector<float>{} : floats(v);
       }),
       ATTN_READ(!p.has_alibi()     ? Json(false)
                 : p.alibi_standard ? Json(true)
                                    : Json(p.alibi)),
       "true"},
      {"sink_logits", AxisKind::Score,
       "learned sink logits: one more term e^b_h in each row's softmax denominator, no value row (a number: every "
       "head's; a list: one per query head); null: none",
       nullptr, "null", sink_logit_values, ATTN_SET({
         if (v.is_null()) {
           p.sink_logits.clear();
         } else if (v.is_number()) {  // every head's (resolved where read: Problem::sink_logit)
           p.sink_logits.assign(1, static_cast<float>(v.get<double>()));
         } else {
           p.sink_logits = floats(v);
         }
       }),
       ATTN_READ(p.sink_logits.empty()       ? Json()
                 : p.sink_logits.size() == 1 ? Json(static_cast<double>(p.sink_logits[0]))
                                             : Json(p.sink_logits))},
      {"layout", AxisKind::Setting, "memory layout: bhsd (batch, heads, seq, dim) or bshd", nullptr, "\"bhsd\"",
       [](W w, K key, const Json& v) { return names(w, key, v, enum_names(kLayouts)); },
       ATTN_SET(p.layout = parse_layout(v.get<std::string>())), ATTN_READ(to_string(p.layout))},
      {"dtype", AxisKind::Setting, "storage of Q, K, V: f32, bf16 or f16 (O and LSE stay float32)", nullptr, "\"f32\"",
       [](W w, K key, const Json& v) { return names(w, key, v, enum_names(kDTypes)); },
       ATTN_SET(p.dtype = parse_dtype(v.get<std::string>())), ATTN_READ(to_string(p.dtype))},
      {"kv_dtype", AxisKind::Setting,
       "storage of K and V: dtype (as Q), or a quantized cache: q8_0, q4_0 (ggml's "
       "blocks), u8, u4 (scale and zero point per row), fp8_e4m3, fp8_e5m2",
       nullptr, "\"dtype\"", [](W w, K key, const Json& v) { return names(w, key, v, kv_dtype_names()); },
       ATTN_SET(p.kv_dtype = parse_kv_dtype(v.get<std::string>())), ATTN_READ(to_string(p.kv_dtype))},
      {"kv_block", AxisKind::Setting,
       "a paged cache: tokens per block (a power of two 16..256; 0 = contiguous K/V), its blocks scattered "
       "over a pool through a block table (vLLM's and OpenVINO's PagedAttention)",
       nullptr, "0", ints<0>, ATTN_SET(p.kv_block = v.get<int64_t>()), ATTN_READ(p.kv_block)},
      {"kv_shared", AxisKind::Setting,
       "true: one cache tensor, V the first head_dim_v columns of K's rows (MLA's latent cache; head_dim_v <= "
       "head_dim)",
       nullptr, "false", bool_values, ATTN_SET(p.kv_shared = v.get<bool>()), ATTN_READ(p.kv_shared)},
      // Query-aware sparse decode (kv_summary.hpp; decode and decode_i8): an approximation, judged by
      // recall and O's error against dense attention beside its exactness over the pages it chose.
      {"topk_tokens", AxisKind::Setting,
       "query-aware sparse decode: attend the 64-key pages whose bound from the keys' min/max summaries is "
       "largest, within this many keys per sequence and kv head (0: every key; decode, decode_i8)",
       nullptr, "0", ints<0>, ATTN_SET(p.topk_tokens = v.get<int64_t>()), ATTN_READ(p.topk_tokens)},
      {"topk_sinks", AxisKind::Setting, "with topk_tokens: the pages of the first N keys are always attended", nullptr,
       "0", ints<0>, ATTN_SET(p.topk_sinks = v.get<int64_t>()), ATTN_READ(p.topk_sinks)},
      {"topk_recent", AxisKind::Setting, "with topk_tokens: the pages of the last N keys are always attended", nullptr,
       "0", ints<0>, ATTN_SET(p.topk_recent = v.get<int64_t>()), ATTN_READ(p.topk_recent)},
      {"pass", AxisKind::Sweep,
       "forward (O, LSE), backward (dQ, dK, dV from a random dO and the kernel's own forward's O and LSE, "
       "untimed; FLOPs 2.5x the forward's) or forward_backward (both, timed together)",
       nullptr, "\"forward\"", [](W w, K key, const Json& v) { return names(w, key, v, pass_names()); },
       ATTN_SET(p.pass = parse_pass(v.get<std::string>())), ATTN_READ(to_string(p.pass))},
      {"threads", AxisKind::Run, "threads (\"all\": every core)", nullptr, "\"all\"", thread_values,
       ATTN_SET(threads = v.get<int>())},
  };
}

#undef ATTN_READ
#undef ATTN_SET

// The grid's extras in the id and name after the table's fields; model's column is written
// with the record's labels (results_csv.cpp), so it is not in the table.
struct Extra {
  const char* id_prefix;
  const char* name_prefix;
  std::string_view PointView::*member;
};
constexpr Extra kExtras[] = {{"-", "/isa:", &PointView::isa}, {"-", "/model:", &PointView::model}};

std::vector<const PointField*> in_id_order() {
  std::vector<const PointField*> out;
  for (const PointField& f : point_fields()) {
    if (f.id_rank > 0) out.push_back(&f);
  }
  std::sort(out.begin(), out.end(), [](const PointField* a, const PointField* b) { return a->id_rank < b->id_rank; });
  return out;
}

std::string joined(const PointView& v, std::string head, bool id) {
  static const std::vector<const PointField*> order = in_id_order();
  for (const PointField* f : order) {
    if (!f->omitted(v)) (head += id ? f->id_prefix : f->name_prefix) += f->value(v);
  }
  for (const Extra& e : kExtras) {
    const std::string_view value = v.*e.member;
    if (!value.empty()) (head += id ? e.id_prefix : e.name_prefix) += value;
  }
  return head;
}

}  // namespace

std::string mask_name(const Problem& p) {
  std::string m;
  if (p.causal == CausalAlign::BottomRight) m = "causal";
  if (p.causal == CausalAlign::TopLeft) m = "causal_tl";
  if (p.window_left >= 0 || p.window_right >= 0) {
    m += (m.empty() ? "" : "_");
    m += "window_" + bound(p.window_left) + "_" + bound(p.window_right);
  }
  if (p.sparse()) {
    if (!m.empty()) m += '_';
    m += p.pattern_name();
  }
  return m.empty() ? "none" : m;
}

double density(const Problem& p) {
  return static_cast<double>(p.visible_pairs()) /
         (static_cast<double>(p.batch * p.q_heads) * static_cast<double>(p.q_len) * static_cast<double>(p.kv_len));
}

std::string csv_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

const std::vector<PointField>& point_fields() {
  static const std::vector<PointField> fields = make_fields();
  return fields;
}

const char* to_string(AxisKind kind) {
  switch (kind) {
    case AxisKind::Size: return "size";
    case AxisKind::Setting: return "setting";
    case AxisKind::Mask: return "mask";
    case AxisKind::Score: return "score";
    case AxisKind::Run: return "run";
    case AxisKind::Sweep: return "sweep";
  }
  return "?";
}

const std::vector<Axis>& axes() {
  static const std::vector<Axis> table = make_axes();
  return table;
}

const Axis* find_axis(std::string_view key) {
  for (const Axis& a : axes()) {
    if (key == a.key) return &a;
  }
  return nullptr;
}

void set_axis(const Axis& a, const Where& w, const Json& value, Problem& p, int& threads) {
  const std::vector<Json> values = a.parse(w, a.key, value);
  if (values.size() != 1) w.bad(a.key, value, std::string("one value: ") + a.help);
  a.apply(w, a.key, values[0], p, threads);
}

nlohmann::json problem_to_json(const Problem& p) {
  Json j = Json::object();
  for (const Axis& a : axes()) {
    if (!a.read) continue;
    Json v = a.read(p);
    if (!v.is_null()) j[a.key] = std::move(v);  // null is off, as the key's absence is (its fallback)
  }
  return j;
}

Problem problem_from_json(const nlohmann::json& in) {
  if (!in.is_object()) throw InvalidInput("problem: " + in.dump() + "; allowed: a JSON object of the axes' keys");
  // Files written before the pattern terms were rows of the table: the old key names.
  Json j = in;
  if (!j.contains("window") && j.contains("window_left") && j.contains("window_right"))
    j["window"] = Json::array({j["window_left"], j["window_right"]});
  if (!j.contains("global") && j.contains("globals")) j["global"] = j["globals"];
  if (j.contains("bigbird") && j["bigbird"].is_array() && !j["bigbird"].empty() && j["bigbird"][0] == 0)
    j["bigbird"] = nullptr;
  Problem p;
  const Where w{"", "point file"};
  int threads = 0;
  for (const Axis& a : axes()) {
    if (!a.read) continue;
    if (j.contains(a.key)) {
      set_axis(a, w, j.at(a.key), p, threads);
    } else if (!a.fallback) {
      w.fail(std::string("missing key '") + a.key + "'; allowed: " + a.help);
    }
  }
  return p;
}

std::string point_id(const PointView& v) { return joined(v, std::string(v.kernel), true); }

std::string point_name(const PointView& v) { return joined(v, "attn/" + std::string(v.kernel), false); }

std::string describe_point(const PointView& v, std::string_view label) {
  const Problem& p = v.problem;
  std::string s = std::string(label) + " b" + std::to_string(p.batch) + " h" + std::to_string(p.q_heads) + "/" +
                  std::to_string(p.kv_heads) + " q" + std::to_string(p.q_len) + " kv" + std::to_string(p.kv_len) +
                  " d" + std::to_string(p.head_dim);
  if (p.dim_v() != p.head_dim) (s += '/') += std::to_string(p.dim_v());
  (s += ' ') += mask_name(p);
  // Every id field after the mask but threads (layout, dtype, a new axis), as its value when
  // not at its default (a number or a list as name=value: "kv_block=64"); then the threads.
  static const std::vector<const PointField*> order = in_id_order();
  bool after_mask = false;
  for (const PointField* f : order) {
    const std::string_view name = f->name;
    if (after_mask && name != "threads" && !f->omitted(v)) {
      s += ' ';
      if (std::string_view(f->type) != "text" || name == "kv_lens") (s += name) += '=';
      s += f->value(v);
    }
    after_mask = after_mask || name == "mask";
  }
  return (s += " t") += std::to_string(v.threads);
}

nlohmann::json schema_json() {
  nlohmann::json fields = nlohmann::json::array();
  const Problem defaults;
  const PointView at_default{"", defaults, 1, "", ""};
  for (const PointField& f : point_fields()) {
    nlohmann::json field = {
        {"name", f.name}, {"type", f.type}, {"describe", f.describe}, {"shape", f.shape}, {"in_id", f.id_rank > 0}};
    // A field ids leave out at its default: that default's column text (reports name the field
    // only away from it).
    if (f.id_rank > 0 && f.omitted(at_default)) field["default"] = f.value(at_default);
    fields.push_back(field);
  }
  fields.push_back({{"name", "model"},
                    {"type", "text"},
                    {"describe", "the experiment grid's model label (\"\" none)"},
                    {"shape", true},
                    {"in_id", true}});
  // The id's and name's segments in order (after the kernel), so a reader maps a Google
  // Benchmark name to its id (scripts/compare.py): a segment absent from the name is absent
  // from the id.
  nlohmann::json id = nlohmann::json::array();
  const auto key = [](std::string_view name_prefix) {  // "/hq:" -> "hq"
    return std::string(name_prefix.substr(1, name_prefix.size() - 2));
  };
  for (const PointField* f : in_id_order()) {
    id.push_back({{"key", key(f->name_prefix)}, {"id_prefix", f->id_prefix}, {"name_prefix", f->name_prefix}});
  }
  for (const Extra& e : kExtras) {
    id.push_back({{"key", key(e.name_prefix)}, {"id_prefix", e.id_prefix}, {"name_prefix", e.name_prefix}});
  }
  return {{"schema", "attnlab-point-1"}, {"fields", fields}, {"id", id}};
}

}  // namespace attnlab::schema
