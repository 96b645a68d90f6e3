// The generation run's two CSVs (generation.hpp): every step, and one summary row per run.
#include <algorithm>
#include <sstream>

#include "bench/generation/generation.hpp"

namespace attnlab::bench {

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

}  // namespace attnlab::bench
