// blocked: cache-tiled float32 attention, still without explicit SIMD (no threads).
//
// Idea: process a block of Br = 32 query rows against tiles of Bc = 64 keys. The K tile is
// copied transposed ([d][Bc]) once per tile and reused by all 32 rows, so a score row is
// built as s[j] += q[d] * Kt[d][j]: independent sums across j that the compiler vectorizes
// without reassociating anything (naive's per-key dot product is one serial dependency
// chain that strict IEEE semantics keep scalar). Each row's softmax is kept exact
// across tiles by the online rescaling rule: running max m and sum l per row; when a tile
// raises the max, the accumulator and l are multiplied by exp(m_old - m_new). In exact
// arithmetic this equals the full-row softmax; in float it adds a few roundings only.
// Tiles outside every row's visible interval are never touched; inside a tile each row
// only computes its own visible keys. NaN/Inf follow include/attnlab/blocks/online_softmax.hpp.
// Score modifications (score_mod.hpp) per score after the scale; a sink logit at the finish.
// Cache targets (this machine: 32 KiB L1d and 1 MiB L2 per core):
//   S row 64 floats, Kt tile d x 64 floats -> L1 (32 KiB at d = 128), streamed once per row
//   V tile 64 x d floats, Q block and O accumulator 32 x d each -> L2 (16-32 KiB each at
//                                             d = 128), reused by all 32 rows of the block
// so K and V stream from memory q_len / 32 times instead of q_len times (naive).
// Memory: Br*Bc + Bc*d + Br*d_v + 2*Br floats of workspace, independent of sequence length.
// Cost: same FLOPs as naive; the compiler vectorizes both inner loops (scores over keys,
// P*V over d). Measured (attn_bench --attn_groups=ladder: 2048 x 2048, 8 heads, d 128):
// 737 ms vs naive's 2581 ms, 3.5x; both single-threaded.
// Precision: f16/bf16 storage is widened exactly to float32 where read (K in the packing
// copy, Q and V in the loops); float32 compute.
#include <cmath>
#include <limits>

#include "attnlab/kernel.hpp"
#include "attnlab/blocks/online_softmax.hpp"

namespace attnlab::cpu {
namespace {

constexpr int64_t kBr = 32;  // query rows per block
constexpr int64_t kBc = 64;  // keys per tile
constexpr auto kNatural = online_softmax::Units::Natural;

class Blocked final : public Kernel {
 public:
  std::string_view name() const override { return "blocked"; }
  std::string_view description() const override {
    return "cache-tiled float32 (32 rows x 64 keys, K tile packed transposed), online softmax across tiles; no "
           "explicit SIMD";
  }
  size_t workspace_bytes(const Problem& p, int) const override {
    return static_cast<size_t>(kBr * kBc + kBc * p.head_dim + kBr * p.dim_v() + 2 * kBr) * sizeof(float);
  }
  const Capabilities& capabilities() const override {
    static constexpr Capabilities k{.head_dim_v = true, .score_mods = true};
    return k;
  }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    visit_inputs(in, [&](const auto& typed) { run_typed(p, typed, out, ctx); });
  }

 private:
  template <class E>
  static void run_typed(const Problem& p, const TypedInputs<E>& in, const Outputs& out, RunContext& ctx) {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    float* s = reinterpret_cast<float*>(ctx.workspace.data());
    float* kt = s + kBr * kBc;  // K tile, transposed: kt[d * kBc + j]
    float* acc = kt + kBc * p.head_dim;
    float* m = acc + kBr * p.dim_v();
    float* l = m + kBr;
    const int64_t dim = p.head_dim, dv = p.dim_v();
    const float scale = p.effective_scale();
    for (int64_t b = 0; b < p.batch; ++b) {
      const MaskSpec mask = p.mask_for_batch(b);
      for (int64_t h = 0; h < p.q_heads; ++h) {
        const int64_t hk = p.kv_head_of(h);
        for (int64_t i0 = 0; i0 < p.q_len; i0 += kBr) {
          const int64_t rows = std::min(kBr, p.q_len - i0);
          for (int64_t r = 0; r < rows; ++r) {
            m[r] = kNegInf;
            l[r] = 0.f;
            for (int64_t d = 0; d < dv; ++d) acc[r * dv + d] = 0.f;
          }
          const Interval span = mask.rows(i0, i0 + rows);
          for (int64_t j0 = span.lo; j0 < span.hi; j0 += kBc) {
            const int64_t j1 = std::min(j0 + kBc, span.hi);
            const int64_t n = j1 - j0;
            for (int64_t j = 0; j < n; ++j) {
              const E* k = in.k.row(b, hk, j0 + j);
              for (int64_t d = 0; d < dim; ++d) kt[d * kBc + j] = to_float(k[d]);
            }
            for (int64_t r = 0; r < rows; ++r) {
              const Interval iv = mask.row(i0 + r);
              const int64_t lo = std::max(iv.lo, j0), hi = std::min(iv.hi, j1);
              if (lo >= hi) continue;
              // S row over the whole tile (scores of keys this row cannot see are computed
              // but never read); one running sum per key, in d order and without fused
              // multiply-adds (CMakeLists.txt), so the scores equal naive's bit for bit.
              const E* q = in.q.row(b, h, i0 + r);
              float* __restrict srow = s + r * kBc;
              for (int64_t j = 0; j < n; ++j) srow[j] = 0.f;
              for (int64_t d = 0; d < dim; ++d) {
                const float qd = to_float(q[d]);
                const float* __restrict kd = kt + d * kBc;
                for (int64_t j = 0; j < n; ++j) srow[j] += qd * kd[j];
              }
              float tile_max = kNegInf;
              const ScoreMod mod = p.score_mod(b, h, i0 + r);  // softcap, ALiBi (score_mod.hpp)
              for (int64_t j = lo; j < hi; ++j) {
                srow[j - j0] = mod.on() ? mod(srow[j - j0] * scale, j) : srow[j - j0] * scale;
                tile_max = std::max(tile_max, srow[j - j0]);
              }
              // Online softmax: rescale what was accumulated under the old max, with the
              // special-value rules of include/attnlab/blocks/online_softmax.hpp.
              const float m_new = std::max(m[r], tile_max);
              float* a = acc + r * dv;
              const float alpha = online_softmax::rescale<kNatural>(m[r], m_new);
              if (alpha != 1.f) {
                l[r] *= alpha;
                for (int64_t d = 0; d < dv; ++d) a[d] *= alpha;
              }
              m[r] = m_new;
              const float sub = online_softmax::subtrahend(m_new);
              for (int64_t j = lo; j < hi; ++j) {
                const float pj = std::exp(srow[j - j0] - sub);
                l[r] += pj;
                const E* v = in.v.row(b, hk, j);
                for (int64_t d = 0; d < dv; ++d) a[d] += pj * to_float(v[d]);
              }
            }
          }
          for (int64_t r = 0; r < rows; ++r) {
            float* o = out.o.row(b, h, i0 + r);
            // Fully masked (empty interval) -> O = 0, LSE = -inf (or the sink logit); else acc / l, m + log l.
            const online_softmax::Finish f =
                online_softmax::finish<kNatural>(mask.row(i0 + r).empty(), m[r], l[r], p.sink_logit(h));
            for (int64_t d = 0; d < dv; ++d) o[d] = acc[r * dv + d] * f.out_scale;
            if (out.lse) out.lse[(b * p.q_heads + h) * p.q_len + i0 + r] = f.lse;
          }
        }
      }
    }
  }
};

}  // namespace

const Kernel& blocked() {
  static const Blocked k;
  return k;
}

}  // namespace attnlab::cpu
