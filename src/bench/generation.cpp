// The generation loop (generation.hpp).
#include "bench/generation.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

#include "attnlab/kernel.hpp"
#include "attnlab/limits.hpp"
#include "attnlab/verify.hpp"
#include "bench/bench_point.hpp"
#include "bench/files.hpp"
#include "bench/machine.hpp"
#include "bench/using.hpp"

namespace attnlab::bench {

namespace {
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The cache and the query rows in the storage dtype, as raw bytes. K and V are one row per
// (kv head, token) - contiguous: kv_heads x C rows; paged (kv_block B): a pool of ceil(C / B)
// blocks of kv_heads x B rows, handed out as tokens arrive (a block when the sequence's last one
// is full, from the pool in scattered_pool_order: never adjacent or in order), the sequence's
// block table growing with them, as a paged runtime's block manager does. kv_shared: V is the
// first head_dim_v columns of K's rows (no V rows are written).
struct Cache {
  GenerationConfig c;
  int64_t rows;          // cache capacity C
  int64_t block;         // tokens per block (paged), else C: one "block" per kv head
  int64_t blocks;        // blocks in the pool (1 when contiguous)
  int64_t q_rows;        // query rows per head held: the prefilled prompt's, or one token's
  int64_t k_row, v_row;  // bytes of a stored K / V row
  size_t k_bytes, v_bytes, q_bytes;
  std::vector<int32_t> order, table;  // the pool's blocks in hand-out order; the sequence's blocks
  std::unique_ptr<std::byte[], AlignedFree> k, v, q;
  explicit Cache(const GenerationConfig& cfg)
      : c(cfg),
        rows(cfg.cache_rows()),
        block(cfg.head.kv_paged() ? cfg.head.kv_block : rows),
        blocks((rows + block - 1) / block),
        q_rows(std::max<int64_t>(1, std::min(cfg.prompt, cfg.prefill_max_tokens))),
        k_row(c.head.kv_row_bytes(c.head.head_dim)),
        v_row(c.head.kv_row_bytes(c.head.dim_v())),
        k_bytes(static_cast<size_t>(blocks * c.head.kv_heads * block * k_row)),
        v_bytes(c.head.kv_shared ? 0 : static_cast<size_t>(blocks * c.head.kv_heads * block * v_row)),
        q_bytes(static_cast<size_t>(c.head.q_heads * q_rows * c.head.head_dim * dtype_bytes(c.head.dtype))) {
    if (c.head.kv_paged()) order = scattered_pool_order(blocks), table.reserve(static_cast<size_t>(blocks));
  }
  size_t bytes() const { return k_bytes + v_bytes + q_bytes; }
  void allocate() {
    k = alloc_bytes(k_bytes), q = alloc_bytes(q_bytes);
    if (v_bytes) v = alloc_bytes(v_bytes);
  }
  // K's or V's rows as a byte view: (blocks, kv heads, block, row bytes).
  View4<std::byte> rows_of(bool value) const {
    const int64_t rb = value ? v_row : k_row;
    std::byte* base = value && !c.head.kv_shared ? v.get() : k.get();
    return {base, blocks, c.head.kv_heads, block, rb, c.head.kv_heads * block * rb, block * rb, rb};
  }
  // The sequence's first `len` keys' blocks (kv_row's table; none when contiguous).
  KvPages pages(int64_t len) const {
    if (!c.head.kv_paged()) return {};
    return {table.data(), (len + block - 1) / block, block, blocks};
  }
  // n floats stored at `at`: converted to the storage dtype, or written into a quantized cache
  // row by its layout's rule (kv_quant.hpp), as a runtime appends a token.
  void put(std::byte* at, const float* x, int64_t n, bool kv_row) const {
    if (kv_row && c.head.kv_quantized()) return quantize_row(c.head.kv_dtype, x, n, at);
    visit_dtype(c.head.dtype, [&](auto e) {
      using E = decltype(e);
      E* dst = reinterpret_cast<E*>(at);
      for (int64_t i = 0; i < n; ++i) dst[i] = from_float<E>(x[i]);
    });
  }
  // Token j of kv head h (tokens arrive in order; a new block is taken when j starts one).
  void put_kv(int64_t h, int64_t j, const float* kx, const float* vx) {
    if (c.head.kv_paged() && j / block == static_cast<int64_t>(table.size())) table.push_back(order[table.size()]);
    const KvPages pg = pages(j + 1);
    put(kv_row(rows_of(false), pg, 0, h, j), kx, c.head.head_dim, true);
    if (!c.head.kv_shared) put(kv_row(rows_of(true), pg, 0, h, j), vx, c.head.dim_v(), true);
  }
  void put_q(int64_t h, int64_t i, int64_t q_len, const float* qx) {
    put(q.get() + (h * q_len + i) * c.head.head_dim * dtype_bytes(c.head.dtype), qx, c.head.head_dim, false);
  }
  // Q (q_len rows per head, BHSD) and the first `len` keys of the cache.
  Inputs inputs(int64_t q_len, int64_t len) const {
    // A contiguous cache's views see `len` of each head's C rows; a paged one the whole pool.
    const int64_t outer = c.head.kv_paged() ? blocks : 1, seq = c.head.kv_paged() ? block : len;
    const auto elems = [&](bool value, int64_t dim) {
      const View4<std::byte> r = rows_of(value);
      const int64_t e = dtype_bytes(c.head.dtype);
      return View4<const void>{r.data, outer, r.heads, seq, dim, r.stride_b / e, r.stride_h / e, r.stride_s / e};
    };
    const View4<const void> qv{q.get(),
                               1,
                               c.head.q_heads,
                               q_len,
                               c.head.head_dim,
                               c.head.q_heads * q_len * c.head.head_dim,
                               q_len * c.head.head_dim,
                               c.head.head_dim};
    Inputs in;
    if (!c.head.kv_quantized()) {
      in = inputs_over(c.head.dtype, qv, elems(false, c.head.head_dim), elems(true, c.head.dim_v()));
    } else {  // Q float32, K and V rows of bytes (View4::dim = a row's bytes)
      const View4<const void> none{nullptr, outer, c.head.kv_heads, seq, 1, 0, 0, 0};
      in = inputs_over(DType::F32, qv, none, none);
      const auto bytes = [&](bool value) {
        const View4<std::byte> r = rows_of(value);
        return View4<const std::byte>{r.data, outer, r.heads, seq, r.dim, r.stride_b, r.stride_h, r.stride_s};
      };
      in.kv = c.head.kv_dtype;
      in.kq = bytes(false);
      in.vq = bytes(true);
    }
    if (c.head.kv_shared) share_v_with_k(c.head, in);
    in.pages = pages(len);
    return in;
  }
};

// The kernel's output on `rows` against the float64 reference: (verdict, error, tolerance).
std::tuple<std::string, double, double> check(const Kernel& k, const Problem& p, const Inputs& in, const Outputs& out,
                                              std::vector<RowId> rows) {
  // The reference reads the cache through the same table: a block handed out twice (a later
  // token overwriting an earlier one) would agree with it, so the table itself is checked.
  if (p.kv_paged()) validate_block_table(p, in.pages);
  const Agreement a = prepare_agreement(p, in, std::move(rows));
  const Errors e = measure(a.ref, as_const(out.o), out.lse, p);
  const Tolerance t = tolerance_for(k, p, in, a);
  return {t.passes(e) ? "PASS" : "FAIL", e.o_rel, t.o_rel};
}

}  // namespace

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

double GenerationConfig::kv_bytes_per_token() const { return step_problem(1, 1).kv_bytes_per_token(); }

std::string GenerationConfig::cache_text() const {
  std::string t = to_string(head.dtype);
  if (head.kv_quantized()) t += std::string(", a ") + to_string(head.kv_dtype) + " cache";
  if (head.kv_paged()) t += ", paged in " + std::to_string(head.kv_block) + "-token blocks";
  if (head.kv_shared) t += ", V = K's first " + std::to_string(head.dim_v()) + " columns";
  return t;
}

Problem GenerationConfig::default_head() {
  Problem p;
  p.q_heads = 32, p.kv_heads = 8, p.head_dim = 128;
  return p;
}

Problem GenerationConfig::step_problem(int64_t q_len, int64_t kv_len) const {
  Problem p = head;
  p.batch = 1, p.q_len = q_len, p.kv_len = kv_len;
  p.causal = CausalAlign::BottomRight;
  return p;
}

void GenerationConfig::validate() const {
  if (!is_label(name)) throw InvalidInput("name: '" + name + "'; allowed: " + kLabelAllowed);
  if (prompt < 0) throw InvalidInput("prompt: " + std::to_string(prompt) + "; allowed: an integer >= 0");
  if (steps < 1) throw InvalidInput("steps: " + std::to_string(steps) + "; allowed: an integer >= 1");
  if (capacity != 0 && capacity < prompt + steps) {
    throw InvalidInput("capacity: " + std::to_string(capacity) + " is below prompt + steps (" +
                       std::to_string(prompt + steps) + "); allowed: 0 (= prompt + steps) or at least that");
  }
  if (threads < 1 || threads > kMaxThreads)  // a resolved count (thread_count ran when it was read)
    throw InvalidInput("threads: " + std::to_string(threads) + " is not allowed; allowed: 1 to " +
                       std::to_string(kMaxThreads));
  if (prefill_max_tokens < 0) throw InvalidInput("prefill_max_tokens: negative; allowed: an integer >= 0");
  if (verify_steps < 0) throw InvalidInput("verify_steps: negative; allowed: an integer >= 0");
  if (repetitions < 1) throw InvalidInput("repetitions: " + std::to_string(repetitions) + "; allowed: >= 1");
  if (head.layout != Layout::BHSD) {
    throw InvalidInput("layout: " + std::string(to_string(head.layout)) +
                       "; allowed: bhsd (the generation loop's cache is one (kv head, row) array per head)");
  }
  step_problem(1, cache_rows()).validate();  // heads, head dims and sizes
}

namespace {
template <class F>
double median_over(const std::vector<GenerationStep>& steps, F f) {
  std::vector<double> t;
  for (const auto& s : steps) t.push_back(f(s));
  return median(t);
}
}  // namespace

double GenerationResult::median_token_s() const {
  return median_over(steps, [](const GenerationStep& s) { return s.append_s + s.attention_s; });
}
double GenerationResult::median_attention_s() const {
  return median_over(steps, [](const GenerationStep& s) { return s.attention_s; });
}
double GenerationResult::median_repeat_s() const {
  return median_over(steps, [](const GenerationStep& s) { return s.repeat_s; });
}
double GenerationResult::median_append_s() const {
  return median_over(steps, [](const GenerationStep& s) { return s.append_s; });
}

GenerationResult run_generation(const GenerationConfig& c) {
  c.validate();
  const Kernel& kernel = kernel_or_throw(c.kernel);
  const Kernel& prefill = kernel_or_throw(c.prefill_kernel);
  GenerationResult r;
  r.config = c;
  r.kernel = kernel_label(kernel);
  r.prefill_kernel = kernel_label(prefill);
  r.measured_at = now_iso8601();
  const int64_t C = c.cache_rows();

  // The step's session, made for the whole cache: the memory budget covers it and the cache.
  const Problem full = c.step_problem(1, C);
  if (Support s = can_run(kernel, full, c.threads); !s) {
    throw InvalidInput(std::string(kernel.name()) + " cannot run " + full.describe() + ": " + s.reason);
  }
  Cache cache(c);
  if (const std::string why = over_memory_budget(static_cast<int64_t>(cache.bytes()) + tensor_bytes(full), "KV cache");
      !why.empty()) {
    throw InvalidInput("generation " + c.name + ": " + why);
  }
  cache.allocate();
  Session session(kernel, full, c.threads);

  // The values: uniform [-1, 1) (random_tensors' generator), a fresh seed per drawn row.
  uint64_t draws = 0;
  const auto draw = [&](float* x, int64_t n) { fill_uniform(x, n, c.seed * 0x9E3779B97F4A7C15ull + ++draws); };
  std::vector<float> kx(static_cast<size_t>(c.head.head_dim)), vx(static_cast<size_t>(c.head.dim_v()));
  std::vector<float> qx(static_cast<size_t>(c.head.head_dim));
  const auto draw_kv_row = [&](int64_t h, int64_t j) {
    draw(kx.data(), c.head.head_dim);
    draw(vx.data(), c.head.dim_v());
    cache.put_kv(h, j, kx.data(), vx.data());
  };

  // The prompt: its K/V rows, then (when short enough) its attention as one flash prefill.
  for (int64_t h = 0; h < c.head.kv_heads; ++h)
    for (int64_t j = 0; j < c.prompt; ++j) draw_kv_row(h, j);
  if (c.prompt == 0) {
    r.prefill_note = "no prompt";
  } else if (c.prompt > c.prefill_max_tokens) {
    r.prefill_note = "not run: a " + std::to_string(c.prompt) + "-token prompt is above prefill_max_tokens (" +
                     std::to_string(c.prefill_max_tokens) + "); the cache holds its K/V rows without it";
  } else {
    const Problem pp = c.step_problem(c.prompt, c.prompt);
    for (int64_t h = 0; h < c.head.q_heads; ++h)
      for (int64_t i = 0; i < c.prompt; ++i) {
        draw(qx.data(), c.head.head_dim);
        cache.put_q(h, i, c.prompt, qx.data());
      }
    if (Support s = can_run(prefill, pp, c.threads); !s) {
      r.prefill_note = "not run: " + s.reason;
    } else {
      Session ps(prefill, pp, c.threads);
      Tensors out = allocate_outputs(pp);
      const Inputs in = cache.inputs(c.prompt, c.prompt);
      const auto t0 = Clock::now();
      ps.run(in, out.outputs);
      r.prefill_s = seconds_since(t0);
      r.prefill_verdict = std::get<0>(check(prefill, pp, in, out.outputs, sample_rows(pp, 64, c.seed)));
    }
  }

  // The steps. Verified: the first and the last, and evenly between.
  std::vector<int64_t> verify;
  for (int v = 0; v < c.verify_steps; ++v) {
    verify.push_back(c.verify_steps == 1 ? c.steps - 1 : v * (c.steps - 1) / (c.verify_steps - 1));
  }
  Tensors out = allocate_outputs(full);
  std::vector<float> tk(static_cast<size_t>(c.head.kv_heads * c.head.head_dim)),
      tv(static_cast<size_t>(c.head.kv_heads * c.head.dim_v()));
  for (int64_t s = 0; s < c.steps; ++s) {
    const int64_t j = c.prompt + s;
    GenerationStep st;
    st.step = s;
    st.context = j + 1;
    // The token's values, before the clock (a model's projections make them).
    draw(tk.data(), static_cast<int64_t>(tk.size()));
    draw(tv.data(), static_cast<int64_t>(tv.size()));
    for (int64_t h = 0; h < c.head.q_heads; ++h) {
      draw(qx.data(), c.head.head_dim);
      cache.put_q(h, 0, 1, qx.data());
    }
    auto t0 = Clock::now();
    for (int64_t h = 0; h < c.head.kv_heads; ++h)
      cache.put_kv(h, j, tk.data() + h * c.head.head_dim, tv.data() + h * c.head.dim_v());
    st.append_s = seconds_since(t0);
    session.resize_kv(st.context);
    const Inputs in = cache.inputs(1, st.context);
    t0 = Clock::now();
    session.run(in, out.outputs);
    st.attention_s = seconds_since(t0);
    std::vector<double> again;
    for (int x = 0; x < c.repetitions; ++x) {
      t0 = Clock::now();
      session.run(in, out.outputs);
      again.push_back(seconds_since(t0));
    }
    st.repeat_s = median(again);
    const Problem& p = session.problem();
    st.kv_read_bytes = p.kv_bytes();
    st.flops = p.flops();
    if (std::find(verify.begin(), verify.end(), s) != verify.end()) {
      std::tie(st.verdict, st.err_o_rel, st.tol_o_rel) = check(kernel, p, in, out.outputs, all_rows(p));
    }
    r.steps.push_back(st);
  }
  return r;
}

nlohmann::json GenerationResult::to_json() const {
  const GenerationConfig& c = config;
  Json steps_json = Json::array();
  for (const auto& s : steps) {
    steps_json.push_back({{"step", s.step},
                          {"context", s.context},
                          {"append_s", s.append_s},
                          {"attention_s", s.attention_s},
                          {"repeat_s", s.repeat_s},
                          {"kv_read_bytes", s.kv_read_bytes},
                          {"flops", s.flops},
                          {"verdict", s.verdict},
                          {"err_o_rel", s.err_o_rel},
                          {"tol_o_rel", s.tol_o_rel}});
  }
  return {{"name", c.name},
          {"q_heads", c.head.q_heads},
          {"kv_heads", c.head.kv_heads},
          {"head_dim", c.head.head_dim},
          {"head_dim_v", c.head.dim_v()},
          {"dtype", to_string(c.head.dtype)},
          {"kv_dtype", to_string(c.head.kv_dtype)},
          {"kv_block", c.head.kv_block},
          {"kv_shared", c.head.kv_shared},
          {"prompt", c.prompt},
          {"steps", c.steps},
          {"capacity", c.cache_rows()},
          {"threads", c.threads},
          {"kernel", kernel},
          {"prefill_kernel", prefill_kernel},
          {"prefill_s", prefill_s},
          {"prefill_note", prefill_note},
          {"prefill_verdict", prefill_verdict},
          {"kv_bytes_per_token", c.kv_bytes_per_token()},
          {"repetitions", c.repetitions},
          {"read_bytes_per_s", read_bytes_per_s},
          {"peak_flops", peak_flops},
          {"median_token_s", median_token_s()},
          {"median_attention_s", median_attention_s()},
          {"median_append_s", median_append_s()},
          {"median_repeat_s", median_repeat_s()},
          {"measured_at", measured_at},
          {"steps_detail", steps_json}};
}

namespace {
std::string num(double v) {
  std::ostringstream s;
  s.precision(9);
  s << v;
  return s.str();
}
}  // namespace

std::string generation_steps_csv(const std::vector<GenerationResult>& results) {
  std::ostringstream o;
  o << "name,q_heads,kv_heads,head_dim,head_dim_v,dtype,prompt,step,context,append_s,attention_s,repeat_s,"
       "kv_read_bytes,flops,verdict,err_o_rel,tol_o_rel\n";
  for (const auto& r : results) {
    const auto& c = r.config;
    for (const auto& s : r.steps) {
      o << c.name << ',' << c.head.q_heads << ',' << c.head.kv_heads << ',' << c.head.head_dim << ',' << c.head.dim_v()
        << ',' << to_string(c.head.dtype) << ',' << c.prompt << ',' << s.step << ',' << s.context << ','
        << num(s.append_s) << ',' << num(s.attention_s) << ',' << num(s.repeat_s) << ',' << num(s.kv_read_bytes) << ','
        << num(s.flops) << ',' << s.verdict << ',' << (s.verdict.empty() ? "" : num(s.err_o_rel)) << ','
        << (s.verdict.empty() ? "" : num(s.tol_o_rel)) << '\n';
    }
  }
  return o.str();
}

std::string generation_summary_csv(const std::vector<GenerationResult>& results) {
  std::ostringstream o;
  o << "name,q_heads,kv_heads,group,head_dim,head_dim_v,dtype,kv_dtype,kv_block,kv_shared,prompt,steps,context,threads,"
       "kernel,prefill_s,"
       "prefill_note,kv_bytes_per_token,cache_bytes,kv_read_bytes_per_token,flops_per_token,median_token_s,"
       "median_append_s,median_attention_s,steady_decode_s,loop_vs_steady,tokens_per_s,read_bw_gbs,bw_fraction,"
       "peak_gflops,peak_fraction,verified,failed\n";
  for (const auto& r : results) {
    const auto& c = r.config;
    const GenerationStep& mid = r.steps[r.steps.size() / 2];
    int verified = 0, failed = 0;
    for (const auto& s : r.steps) verified += !s.verdict.empty(), failed += s.verdict == "FAIL";
    const double att = r.median_attention_s(), tok = r.median_token_s(), steady = r.median_repeat_s();
    std::string note = r.prefill_note;
    std::replace(note.begin(), note.end(), ',', ';');
    o << c.name << ',' << c.head.q_heads << ',' << c.head.kv_heads << ',' << c.head.q_heads / c.head.kv_heads << ','
      << c.head.head_dim << ',' << c.head.dim_v() << ',' << to_string(c.head.dtype) << ',' << to_string(c.head.kv_dtype)
      << ',' << c.head.kv_block << ',' << (c.head.kv_shared ? "true" : "false") << ',' << c.prompt << ',' << c.steps
      << ',' << mid.context << ',' << c.threads << ',' << r.kernel << ',' << (r.prefill_s >= 0 ? num(r.prefill_s) : "")
      << ',' << note << ',' << num(c.kv_bytes_per_token()) << ','
      << num(c.kv_bytes_per_token() * static_cast<double>(c.cache_rows())) << ',' << num(mid.kv_read_bytes) << ','
      << num(mid.flops) << ',' << num(tok) << ',' << num(r.median_append_s()) << ',' << num(att) << ',' << num(steady)
      << ',' << num(att / steady) << ',' << num(1.0 / tok) << ','
      << (r.read_bytes_per_s > 0 ? num(r.read_bytes_per_s * 1e-9) : "") << ','
      << (r.read_bytes_per_s > 0 ? num(mid.kv_read_bytes / att / r.read_bytes_per_s) : "") << ','
      << (r.peak_flops > 0 ? num(r.peak_flops * 1e-9) : "") << ','
      << (r.peak_flops > 0 ? num(mid.flops / att / r.peak_flops) : "") << ',' << verified << ',' << failed << '\n';
  }
  return o.str();
}

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
