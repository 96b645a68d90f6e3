// The generation loop (generation.hpp).
#include "bench/generation/generation.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "attnlab/kernel.hpp"
#include "attnlab/kv_summary.hpp"
#include "attnlab/limits.hpp"
#include "attnlab/verify.hpp"
#include "bench/sweep/bench_point.hpp"
#include "bench/results/files.hpp"
#include "bench/results/machine.hpp"
#include "bench/generation/generation_cache.hpp"
#include "bench/using.hpp"

namespace attnlab::bench {

namespace {
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The kernel's output on `rows` against the float64 reference: (verdict, error, tolerance).
std::tuple<std::string, double, double> check(const Kernel& k, const Problem& p, const Inputs& in, const Outputs& out,
                                              std::vector<RowId> rows) {
  // The reference reads the cache through the same table: a block handed out twice (a later
  // token overwriting an earlier one) would agree with it, so the table itself is checked.
  if (p.kv_paged()) validate_block_table(p, in.pages);
  // A sparse decode step: the summaries the appends kept must be the ones read from the cache's keys (the
  // store path's check), and its exact part is judged against the problem masked to the pages it chose
  // (check_topk's rule; the sweeps measure its recall).
  if (p.topk()) {
    const KvSummary want = summarize_keys(p, in);
    for (int64_t hk = 0; hk < p.kv_heads; ++hk)
      for (int64_t page = 0; page < summary_pages(p.kv_len); ++page)
        for (int64_t x = 0; x < p.head_dim; ++x) {
          const auto same = [](float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); };
          if (!same(want.lo(0, hk, page, x), in.summary->lo(0, hk, page, x)) ||
              !same(want.hi(0, hk, page, x), in.summary->hi(0, hk, page, x))) {
            return {"FAIL", std::numeric_limits<double>::infinity(), 0.0};
          }
        }
  }
  const Problem judged = p.topk() ? masked_to_pages(p, in) : p;
  const Agreement a = prepare_agreement(judged, in, std::move(rows));
  const Errors e = measure(a.ref, as_const(out.o), out.lse, judged);
  const Tolerance t = tolerance_for(k, judged, in, a);
  return {t.passes(e) ? "PASS" : "FAIL", e.o_rel, t.o_rel};
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
    Problem pp = c.step_problem(c.prompt, c.prompt);
    pp.topk_tokens = pp.topk_sinks = pp.topk_recent = 0;  // the prompt reads every key
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

}  // namespace attnlab::bench
