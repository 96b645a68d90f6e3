// naive: the textbook algorithm in float32, plain loops.
//
// Idea: for each (batch, head), materialize the whole scaled score matrix S (q_len x
// kv_len), then for each row take the visible interval (or, for a sparse pattern, the list of
// visible keys from the element rule), the score modifications (softcap, ALiBi: score_mod.hpp), a stable softmax
// (subtract the max; a sink logit one more term of its sum) and multiply by V. Exactly the arithmetic of
// textbook.hpp, which is also the tolerance baseline. Memory: q_len * kv_len floats of workspace (the O(n^2) the tiled
// kernels avoid). Cost: 2 * (d + d_v) FLOP per visible pair plus one exp; no reuse of K/V across rows, so at large n it
// streams K and V from memory once per query row (memory bound, ~1-3% of peak). Precision: f16/bf16 storage is widened
// exactly to float32 where read; float32 compute. A quantized cache (kv_quant.hpp) is read back as float32 K and V into
// the workspace before the loops (what the reference reads), and a paged cache (kv_block) copied into a contiguous one
// first (unpage_kv_into), as the reference reads it.
// Backward (backward.hpp): textbook::backward_row per query row - scores recomputed, P from the forward's
// LSE, D_i from its O, dQ written, dK/dV accumulated in (b, h, i) order (softcap's derivative on dS,
// dsink from each row's sink weight) - the float32 baseline of the backward's tolerance. Memory: one row of kv_len
// floats. Cost: 4 (d + d_v)-ish FLOP per visible pair.
#include <algorithm>
#include <optional>
#include <vector>

#include "attnlab/kernel.hpp"
#include "attnlab/pattern.hpp"
#include "attnlab/blocks/textbook.hpp"

namespace attnlab::cpu {
namespace {

class Naive final : public Kernel {
 public:
  std::string_view name() const override { return "naive"; }
  std::string_view description() const override {
    return "textbook float32: full score matrix, stable softmax, P*V; plain loops";
  }
  const Capabilities& capabilities() const override {
    static constexpr Capabilities k{.patterns = true,
                                    .head_dim_v = true,
                                    .kv_quant = true,
                                    .paged = true,
                                    .backward = true,
                                    .score_mods = true,
                                    .score_mods_backward = true};
    return k;
  }
  size_t backward_workspace_bytes(const Problem& p, int) const override {
    return static_cast<size_t>(p.kv_len) * sizeof(float);
  }
  // The textbook backward (textbook::backward_row), row by row: each row's scores recomputed,
  // P from the forward's LSE, dK and dV accumulated over the rows and the group's query heads
  // in (b, h, i) order. One thread.
  void run_backward(const Problem& p, const Inputs& in, const BackwardInputs& bw, const Gradients& g,
                    RunContext& ctx) const override {
    const auto zero = [&](const MutView& t, int64_t heads, int64_t seq) {
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t s = 0; s < seq; ++s) std::fill(t.row(b, h, s), t.row(b, h, s) + t.dim, 0.f);
    };
    zero(g.dk, p.kv_heads, p.kv_len);
    zero(g.dv, p.kv_heads, p.kv_len);
    if (g.dsink) std::fill(g.dsink, g.dsink + p.q_heads, 0.f);
    float* s = reinterpret_cast<float*>(ctx.workspace.data());
    const std::optional<Pattern> pattern = p.sparse() ? std::optional<Pattern>(std::in_place, p) : std::nullopt;
    std::vector<int64_t> list;
    visit_inputs(in, [&](const auto& typed) {
      for (int64_t b = 0; b < p.batch; ++b) {
        const MaskSpec mask = p.mask_for_batch(b);
        for (int64_t h = 0; h < p.q_heads; ++h)
          for (int64_t i = 0; i < p.q_len; ++i) {
            const float lse = bw.lse[(b * p.q_heads + h) * p.q_len + i];
            const auto row = [&](const auto& keys) {
              textbook::backward_row(p, typed, b, h, i, keys, bw.o.row(b, h, i), lse, bw.d_o.row(b, h, i), s,
                                     g.dq.row(b, h, i), g.dk, g.dv, g.dsink ? g.dsink + h : nullptr);
            };
            if (!pattern) {
              row(mask.row(i));
            } else {
              pattern->keys(b, h, i, list);
              row(textbook::KeyList{list.data(), static_cast<int64_t>(list.size())});
            }
          }
      }
    });
  }
  size_t workspace_bytes(const Problem& p, int) const override {
    return scores_bytes(p) + (p.kv_paged() ? unpaged_bytes(p) : 0) +
           (p.kv_quantized() ? static_cast<size_t>(p.kv_elems() + p.v_elems()) * sizeof(float) : 0);
  }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    if (p.kv_paged()) {  // a contiguous copy after the scores, then read as a contiguous cache
      std::byte* copy = ctx.workspace.data() + scores_bytes(p);
      Problem dense = p;
      dense.kv_block = 0;
      const Inputs unpaged = unpage_kv_into(p, in, copy);
      if (p.kv_quantized()) {  // and its float32 reading after the copy
        float* k = reinterpret_cast<float*>(copy + unpaged_bytes(p));
        run_typed(dense, typed<float>(dequantize_kv_into(dense, unpaged, k, k + p.kv_elems())), out, ctx);
        return;
      }
      visit_inputs(unpaged, [&](const auto& typed) { run_typed(dense, typed, out, ctx); });
      return;
    }
    if (p.kv_quantized()) {  // the whole cache read back as float32 first (kv_quant.hpp's rule)
      float* k = reinterpret_cast<float*>(ctx.workspace.data() + scores_bytes(p));
      const Inputs f32 = dequantize_kv_into(p, in, k, k + p.kv_elems());
      run_typed(p, typed<float>(f32), out, ctx);
      return;
    }
    visit_inputs(in, [&](const auto& typed) { run_typed(p, typed, out, ctx); });
  }

 private:
  static size_t scores_bytes(const Problem& p) {
    return (static_cast<size_t>(p.q_len * p.kv_len) * sizeof(float) + 63) / 64 * 64;
  }
  template <class E>
  static void run_typed(const Problem& p, const TypedInputs<E>& in, const Outputs& out, RunContext& ctx) {
    float* scores = reinterpret_cast<float*>(ctx.workspace.data());
    const float scale = p.effective_scale();
    // A sparse pattern: each row's visible keys listed by the element rule (pattern.hpp),
    // the same arithmetic on the list.
    const std::optional<Pattern> pattern = p.sparse() ? std::optional<Pattern>(std::in_place, p) : std::nullopt;
    std::vector<int64_t> list;
    for (int64_t b = 0; b < p.batch; ++b) {
      const MaskSpec mask = p.mask_for_batch(b);
      for (int64_t h = 0; h < p.q_heads; ++h) {
        const int64_t hk = p.kv_head_of(h);
        const auto with_keys = [&](int64_t i, const auto& f) {
          if (!pattern) return f(mask.row(i));
          pattern->keys(b, h, i, list);
          return f(textbook::KeyList{list.data(), static_cast<int64_t>(list.size())});
        };
        for (int64_t i = 0; i < p.q_len; ++i) {  // S = scale * Q K^T on the visible keys
          with_keys(i, [&](const auto& keys) {
            textbook::scores(in.q.row(b, h, i), in.k, b, hk, keys, scale, scores + i * p.kv_len);
            textbook::modify(p.score_mod(b, h, i), keys, scores + i * p.kv_len);
          });
        }
        for (int64_t i = 0; i < p.q_len; ++i) {  // softmax rows, then P V
          const float lse = with_keys(i, [&](const auto& keys) {
            return textbook::softmax_pv(scores + i * p.kv_len, in.v, b, hk, keys, out.o.row(b, h, i), false,
                                        p.sink_logit(h));
          });
          if (out.lse) out.lse[(b * p.q_heads + h) * p.q_len + i] = lse;
        }
      }
    }
  }
};

}  // namespace

const Kernel& naive() {
  static const Naive k;
  return k;
}

}  // namespace attnlab::cpu
