// simd: the blocked kernel's tiling, explicitly vectorized with xsimd; one thread.
//
// Idea: for each block of 32 query rows of one (batch, head) and each tile of 64 keys:
//   1. scores  S = Q K^T as register-blocked vector dot products: a 4-row x 4-key tile
//      keeps 16 vector accumulators running down head_dim (each loaded K vector feeds 4
//      rows, each Q vector 4 keys: 8 loads per 16 FMAs, and 16 independent FMA chains
//      hide the FMA latency), then one transposed reduction (simd::transpose_sum, about
//      45 shuffle/add instructions) turns the 16 accumulators into the 16 scores. Q is copied once per block,
//      pre-multiplied by scale * log2(e), so scores come out in log2 units and the softmax uses exp2 (one multiply per
//      score saved).
//   2. online softmax per row, vectorized: masked-off keys set to -inf (a select, so a
//      NaN in a key this row must not see cannot leak), vector max, vector exp2
//      (vec_math.hpp: 1 ulp), vector sum, accumulator rescaled by 2^(m_old - m_new).
//      Special values follow include/attnlab/blocks/online_softmax.hpp: a row is never skipped
//      because of its running max (only its interval says it saw nothing), so NaN/Inf in
//      a visible score reach O and LSE as in the reference.
//   3. O += P V as register-blocked broadcast FMAs: 4 rows x 4 head_dim vectors
//      (16 accumulators; each loaded V vector feeds 4 rows). Each row only touches the
//      keys it sees: the keys all rows of a 4-row group see go through the 4-row tile,
//      the few others (causal/window diagonal) through the same tile with one real row,
//      so masked V rows are never multiplied by a zero weight.
//   head_dim tails (not a multiple of 16): Q and the accumulator are zero padded in
//   scratch; the last K/V vector of a row is a masked load that reads only head_dim floats.
// Memory: per block, Q and accumulator 32 x d floats each, scores 32 x 64 floats, plus
//   two small zero rows: 2*32*d + 2048 + ~3*d floats (about 42 KiB at d = 128),
//   independent of the sequence lengths. K and V tiles (64 x d each) are re-read from
//   L2 by the 8 row groups of a block and stream from memory q_len/32 times per head.
// Expected cost: 4*d FLOP per visible (row, key) pair as naive; per pair at d = 128 that
//   is 16 vector FMAs (8 for S, 8 for P*V) plus about 3 shuffle/adds for the reduction and
//   1-2 vector instructions of softmax, and 20 loads per 16 FMAs in the score loop (GCC
//   folds the K loads into the FMAs): about 60-75% of the FMA peak at best.
// Numerics: dot products are summed in 16 lane partial sums then a fixed tree, instead of
//   naive's sequential sum; the row softmax is exact across tiles (online rescaling);
//   LSE = m * ln2 + ln(l) in double.
// The row engine (attend_rows) is also the work unit of `threaded`
//   (src/cpu/simd/rowblock.hpp); it prefetches the next K/V tile while computing one.
// Precision: f16/bf16 storage is widened exactly to float32 where loaded (Q in the block
//   copy, K in the score loads, V in the P*V loads); float32 compute.
// Measured: results/2026-11-29-attn_bench (ladder) and results/2026-11-30-isa (per target).
#include <algorithm>
#include <cmath>
#include <limits>

#include "attnlab/kernel.hpp"
#include "attnlab/blocks/online_softmax.hpp"
#include "cpu/simd/rowblock.hpp"
#include "cpu/simd/vec_math.hpp"

namespace attnlab::ATTN_TARGET_NS::simd {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr auto kLog2 = online_softmax::Units::Log2;
constexpr int kMr = 4;      // query rows per register tile (scores and P*V)
constexpr int kNr = 4;      // keys per score tile: kMr * kNr = 16 accumulators = one haddp
constexpr int kPvVecs = 4;  // head_dim vectors per P*V tile (64 floats)
static_assert((kMr * kNr) % kLanes == 0, "haddp reduces kLanes accumulators at a time");

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Scratch layout, in floats; every part starts 64-byte aligned.
struct Layout {
  int64_t dp;  // head_dim rounded up to the vector width
  int64_t q, acc, s, m, l, zero_q, zero_p, sink, total;
  explicit Layout(int64_t head_dim) {
    dp = round_up(head_dim, kLanes);
    int64_t at = 0;
    auto take = [&](int64_t n) {
      const int64_t start = at;
      at += round_up(n, 16);
      return start;
    };
    q = take(kRowBlock * dp);
    acc = take(kRowBlock * dp);
    s = take(kRowBlock * kKeyTile);
    m = take(kRowBlock);
    l = take(kRowBlock);
    zero_q = take(dp);
    zero_p = take(kKeyTile);
    sink = take(dp);
    total = at;
  }
};

// out[r * kNr + c] = <q[r], k[c]> over d floats. q rows are zero padded to a multiple of
// kLanes and 64-byte aligned; k rows are read only up to d (masked tail load).
template <class E>
inline void score_tile(const float* const* q, const E* const* k, int64_t d, float* out) {
  Batch acc[kMr * kNr];
  for (Batch& a : acc) a = Batch(0.f);
  const int64_t full = d / kLanes * kLanes;
  for (int64_t c = 0; c < full; c += kLanes) {
    Batch kv[kNr], qv[kMr];
    for (int i = 0; i < kNr; ++i) kv[i] = load_unaligned(k[i] + c);
    for (int r = 0; r < kMr; ++r) qv[r] = Batch::load_aligned(q[r] + c);
    for (int r = 0; r < kMr; ++r)
      for (int i = 0; i < kNr; ++i) acc[r * kNr + i] = simd::fma(qv[r], kv[i], acc[r * kNr + i]);
  }
  if (full < d) {
    const int tail = static_cast<int>(d - full);
    Batch kv[kNr], qv[kMr];
    for (int i = 0; i < kNr; ++i) kv[i] = load_partial(k[i] + full, tail);
    for (int r = 0; r < kMr; ++r) qv[r] = Batch::load_aligned(q[r] + full);
    for (int r = 0; r < kMr; ++r)
      for (int i = 0; i < kNr; ++i) acc[r * kNr + i] = simd::fma(qv[r], kv[i], acc[r * kNr + i]);
  }
  for (int g = 0; g < kMr * kNr; g += kLanes) transpose_sum(acc + g).store_aligned(out + g);
}

// acc[r][0 .. NV*kLanes) += sum_{j < n} p[r][j] * v[j * v_stride + ...] for kMr rows; the
// last vector reads only last_lanes floats of each V row. Forced inline: compiled on its
// own, GCC 12 keeps a stack copy of the accumulator array and stores all 16 of them every
// iteration (measured: 1.5x slower kernel).
template <int NV, class E>
__attribute__((always_inline)) inline void pv_tile(const float* const* p, float* const* acc, const E* v,
                                                   int64_t v_stride, int64_t n, int last_lanes) {
  Batch a[kMr * NV];
  for (int r = 0; r < kMr; ++r)
    for (int x = 0; x < NV; ++x) a[r * NV + x] = Batch::load_aligned(acc[r] + x * kLanes);
  for (int64_t j = 0; j < n; ++j) {
    const E* vr = v + j * v_stride;
    Batch vv[NV];
    for (int x = 0; x < NV - 1; ++x) vv[x] = load_unaligned(vr + x * kLanes);
    vv[NV - 1] = load_partial(vr + (NV - 1) * kLanes, last_lanes);  // all lanes when last_lanes == kLanes
    for (int r = 0; r < kMr; ++r) {
      const Batch pr(p[r][j]);
      for (int x = 0; x < NV; ++x) a[r * NV + x] = simd::fma(pr, vv[x], a[r * NV + x]);
    }
  }
  for (int r = 0; r < kMr; ++r)
    for (int x = 0; x < NV; ++x) a[r * NV + x].store_aligned(acc[r] + x * kLanes);
}

// P*V for up to kMr rows over keys [ja, jb) of the tile (relative to the tile start),
// all of head_dim. Missing rows point at a zero P row and a sink accumulator.
template <class E>
void pv_dot_rows(const float* const* p, float* const* acc, const E* v_tile, int64_t v_stride, int64_t ja, int64_t jb,
                 int64_t d, int64_t dp) {
  const float* pj[kMr];
  for (int r = 0; r < kMr; ++r) pj[r] = p[r] + ja;
  for (int64_t c0 = 0; c0 < dp; c0 += kPvVecs * kLanes) {
    const int nv = static_cast<int>(std::min<int64_t>(kPvVecs, (dp - c0) / kLanes));
    const int last = static_cast<int>(std::min<int64_t>(kLanes, d - (c0 + (nv - 1) * kLanes)));
    float* ac[kMr];
    for (int r = 0; r < kMr; ++r) ac[r] = acc[r] + c0;
    const E* vt = v_tile + ja * v_stride + c0;
    switch (nv) {
      case 1: pv_tile<1>(pj, ac, vt, v_stride, jb - ja, last); break;
      case 2: pv_tile<2>(pj, ac, vt, v_stride, jb - ja, last); break;
      case 3: pv_tile<3>(pj, ac, vt, v_stride, jb - ja, last); break;
      default: pv_tile<4>(pj, ac, vt, v_stride, jb - ja, last); break;
    }
  }
}

// Largest of the n floats at s (n <= kKeyTile), NaN lanes aside.
float row_max(const float* s, int64_t n) {
  Batch mx(kNegInf);
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) mx = simd::max(mx, Batch::load_unaligned(s + c));
  if (c < n) mx = simd::max(mx, load_partial(s + c, static_cast<int>(n - c), kNegInf));
  return reduce_max(mx);
}

// s[0..n) <- 2^(s - m); returns their sum.
float exp2_row(float* s, int64_t n, float m) {
  const Batch mv(m);
  Batch sum(0.f);
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    const Batch e = exp2(Batch::load_unaligned(s + c) - mv);
    e.store_unaligned(s + c);
    sum += e;
  }
  if (c < n) {
    const int t = static_cast<int>(n - c);
    const Batch e = exp2(load_partial(s + c, t, kNegInf) - mv);  // padding lanes give 0
    store_partial(s + c, e, t);
    sum += e;
  }
  return reduce_sum(sum);
}

}  // namespace

size_t row_block_scratch_bytes(const Problem& p) {
  return static_cast<size_t>(Layout(p.head_dim).total) * sizeof(float);
}

template <class E>
RowState attend_rows(const Problem& p, int64_t rows, const E* const* q_rows, const Interval* visible,
                     const KvHead<E>& kv, Interval keys, std::byte* scratch, const ScoreMod* mods) {
  const int64_t d = p.head_dim;
  const Layout lay(d);
  const int64_t dp = lay.dp;
  float* base = reinterpret_cast<float*>(scratch);
  float* q = base + lay.q;      // kRowBlock x dp
  float* acc = base + lay.acc;  // kRowBlock x dp
  float* s = base + lay.s;      // kRowBlock x kKeyTile
  float* m = base + lay.m;
  float* l = base + lay.l;
  const float* zero_q = base + lay.zero_q;
  const float* zero_p = base + lay.zero_p;
  float* sink = base + lay.sink;
  std::fill(base + lay.zero_q, base + lay.zero_q + dp, 0.f);
  std::fill(base + lay.zero_p, base + lay.zero_p + kKeyTile, 0.f);

  const float q_scale = p.effective_scale() * kLog2e;  // scores in log2 units
  int64_t lo[kRowBlock], hi[kRowBlock];
  Interval span{0, 0};  // union of the rows' visible keys within `keys`
  for (int64_t r = 0; r < rows; ++r) {
    lo[r] = std::max(visible[r].lo, keys.lo);
    hi[r] = std::min(visible[r].hi, keys.hi);
    if (lo[r] < hi[r]) {
      span = span.empty() ? Interval{lo[r], hi[r]} : Interval{std::min(span.lo, lo[r]), std::max(span.hi, hi[r])};
    }
    float* qs = q + r * dp;
    for (int64_t c = 0; c < d; ++c) qs[c] = to_float(q_rows[r][c]) * q_scale;
    std::fill(qs + d, qs + dp, 0.f);
    std::fill(acc + r * dp, acc + (r + 1) * dp, 0.f);
    m[r] = kNegInf;
    l[r] = 0.f;
  }

  const int64_t row_bytes = d * static_cast<int64_t>(sizeof(E));
  for (int64_t j0 = span.lo; j0 < span.hi; j0 += kKeyTile) {
    const int64_t j1 = std::min(j0 + kKeyTile, span.hi);
    const int64_t n = j1 - j0;
    // Prefetch the next tile's K and V rows while this one is computed (measured ~6% less
    // CPU time per byte with 4 rows, nothing measurable with 32).
    for (int64_t j = j1; j < std::min(j1 + kKeyTile, span.hi); ++j) {
      const char* kr = reinterpret_cast<const char*>(kv.k + j * kv.k_stride);
      const char* vr = reinterpret_cast<const char*>(kv.v + j * kv.v_stride);
      for (int64_t off = 0; off < row_bytes; off += 64) {
        __builtin_prefetch(kr + off);
        __builtin_prefetch(vr + off);
      }
    }
    // Visible keys of each row inside this tile, relative to j0: [ta, te).
    int64_t ta[kRowBlock], te[kRowBlock];
    for (int64_t r = 0; r < rows; ++r) {
      ta[r] = std::max(lo[r], j0) - j0;
      te[r] = std::min(hi[r], j1) - j0;
    }

    // 1. Scores, 4 rows x 4 keys at a time, over the keys some row of the group sees.
    for (int64_t r0 = 0; r0 < rows; r0 += kMr) {
      const int64_t rn = std::min<int64_t>(kMr, rows - r0);
      int64_t ga = n, ge = 0;
      for (int64_t r = r0; r < r0 + rn; ++r) {
        if (ta[r] >= te[r]) continue;
        ga = std::min(ga, ta[r]);
        ge = std::max(ge, te[r]);
      }
      if (ga >= ge) continue;
      const float* qr[kMr];
      for (int t = 0; t < kMr; ++t) qr[t] = t < rn ? q + (r0 + t) * dp : zero_q;
      for (int64_t jj = ga; jj < ge; jj += kNr) {
        const int64_t kn = std::min<int64_t>(kNr, ge - jj);
        const E* kr[kNr];  // keys past the group's range repeat its last key
        for (int c = 0; c < kNr; ++c) kr[c] = kv.k + (j0 + std::min<int64_t>(jj + c, ge - 1)) * kv.k_stride;
        alignas(64) float tile[kMr * kNr];
        score_tile(qr, kr, d, tile);
        for (int64_t t = 0; t < rn; ++t)
          for (int64_t c = 0; c < kn; ++c) s[(r0 + t) * kKeyTile + jj + c] = tile[t * kNr + c];
      }
    }

    // 2. Online softmax per row: scores this row must not see become -inf (overwritten,
    //    so whatever was computed there - even NaN - is gone), then max, exp2, sum.
    bool active[kRowBlock];
    for (int64_t r = 0; r < rows; ++r) {
      active[r] = ta[r] < te[r];
      if (!active[r]) continue;
      float* sr = s + r * kKeyTile;
      if (mods && mods[r].on()) {  // softcap, ALiBi (score_mod.hpp) in log2 units, before the mask
        modify_score_row(sr, 0, static_cast<int>((n + kLanes - 1) / kLanes), mods[r].softcap * kLog2e,
                         mods[r].slope * kLog2e, j0 - mods[r].pos);
      }
      std::fill(sr, sr + ta[r], kNegInf);
      std::fill(sr + te[r], sr + n, kNegInf);
      // include/attnlab/blocks/online_softmax.hpp: a NaN the max drops still makes l NaN.
      const float m_new = std::max(m[r], row_max(sr, n));
      const float alpha = online_softmax::rescale<kLog2>(m[r], m_new);
      l[r] = l[r] * alpha + exp2_row(sr, n, online_softmax::subtrahend(m_new));
      m[r] = m_new;
      if (alpha != 1.f) {
        const Batch av(alpha);
        float* ar = acc + r * dp;
        for (int64_t c = 0; c < dp; c += kLanes) (Batch::load_aligned(ar + c) * av).store_aligned(ar + c);
      }
    }

    // 3. O += P V. Keys every active row of a group sees go through the 4-row tile; each
    //    row's remaining keys go through the tile with that row alone.
    const E* v_tile = kv.v + j0 * kv.v_stride;
    for (int64_t r0 = 0; r0 < rows; r0 += kMr) {
      const int64_t rn = std::min<int64_t>(kMr, rows - r0);
      int64_t ca = 0, ce = n;
      int count = 0;
      for (int64_t r = r0; r < r0 + rn; ++r) {
        if (!active[r]) continue;
        ca = std::max(ca, ta[r]);
        ce = std::min(ce, te[r]);
        ++count;
      }
      if (count == 0) continue;
      if (ca >= ce) ca = ce = 0;  // no key common to all: each row alone below
      if (ca < ce) {
        const float* pr[kMr];
        float* ar[kMr];
        int t = 0;
        for (int64_t r = r0; r < r0 + rn; ++r) {
          if (!active[r]) continue;
          pr[t] = s + r * kKeyTile;
          ar[t++] = acc + r * dp;
        }
        for (; t < kMr; ++t) pr[t] = zero_p, ar[t] = sink;
        pv_dot_rows(pr, ar, v_tile, kv.v_stride, ca, ce, d, dp);
      }
      for (int64_t r = r0; r < r0 + rn; ++r) {
        if (!active[r]) continue;
        const float* pr[kMr] = {s + r * kKeyTile, zero_p, zero_p, zero_p};
        float* ar[kMr] = {acc + r * dp, sink, sink, sink};
        if (ta[r] < ca) pv_dot_rows(pr, ar, v_tile, kv.v_stride, ta[r], ca, d, dp);
        const int64_t from = std::max(ce, ta[r]);
        if (from < te[r]) pv_dot_rows(pr, ar, v_tile, kv.v_stride, from, te[r], d, dp);
      }
    }
  }
  return RowState{acc, dp, m, l};
}

template RowState attend_rows(const Problem&, int64_t, const float* const*, const Interval*, const KvHead<float>&,
                              Interval, std::byte*, const ScoreMod*);
template RowState attend_rows(const Problem&, int64_t, const bf16* const*, const Interval*, const KvHead<bf16>&,
                              Interval, std::byte*, const ScoreMod*);
template RowState attend_rows(const Problem&, int64_t, const f16* const*, const Interval*, const KvHead<f16>&, Interval,
                              std::byte*, const ScoreMod*);

void attend_row_block(const Problem& p, const Inputs& in, const Outputs& out, int64_t b, int64_t h, int64_t i0,
                      std::byte* scratch) {
  const int64_t d = p.head_dim;
  const int64_t rows = std::min(kRowBlock, p.q_len - i0);
  const int64_t hk = p.kv_head_of(h);
  const MaskSpec mask = p.mask_for_batch(b);
  Interval visible[kRowBlock];
  for (int64_t r = 0; r < rows; ++r) visible[r] = mask.row(i0 + r);
  ScoreMod mods[kRowBlock];
  for (int64_t r = 0; r < rows; ++r) mods[r] = p.score_mod(b, h, i0 + r);
  const RowState st = visit_inputs(in, [&]<class E>(const TypedInputs<E>& typed) {
    const E* q[kRowBlock];
    for (int64_t r = 0; r < rows; ++r) q[r] = typed.q.row(b, h, i0 + r);
    const KvHead<E> kv{typed.k.row(b, hk, 0), typed.k.stride_s, typed.v.row(b, hk, 0), typed.v.stride_s};
    return attend_rows(p, rows, q, visible, kv, Interval{0, mask.kv_len}, scratch, p.score_mods() ? mods : nullptr);
  });

  // Normalize: O = 0, LSE = -inf (or the sink logit) for a row without visible keys, decided by its
  // interval; otherwise acc / l and m + log l (NaN when l is 0 or NaN, as in the reference).
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out.o.row(b, h, i0 + r);
    const float* ar = st.acc + r * st.acc_stride;
    const online_softmax::Finish f =
        online_softmax::finish<kLog2>(visible[r].empty(), st.m[r], st.l[r], p.sink_logit(h) * kLog2e);
    scale_row(ar, f.out_scale, d, o);
    if (out.lse) out.lse[(b * p.q_heads + h) * p.q_len + i0 + r] = f.lse;
  }
}

namespace {

class SimdKernel final : public Kernel {
 public:
  std::string_view name() const override { return "simd"; }
  std::string_view description() const override {
    return "xsimd, 1 thread: 4x4 register-tiled dot products + haddp, vector exp2 online "
           "softmax, 4-row x 64-float P*V tiles; 32-row blocks x 64-key tiles";
  }
  size_t workspace_bytes(const Problem& p, int) const override { return row_block_scratch_bytes(p); }
  const Capabilities& capabilities() const override {
    static constexpr Capabilities k{.score_mods = true};
    return k;
  }
  // Runs on the calling thread whatever ctx.threads says.
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.q_heads; ++h)
        for (int64_t i0 = 0; i0 < p.q_len; i0 += kRowBlock)
          attend_row_block(p, in, out, b, h, i0, ctx.workspace.data());
  }
};

}  // namespace
}  // namespace attnlab::ATTN_TARGET_NS::simd

namespace attnlab::ATTN_TARGET_NS::cpu {
const Kernel& simd() {
  static const simd::SimdKernel k;
  return k;
}
}  // namespace attnlab::ATTN_TARGET_NS::cpu
