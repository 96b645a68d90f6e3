#include "attnlab/blocks/phases.hpp"

namespace attnlab {

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return a > 0 ? (a + b - 1) / b : 0; }
int64_t mod(int64_t a, int64_t m) { return ((a % m) + m) % m; }
}  // namespace

std::vector<DilationPhase> dilation_phases(const Problem& p) {
  const int64_t D = p.dilation;
  if (D <= 1 || p.sinks > 0 || !p.globals.empty() || !p.doc_lens.empty() || p.bigbird.on() || p.mask) return {};
  const bool top_left = p.causal == CausalAlign::TopLeft;
  std::vector<DilationPhase> out;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t lk = p.kv_len_of(b), off = top_left ? 0 : lk - p.q_len;
    for (int64_t r = 0; r < D; ++r) {
      DilationPhase ph;
      ph.b = b;
      ph.first_k = r;
      ph.first_q = mod(r - off, D);  // the first row whose position is congruent to r
      if (ph.first_q >= p.q_len) continue;
      Problem& s = ph.sub;
      s.batch = 1;
      s.q_heads = p.q_heads;
      s.kv_heads = p.kv_heads;
      s.head_dim = p.head_dim;
      s.head_dim_v = p.head_dim_v;
      s.q_len = ceil_div(p.q_len - ph.first_q, D);
      s.kv_len = ceil_div(lk - r, D);
      s.causal = p.causal;
      // pos - j = D (i' - j' + c) for the phase's rows and keys: the window in phase units.
      s.window_left = p.window_left < 0 ? -1 : p.window_left / D;
      s.window_right = p.window_right < 0 ? -1 : p.window_right / D;
      s.scale = p.effective_scale();
      s.layout = p.layout;
      s.dtype = p.dtype;
      // Softcap and sink logits are the rows' own (ALiBi's distances are not the phase's: refused).
      s.softcap = p.softcap;
      s.sink_logits = p.sink_logits;
      // The phase's diagonal: pos - j = D (i' - j' + c), c = (first_q + off - r) / D. sub's own
      // alignment puts it at kv_len' - q_len' (bottom-right) or 0 (top-left), and that is c:
      // q_len - first_q = (Lk - r) - D c, so q_len' = kv_len' - c whenever the phase has keys
      // (without keys every row is masked and the diagonal does not matter). Checked against
      // the element rule over windows, alignments and lengths (DilationPhases test).
      out.push_back(std::move(ph));
    }
  }
  return out;
}

}  // namespace attnlab
