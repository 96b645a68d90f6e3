// The generation loop (attnlab generate): what decode costs inside token-by-token generation.
//
// A preallocated KV cache of capacity C (one batch entry, BHSD, kv_heads x C rows of K and of
// V in the storage dtype or a quantized layout; or, paged (kv_block B), a pool of ceil(C / B)
// blocks handed out to the sequence as its tokens arrive, through a growing block table; or,
// kv_shared, K's rows alone with V their first head_dim_v columns) holds a prompt of P tokens; the prompt's attention
// runs once as a flash prefill (causal, P x P) when P is at most prefill_max_tokens, otherwise the cache is filled with
// the prompt's K/V rows without it and the result says so. Then S steps, each:
//   append  one token's K and V rows for every kv head written into the cache at row P + s
//           (converted to the storage dtype: what a real KV cache pays per token);
//   attend  the decode kernel for the token's q_heads query rows against all P + s + 1 keys
//           (one Session made for capacity C, Session::resize_kv per step: no allocation).
// Each part is timed with the steady clock, one step at a time (there is no repetition: every
// step is a different problem). The token's Q/K/V values are drawn before the clock starts
// (in a model they come from the projections, outside attention). Sampled steps are verified
// against the float64 reference with the lab's tolerance policy, outside the timed parts.
// After each step the same decode call is timed again `repetitions` times without appending
// (GenerationStep::repeat_s, interleaved with the steps so that the machine's drift hits both
// alike): the loop's attention time should match it, since it is the same work; the
// difference is what the loop adds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnlab/problem.hpp"

namespace attnlab::schema {
struct Axis;
}

namespace attnlab::bench {

struct GenerationConfig {
  std::string name = "run";  // label of the configuration (letters, digits, . _ -)
  // The step's attention as a point of the schema: heads, head dims, the storage of Q and the
  // K/V cache, and any setting axis (point_schema.hpp); batch 1. A step's lengths and the
  // bottom-right causal mask are set per step (step_problem).
  Problem head = default_head();
  int64_t prompt = 1024;  // P: tokens in the cache before the first step (>= 0)
  int64_t steps = 16;     // S: generated tokens (>= 1)
  int64_t capacity = 0;   // C: cache rows (0 = P + S; else >= P + S)
  int threads = 1;
  std::string kernel = "decode";         // the step's attention
  std::string prefill_kernel = "flash";  // the prompt's
  int64_t prefill_max_tokens = 4096;     // longer prompts are not prefilled (said in the result)
  int verify_steps = 2;                  // steps checked against the reference: the first and last, evenly between
  int repetitions = 1;                   // repeated decode calls after each step (GenerationStep::repeat_s)
  uint64_t seed = 1;
  // Throws InvalidInput naming the field and the allowed values.
  void validate() const;
  static Problem default_head();  // 32/8 heads, d 128, f32
  // The attention of a step: q_len query rows against the first kv_len cache rows.
  Problem step_problem(int64_t q_len, int64_t kv_len) const;
  int64_t cache_rows() const { return capacity > 0 ? capacity : prompt + steps; }
  // K and V bytes one token adds to the cache (all kv heads): the cache's memory per token.
  double kv_bytes_per_token() const;
  // "f32", "f32, a q8_0 cache, paged in 64-token blocks, V = K's first 512 columns", ...
  std::string cache_text() const;
};

// The point schema's axes a generation run (or attnlab generate's flags) sets: the heads and
// head dims, and every setting axis (dtype, ...).
bool is_generation_axis(const schema::Axis& a);

struct GenerationStep {
  int64_t step = 0;     // 0-based
  int64_t context = 0;  // keys the step's query sees: P + step + 1
  double append_s = 0, attention_s = 0;
  double repeat_s = 0;       // median of the same decode call repeated, no append
  double kv_read_bytes = 0;  // the step's Problem::kv_bytes(): the cache bytes it reads
  double flops = 0;          // the step's Problem::flops()
  std::string verdict;       // "" (not checked), "PASS", "FAIL"
  double err_o_rel = 0, tol_o_rel = 0;
};

struct GenerationResult {
  GenerationConfig config;
  std::string kernel, prefill_kernel;  // kernel labels (flash[avx512], ...)
  double prefill_s = -1;               // < 0: not run (prefill_note says why)
  std::string prefill_note, prefill_verdict;
  double read_bytes_per_s = 0;  // the machine's read bandwidth measured in the same run (0 = not)
  double peak_flops = 0;        // the default target's FMA peak measured in the same run (0 = not)
  std::vector<GenerationStep> steps;
  std::string measured_at;

  double median_token_s() const;  // median over steps of append + attention
  double median_attention_s() const;
  double median_append_s() const;
  double median_repeat_s() const;  // the steady decode: the steps' repeat_s
  nlohmann::json to_json() const;
};

// Runs one configuration. Throws InvalidInput (bad config, a kernel that cannot run it, the
// memory budget).
GenerationResult run_generation(const GenerationConfig& config);

// An experiment file of kind "generation" (experiments/generation.json): every run x prompt as
// one configuration, in file order. `all_threads` is what "all" means. Throws InvalidInput naming
// the file, the key and what is allowed.
std::vector<GenerationConfig> load_generation_experiment(const std::string& path, int all_threads);

// One CSV row per step of every result, and one summary row per result.
std::string generation_steps_csv(const std::vector<GenerationResult>& results);
std::string generation_summary_csv(const std::vector<GenerationResult>& results);

}  // namespace attnlab::bench
