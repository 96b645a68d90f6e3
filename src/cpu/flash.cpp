// flash: FlashAttention-2 forward on the CPU - query tiles x key/value tiles with an online
// softmax, register-blocked micro-kernels per target (src/cpu/simd/microkernel.hpp), oneTBB.
//
// Idea. One task = (batch b, kv head hk, query tile of Br rows). The task handles the
// G = q_heads / kv_heads query heads of the group together: its R = G * Br "rows" are the
// (query row, head) pairs, interleaved row-major (rr = r * G + g) so that rows with the
// same mask sit in the same register panel. Each K/V tile is therefore loaded (and K
// packed) once for all G heads. Per task:
//   1. pack Q: rows into panels of MR = 6, k-major inside a panel, multiplied by
//      scale * log2(e) once (scores come out in log2 units, the softmax uses exp2);
//   2. for each key tile of Bc = 64 keys inside the union of the rows' visible intervals
//      (MaskSpec::rows: tiles outside it are never touched - causal does about half the
//      work): pack K transposed to [d][64] (64-byte aligned, 16x16 in-register transposes),
//      then for each panel of 6 rows:
//        S = Q.K^T in 24 zmm accumulators (6 rows x 64 keys, the whole tile width), so the
//        softmax epilogue works on registers: mask (only when a row's interval does not
//        cover the tile: select -inf, never arithmetic, so NaN/Inf in masked K never
//        leaks), tile max, m_new = max(m, tile max), alpha = 2^(m - m_new) only when the
//        max grew (otherwise no rescale at all), P = exp2(S - m_new) stored (6 x 64 floats,
//        stays in L1), l = alpha * l + rowsum(P); special values as in
//        include/attnlab/online_softmax.hpp (no row is skipped because of its max, so a NaN
//        or Inf score reaches O and LSE as in the reference);
//        O += P.V with 6 rows x 64 columns of accumulators per block, V rows read in place,
//        the alpha rescale fused into the accumulator load. On a partially visible tile
//        each row only accumulates its own visible keys (the common key range runs through
//        the 6-row kernel, the ragged ends through the 1-row kernel), so a NaN in a V row
//        that a row does not see never reaches it (0 * NaN would).
//   3. O = acc / l, LSE = m * ln2 + ln(l); O = 0, LSE = -inf for a row whose interval is empty.
// Parallel: tbb::parallel_for over all (b, hk, query tile) tasks, grain 1, inside the
// caller's arena; scratch is the workspace slice of tbb::this_task_arena::
// current_thread_index(). Tiles and summation order depend only on the problem, never on
// the thread count or on which thread runs a task, so results are bitwise identical for
// any thread count. Within each (b, hk) the query tiles are issued last-first: with causal
// masks the last tiles see the most keys, so the expensive tasks start first and the cheap
// ones fill the gaps at the end (work stealing does the rest).
//
// Tile sizes (AVX-512 figures; the L2 is the running machine's, planning_l2_bytes(); with
// 16 vector registers, AVX2, Bc = 2 vectors = 16 keys and P.V blocks of 2 vectors, see
// src/cpu/simd/microkernel.hpp). Bc = 64 = 4 zmm: the widest score row whose 6-row panel
// (24 accumulators) still leaves registers for the K vectors (32 zmm). Br comes from the L2 (1 MiB per core
// here): a task's working set is R rows of packed Q and accumulators (about 2 * d_pad floats
// a row) plus the packed K tile and the V tile (64 x d_pad floats each); Br is the largest
// multiple of 24 (so R fills whole 6-row panels) up to 120 with
// R * (2 * d_pad + 2) * 4 + 2 * 64 * d_pad * 4 <= 512 KiB (half the L2, the rest for K/V
// rows streaming in): d = 64/128, G = 1: Br = 120; d = 128, G = 4: Br = 96; d = 512, G = 8:
// Br = 24. The 6 x 64 P panel (1.5 KiB) and the panel's Q and O rows live in L1 (32 KiB);
// the packed K tile (d * 256 B: 32 KiB at d = 128) and the V tile are re-read from L2 by
// every panel, and the next tile's K/V rows are prefetched into L2 a slice per panel. Each
// K/V byte comes from memory (L3 here: one kv head's K and V at 4096 x 128 are 4 MiB) once
// per query tile: R / 2 FLOP per byte (60 at d = 128, G = 1). Br between 48 and 192
// measured the same within noise at d = 128.
//
// Memory: per thread R * (d + d_pad + 17) floats + R intervals + (d_pad + 6) * 64 floats
// (163 KiB at d = 128, G = 1; 449 KiB at G = 4), independent of q_len and kv_len (Br <= q_len
// only shrinks it): 327 KiB for 2 threads at q_len = kv_len = 32768, 8 heads, d = 128.
// Cost: 4 * d FLOP per visible pair in the two GEMMs (24 FMAs per 4 vector loads + 6
// broadcasts), plus per score one exp2 (11 vector instructions per 16 scores) and the row
// max/sum; packing K costs 1/R of the GEMM 1 work and Q is packed once per task. Profile
// (perf, 1 thread, 2048, d = 128): the two GEMM loops take ~83% of the time (they run at
// ~92% of the FMA peak), the softmax epilogue ~10%, packing/prefetch/normalization ~5%;
// at d = 64 the epilogue share doubles (~17%). Boundary tiles of causal/window masks add
// the masking and the per-row ragged ends.
// Measured (2 threads, float32, batch 1, medians of 5, % of the 2-thread FMA peak measured
// right before and after each run, on this shared, busy 2-core Zen 4 VM):
//   8 heads, d = 128, 4096 x 4096, no mask     ~77%   (target >= 60%)
//   same, causal (visible pairs only)          ~76%   (target >= 50%)
//   GQA 32 / 8 heads, d = 128, 4096            ~80%   (target >= 60%)
//   8 heads, d = 64, 4096                      ~73%   (target >= 50%)
//   8 heads, d = 128, 32768 x 32768            ~78%, workspace 327 KiB (target < 64 MiB);
//                                              max RSS 517 MiB = Q, K, V, O (512 MiB) + 5
//   ladder, 8 heads, d = 128, 2048 x 2048: flash 77.5% vs threaded 56.0% of the peak on the
//   quiet machine (attn_bench, results/2026-11-29-attn_bench; ~35% under load), i.e. 1.38x
//   faster than threaded, whose scores are 4-row x 4-key dot-product tiles (8 loads per 16
//   FMAs, then a haddp reduction of ~3 shuffles per score) written to memory for a separate
//   softmax pass, and whose P.V tiles are 4 x 4 vectors. Here K is packed once per tile so
//   GEMM 1 is a broadcast kernel (24 FMAs per 4 loads, no horizontal sums), the softmax
//   runs on the 24 accumulators, P.V uses 6 x 4-vector tiles, and 120-row query tiles read
//   K/V from memory a quarter as often as threaded's 32-row blocks.
#include <algorithm>
#include <cmath>
#include <limits>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include "attnlab/isa.hpp"
#include "attnlab/kernel.hpp"
#include "attnlab/online_softmax.hpp"
#include "cpu/parallel.hpp"
#include "cpu/simd/microkernel.hpp"
#include "cpu/simd/vec_math.hpp"

namespace attnlab::ATTN_TARGET_NS::cpu {
namespace {

using simd::Batch;
using simd::kLanes;
using simd::kPanelRows;
using simd::kTileKeys;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr auto kLog2 = online_softmax::Units::Log2;
constexpr int64_t kRowStep = 24;   // Br granularity: R = G * Br is a multiple of 6 rows
constexpr int64_t kMaxRows = 120;  // Br cap: causal waste ~ Br/2 keys per row, task count

inline size_t align64(size_t bytes) { return (bytes + 63) / 64 * 64; }

// Tile sizes and the per-thread scratch layout, a function of the problem only.
struct Tiling {
  int64_t group = 1;    // G
  int64_t br = 1;       // query rows per tile
  int64_t rows = 1;     // R = G * br (at most)
  int64_t dim = 1;      // d
  int64_t dim_pad = 16; // d rounded up to whole vectors
  size_t q_off = 0, o_off = 0, kt_off = 0, p_off = 0, m_off = 0, l_off = 0, iv_off = 0;
  size_t bytes = 0;     // per thread
};

Tiling make_tiling(const Problem& p) {
  Tiling t;
  t.group = p.group();
  t.dim = p.head_dim;
  t.dim_pad = simd::padded_dim(p.head_dim);
  const int64_t fixed = 2 * kTileKeys * t.dim_pad * int64_t{sizeof(float)};
  const int64_t per_row = (2 * t.dim_pad + 2) * int64_t{sizeof(float)};
  const int64_t budget = planning_l2_bytes() / 2;  // the running machine's L2 (isa.hpp)
  const int64_t fit = budget > fixed ? (budget - fixed) / per_row / t.group : 0;
  t.br = std::clamp(fit / kRowStep * kRowStep, kRowStep, kMaxRows);
  t.br = std::min(t.br, p.q_len);
  t.rows = t.group * t.br;
  size_t off = 0;
  auto take = [&off](size_t bytes) {
    const size_t at = off;
    off += align64(bytes);
    return at;
  };
  t.q_off = take(sizeof(float) * t.rows * t.dim);
  t.o_off = take(sizeof(float) * t.rows * t.dim_pad);
  t.kt_off = take(sizeof(float) * t.dim_pad * kTileKeys);
  t.p_off = take(sizeof(float) * kPanelRows * kTileKeys);
  t.m_off = take(sizeof(float) * t.rows);
  t.l_off = take(sizeof(float) * t.rows * kLanes);
  t.iv_off = take(sizeof(Interval) * t.rows);
  t.bytes = off;
  return t;
}

struct Scratch {
  float* q;      // R x d, panels of kPanelRows rows, k-major in a panel, times scale*log2e
  float* o;      // R x dim_pad unnormalized output accumulators
  float* kt;     // dim_pad x kTileKeys packed K tile
  float* p;      // kPanelRows x kTileKeys probabilities of the current panel
  float* m;      // R running max (log2 units)
  float* l;      // R x kLanes running sums, one partial sum per lane (reduced at the end)
  Interval* iv;  // R visible intervals, one per row (the G rows of a query row share it)

  Scratch(std::byte* base, const Tiling& t)
      : q(reinterpret_cast<float*>(base + t.q_off)),
        o(reinterpret_cast<float*>(base + t.o_off)),
        kt(reinterpret_cast<float*>(base + t.kt_off)),
        p(reinterpret_cast<float*>(base + t.p_off)),
        m(reinterpret_cast<float*>(base + t.m_off)),
        l(reinterpret_cast<float*>(base + t.l_off)),
        iv(reinterpret_cast<Interval*>(base + t.iv_off)) {}
};

// One key tile as a task sees it.
struct KeyTile {
  int64_t j0;       // first key
  int nk;           // keys in the tile (<= kTileKeys)
  const float* v;   // V row j0
  int64_t ldv;      // V row stride
};

// Lane index of each score in vector v of a tile row, as floats (exact: < 64).
inline Batch lane_index(int v) {
  alignas(64) static const float kIota[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  static_assert(kLanes <= 16, "kIota covers 16 lanes");
  return Batch::load_aligned(kIota) + Batch(static_cast<float>(v * kLanes));
}

// Steps 2a-2c of the header for the panel of MR rows starting at rr0 and one key tile.
template <int MR>
void process_panel(const Tiling& t, const Scratch& s, int64_t rr0, const KeyTile& kt) {
  // Visible keys of each row inside the tile, relative to j0; full = no row needs a mask.
  int lo[MR], hi[MR];
  int ja = kt.nk, jb = 0;  // union of the rows' visible keys: the score blocks to compute
  bool full = true;
  for (int m = 0; m < MR; ++m) {
    const Interval& iv = s.iv[rr0 + m];
    lo[m] = static_cast<int>(std::clamp<int64_t>(iv.lo - kt.j0, 0, kt.nk));
    hi[m] = static_cast<int>(std::clamp<int64_t>(iv.hi - kt.j0, 0, kt.nk));
    if (hi[m] <= lo[m]) {
      lo[m] = hi[m] = 0;
    } else {
      ja = std::min(ja, lo[m]), jb = std::max(jb, hi[m]);
    }
    full = full && iv.lo <= kt.j0 && iv.hi >= kt.j0 + kTileKeys;
  }
  if (ja >= jb) return;

  // S through L1; masked keys become -inf by a select (never arithmetic, so NaN/Inf in a
  // masked K row never leaks), the blocks outside [ja, jb) are never read unmasked.
  simd::score_panel<MR>(s.q + rr0 * t.dim, s.kt, t.dim, ja, jb, s.p);
  constexpr int kTileVecs = kTileKeys / kLanes;
  float m_old[MR], m_new[MR], alpha[MR];
  for (int m = 0; m < MR; ++m) {
    float* prow = s.p + m * kTileKeys;
    Batch vmax(kNegInf);
    if (full) {
      for (int v = 0; v < kTileVecs; ++v) vmax = simd::max(vmax, Batch::load_aligned(prow + v * kLanes));
    } else {
      const Batch lo_b(static_cast<float>(lo[m])), hi_b(static_cast<float>(hi[m]));
      for (int v = 0; v < kTileVecs; ++v) {
        const Batch idx = lane_index(v);
        const Batch x = simd::select((idx >= lo_b) & (idx < hi_b), Batch::load_aligned(prow + v * kLanes), Batch(kNegInf));
        x.store_aligned(prow + v * kLanes);
        vmax = simd::max(vmax, x);
      }
    }
    m_old[m] = s.m[rr0 + m];
    m_new[m] = std::max(m_old[m], simd::reduce_max(vmax));
  }
  // include/attnlab/online_softmax.hpp: never skipped by its max; a NaN the max drops still
  // makes l NaN. alpha is 1 (no rescale) unless the max grew past a finite one; the factors
  // of all MR rows come from one vector exp2.
  bool rescale = false;
  for (int m0 = 0; m0 < MR; m0 += kLanes) {
    const int n = std::min(kLanes, MR - m0);
    const Batch a = simd::rescale_log2(simd::load_partial(m_old + m0, n), simd::load_partial(m_new + m0, n));
    simd::store_partial(alpha + m0, a, n);
  }
  for (int m = 0; m < MR; ++m) {
    rescale = rescale || alpha[m] != 1.f;
    float* prow = s.p + m * kTileKeys;
    const Batch mb(online_softmax::subtrahend(m_new[m]));
    Batch sum(0.f);
    for (int v = 0; v < kTileVecs; ++v) {
      const Batch pv = simd::exp2(Batch::load_aligned(prow + v * kLanes) - mb);
      pv.store_aligned(prow + v * kLanes);
      sum += pv;
    }
    float* lrow = s.l + (rr0 + m) * kLanes;
    (Batch::load_aligned(lrow) * Batch(alpha[m]) + sum).store_aligned(lrow);
    s.m[rr0 + m] = m_new[m];
  }

  float* o = s.o + rr0 * t.dim_pad;
  const float* a = rescale ? alpha : nullptr;
  if (full) {
    simd::pv_rows<MR>(s.p, kTileKeys, kt.v, kt.ldv, o, t.dim_pad, a, 0, kt.nk, t.dim);
    return;
  }
  // Common visible range through the MR-row kernel, each row's ragged ends one row at a time.
  int ca = 0, cb = kt.nk;
  for (int m = 0; m < MR; ++m) ca = std::max(ca, lo[m]), cb = std::min(cb, hi[m]);
  if (ca >= cb) ca = cb = 0;
  if (ca < cb || a) simd::pv_rows<MR>(s.p, kTileKeys, kt.v, kt.ldv, o, t.dim_pad, a, ca, cb, t.dim);
  for (int m = 0; m < MR; ++m) {
    const float* prow = s.p + m * kTileKeys;
    float* orow = o + m * t.dim_pad;
    if (ca < cb) {
      if (lo[m] < ca) simd::pv_rows<1>(prow, kTileKeys, kt.v, kt.ldv, orow, t.dim_pad, nullptr, lo[m], ca, t.dim);
      if (cb < hi[m]) simd::pv_rows<1>(prow, kTileKeys, kt.v, kt.ldv, orow, t.dim_pad, nullptr, cb, hi[m], t.dim);
    } else if (lo[m] < hi[m]) {
      simd::pv_rows<1>(prow, kTileKeys, kt.v, kt.ldv, orow, t.dim_pad, nullptr, lo[m], hi[m], t.dim);
    }
  }
}

void process_panel_any(int mr, const Tiling& t, const Scratch& s, int64_t rr0, const KeyTile& kt) {
  static_assert(kPanelRows <= 6, "dispatch below covers panels of 1..6 rows");
  switch (mr) {
    case 1: process_panel<1>(t, s, rr0, kt); break;
    case 2: process_panel<2>(t, s, rr0, kt); break;
    case 3: process_panel<3>(t, s, rr0, kt); break;
    case 4: process_panel<4>(t, s, rr0, kt); break;
    case 5: process_panel<5>(t, s, rr0, kt); break;
    case 6: process_panel<6>(t, s, rr0, kt); break;
  }
}

// One task: query tile qt of kv head hk in batch b, all G query heads of the group.
void run_task(const Problem& p, const Inputs& in, const Outputs& out, const Tiling& t,
              const Scratch& s, int64_t b, int64_t hk, int64_t qt) {
  const int64_t G = t.group, d = t.dim, dp = t.dim_pad;
  const int64_t i0 = qt * t.br;
  const int64_t nr = std::min(t.br, p.q_len - i0);
  const int64_t R = nr * G;
  const MaskSpec mask = p.mask_for_batch(b);
  for (int64_t r = 0; r < nr; ++r) std::fill_n(s.iv + r * G, G, mask.row(i0 + r));
  const Interval span = mask.rows(i0, i0 + nr);

  // 1. Q panels, scaled so that scores come out in log2 units.
  const float q_scale = p.effective_scale() * simd::kLog2e;
  for (int64_t rr = 0; rr < R; ++rr) {
    const float* q = in.q.row(b, hk * G + rr % G, i0 + rr / G);
    const int64_t panel0 = rr / kPanelRows * kPanelRows;
    const int64_t mr = std::min<int64_t>(kPanelRows, R - panel0);
    float* dst = s.q + panel0 * d + (rr - panel0);
    for (int64_t k = 0; k < d; ++k) dst[k * mr] = q[k] * q_scale;
  }
  std::fill(s.o, s.o + R * dp, 0.f);
  std::fill(s.m, s.m + R, kNegInf);
  std::fill(s.l, s.l + R * kLanes, 0.f);

  // 2. Key tiles inside the union of the rows' visible intervals.
  for (int64_t j0 = span.lo; j0 < span.hi; j0 += kTileKeys) {
    const KeyTile kt{j0, static_cast<int>(std::min<int64_t>(kTileKeys, span.hi - j0)),
                     in.v.row(b, hk, j0), in.v.stride_s};
    simd::pack_k_transposed(in.k.row(b, hk, j0), in.k.stride_s, kt.nk, d, s.kt);
    // The next tile's K and V rows are prefetched a slice per panel, so they arrive in L2
    // while this tile computes instead of stalling the packing and the first panel.
    const int64_t jn = j0 + kTileKeys;
    const int64_t nn = std::min<int64_t>(kTileKeys, span.hi - jn);
    const int64_t panels = (R + kPanelRows - 1) / kPanelRows;
    for (int64_t pi = 0; pi < panels; ++pi) {
      if (nn > 0) {
        const int64_t r0 = pi * nn / panels, r1 = (pi + 1) * nn / panels;
        simd::prefetch_rows(in.k.row(b, hk, jn), in.k.stride_s, r0, r1, d);
        simd::prefetch_rows(in.v.row(b, hk, jn), in.v.stride_s, r0, r1, d);
      }
      const int64_t rr0 = pi * kPanelRows;
      process_panel_any(static_cast<int>(std::min<int64_t>(kPanelRows, R - rr0)), t, s, rr0, kt);
    }
  }

  // 3. Normalize: a row whose interval is empty gets O = 0, LSE = -inf; the others acc / l
  // and m + log l (NaN when l is 0 or NaN, as in the reference).
  const int64_t nvec = dp / kLanes;
  const int tail = static_cast<int>(d - (nvec - 1) * kLanes);
  for (int64_t rr = 0; rr < R; ++rr) {
    const int64_t h = hk * G + rr % G, i = i0 + rr / G;
    const float l = simd::reduce_sum(Batch::load_aligned(s.l + rr * kLanes));
    const bool empty = s.iv[rr].empty();
    const Batch inv(online_softmax::out_scale(empty, l));
    float* o = out.o.row(b, h, i);
    const float* acc = s.o + rr * dp;
    for (int64_t c = 0; c < nvec; ++c) {
      const Batch x = Batch::load_aligned(acc + c * kLanes) * inv;
      if (c + 1 < nvec || tail == kLanes) {
        x.store_unaligned(o + c * kLanes);
      } else {
        simd::store_partial(o + c * kLanes, x, tail);
      }
    }
    if (out.lse) {
      out.lse[(b * p.q_heads + h) * p.q_len + i] = online_softmax::out_lse<kLog2>(empty, s.m[rr], l);
    }
  }
}

class Flash final : public Kernel {
 public:
  std::string_view name() const override { return "flash"; }
  std::string_view description() const override {
    return "FlashAttention-2 forward: Br x Bc tiles, online softmax (exp2), register-blocked "
           "micro-kernels (6 rows x 64 keys avx512, 6 x 16 avx2 and neon), packed K^T, GQA groups share tiles, "
           "oneTBB over tiles";
  }
  size_t workspace_bytes(const Problem& p, int threads) const override {
    return make_tiling(p).bytes * static_cast<size_t>(threads);
  }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    const Tiling t = make_tiling(p);
    const int64_t nq = (p.q_len + t.br - 1) / t.br;
    const int64_t tasks = p.batch * p.kv_heads * nq;
    attnlab::parallel_tasks(
        tbb::blocked_range<int64_t>(0, tasks, 1),
        [&](const tbb::blocked_range<int64_t>& range) {
          const int slot = tbb::this_task_arena::current_thread_index();
          if (slot < 0 || slot >= ctx.threads) {
            throw std::logic_error("flash: thread index outside the run's arena");
          }
          const Scratch s(ctx.workspace.data() + static_cast<size_t>(slot) * t.bytes, t);
          for (int64_t task = range.begin(); task != range.end(); ++task) {
            const int64_t bh = task / nq;
            const int64_t qt = nq - 1 - task % nq;  // last (most keys under causal) first
            run_task(p, in, out, t, s, bh / p.kv_heads, bh % p.kv_heads, qt);
          }
        },
        tbb::simple_partitioner());
  }
};

}  // namespace

const Kernel& flash() {
  static const Flash k;
  return k;
}

}  // namespace attnlab::ATTN_TARGET_NS::cpu
