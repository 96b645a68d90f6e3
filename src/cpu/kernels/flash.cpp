// flash: FlashAttention-2 forward on the CPU - query tiles x key/value tiles with an online
// softmax, register-blocked micro-kernels per target (src/cpu/simd/microkernel.hpp), oneTBB.
// The tile engine itself (packing, softmax epilogue, the two GEMMs) is src/cpu/engine/tiles.cpp,
// shared with `decode`; this file is its prefill driver (also flash_bf16's).
//
// Idea. One task = (batch b, kv head hk, query tile of Br rows). The task handles the
// G = q_heads / kv_heads query heads of the group together: its R = G * Br "rows" are the
// (query row, head) pairs, interleaved (rr = r * G + g) so that rows with the same mask sit
// in the same register panel, and each K/V tile is loaded and packed once for all G heads.
//   1. pack Q into panels of MR = 6 rows, k-major, times scale * log2(e) (scores come out in
//      log2 units, the softmax uses exp2);
//   2. for each tile of Bc = 64 keys inside the union of the rows' visible intervals
//      (causal does about half the work): pack K transposed, block-major (one [d][16] panel
//      per AVX2 register block, [d][64] with AVX-512), then per panel of 6 rows:
//        S = Q.K^T by register blocks (6 x 16 keys = 12 ymm accumulators on AVX2, 6 x 64 =
//        24 zmm on AVX-512; on a boundary tile only the 16-key vectors some row of the panel
//        sees: a window's band edge, the diagonal, a 4-key sinks tile), stored to a 6 x 64 L1
//        buffer, so the epilogue works on 64-key rows (the same vectors) on every target:
//        mask by a select (only on boundary tiles), row max,
//        one vector exp2 for the 6 rescale factors, P = exp2(S - m) in place, l update;
//        O += P.V with 6 rows x 2 (AVX2) or 4 (AVX-512) output vectors per block, V rows
//        read in place, the rescale fused into the accumulator load. On a boundary tile the
//        keys all 6 rows see go through the 6-row kernel and each row's ragged ends through
//        a 1-row kernel, so no row multiplies a V row it does not see (0 * NaN).
//      The next tile's K/V rows are prefetched a slice per panel.
//      Wide steps: consecutive tiles that every row of the task sees whole (a dense problem's,
//      those left of a causal diagonal's band) go kWideTiles = 4 at a time (256 keys): their K^T
//      packed side by side, then per panel the scores of all 256 keys, one softmax step (one
//      max, one rescale, one l update per row) and O += P.V over the 256 V rows in place, O
//      loaded and stored once per column block (tiles.cpp: process_wide) - the panel loop's
//      per-tile overhead and the softmax's per-step costs paid once per 256 keys, not 64:
//      1.08-1.09x at d 64 and 128 (results/2026-12-06-prefill_levers).
//      K^T shared: with several query tiles per head, no sparse pattern and at most 64 MiB,
//      every head's K^T tiles are packed once per run before the tasks (prepare_kt) and every
//      query tile reads them, instead of each task packing the tiles it meets (a task's tiles
//      then start at a multiple of 64): 1.02-1.035x (32/8: 1.015x, fewer query tiles per head).
//   3. O = acc / l, LSE = m ln 2 + ln l; O = 0, LSE = -inf for a row whose interval is empty.
// Sparse patterns (pattern.hpp): step 2 runs over the key tiles of the block map instead
// (FlexAttention's BlockMask, built per problem by make_plan outside the timed region: per
// query tile, its non-empty 64-key tiles, full or with one 64-bit word of visible keys per
// row). Empty tiles cost nothing, full tiles run the unmasked path, partial tiles mask their
// holes and send each row's keys outside the panel's common ones through the 1-row P.V kernel
// (a row never multiplies a V row it does not see), and end at the last key any of the task's
// rows sees (the sinks' tile: 4 keys, not 64). Globals (Longformer, BigBird) are split
// off: the global rows run apart, up to Br of them together in one solo tile over their own map
// tiles, so K and V are read once for all of them (in a query tile, one row that sees every
// key would make every key tile partial for all its rows); the
// global columns (up to 64) are gathered: their K/V rows are copied together once per task
// (Scratch::gather) and run as one more partial tile, instead of one visible key in each of up
// to 64 otherwise empty tiles. Plan memory: 16 bytes per non-empty tile + 8 R bytes per partial
// tile + q_len G bytes. A dilated window (no other sparse term) skips the block map: its rows
// and keys of one phase (positions congruent mod D) form an ordinary dense window problem on
// strided rows (phases.hpp), so it runs as D interval problems per batch entry over strided
// views, where the block map would find every tile partial at 1/D density; their tasks go
// query tile by query tile, the D phases of one tile together (PhasePlan::tasks: they read
// interleaved rows of the same stretch of K and V; measured 1.12x at 16384 over running the
// phases one by one).
//   Special values follow include/attnlab/blocks/online_softmax.hpp.
// Parallel: oneTBB over all (b, hk, query tile) tasks, grain 1, last query tiles first (the
// most keys under causal); scratch is the running thread's slice of the workspace. Tiles and
// summation order depend only on the problem, so results are bitwise identical for any
// thread count.
// Tile sizes: Bc = 64 keys (whole register blocks on every target); Br from the running
// machine's L2 (planning_l2_bytes()): the largest multiple of 24 up to 240 whose rows
// (packed Q + accumulators, ~2 d floats each) plus the packed K and V tiles fit 3/4 of the L2
// (larger tiles pack each K tile for more rows), down to 120 while the problem has fewer than
// 64 tasks, then evened out over q_len in multiples of 6 (512 rows under a 120-row bound: 5
// tiles of 108, not 4 x 120 + 32). Memory: per thread R * (d + dv_pad + 17) floats + R
// intervals + (4 d_pad + 24) * 64 floats (~400 KiB at d = dv = 128, G = 1, R = 240; dv =
// head_dim_v, of V and O), independent of q_len and kv_len; shared, K^T (K's bytes at d a
// multiple of 16) while it fits 64 MiB.
// Cost: 2 (d + dv) FLOP per visible pair in the two GEMMs (AVX2: 12 FMAs per 2 vector loads + 6
// broadcasts; ~95% of the FMA peak in L1, measured in isolation), plus one exp2 per score
// and the per-row max/sum; K packing is 1/R of GEMM 1's loads; each K/V byte comes from
// memory once per query tile: R / 2 FLOP per byte (60 at d = 128, G = 1).
// Precision: Q, K, V stored as f32, bf16 or f16 are widened exactly to float32 where they
// are loaded (Q in its packing, K in pack_k_transposed, V rows in the P.V loads), so 16-bit
// storage changes what is read, not the arithmetic; float32 compute and accumulation. A
// quantized cache (kv_quant.hpp) is read the same way, its rows widened in registers by the
// layout's rule (src/cpu/simd/kv_load.hpp): chunked prefill over an 8/4-bit or fp8 cache.
// Measured: results/2026-12-01-flash32-2 (AVX-512 Xeon: % of peak per shape over four runs, a
// perf profile of each, the GEMM loops in isolation), results/2026-11-30-flash32 (the same on
// an AVX2 Zen 3) and results/2026-11-29-attn_bench (AVX-512, Zen 4); sparse patterns:
// results/2026-12-02-sparse-2 (5 passes) and results/2026-12-02-sparse-work (what the block
// map computes against what is visible, efficiencies paired with dense in one process).
#include <algorithm>
#include <optional>
#include <string>
#include <tuple>

#include <tbb/blocked_range.h>
#include <tbb/partitioner.h>

#include "attnlab/kernel.hpp"
#include "cpu/engine/backward_tiles.hpp"
#include "cpu/engine/parallel.hpp"
#include "cpu/simd/isa/object.hpp"
#include "cpu/simd/tiles.hpp"

namespace attnlab::ATTN_TARGET_NS {

namespace simd {

namespace {
PhasePlan phase_plan(const Problem& p, const Tiling& t) {
  PhasePlan plan;
  plan.phases = dilation_phases(p);
  plan.br = t.br;
  const auto tiles = [&](const DilationPhase& ph) { return (ph.sub.q_len + t.br - 1) / t.br; };
  for (size_t x0 = 0; x0 < plan.phases.size();) {  // the phases of one batch entry: [x0, x1)
    size_t x1 = x0;
    int64_t nq = 0;
    for (; x1 < plan.phases.size() && plan.phases[x1].b == plan.phases[x0].b; ++x1)
      nq = std::max(nq, tiles(plan.phases[x1]));
    for (int64_t hk = 0; hk < p.kv_heads; ++hk)
      for (int64_t qt = nq - 1; qt >= 0; --qt)
        for (size_t x = x0; x < x1; ++x) {
          if (qt < tiles(plan.phases[x])) plan.tasks.push_back({static_cast<int32_t>(x), static_cast<int32_t>(hk), qt});
        }
    x0 = x1;
  }
  return plan;
}

// Rows first, first + step, ... (count of them) of batch b, as a one-batch view.
template <class T>
View4<T> strided_rows(const View4<T>& v, int64_t b, int64_t first, int64_t step, int64_t count) {
  View4<T> r = v;
  r.data = v.data && count > 0 ? v.row(b, 0, first) : v.data;
  r.batch = 1;
  r.seq = count;
  r.stride_s = v.stride_s * step;
  return r;
}

// A dilated window as its dense phases (phases.hpp): per (phase, kv head, query tile of the
// phase's rows) one task over strided views of Q, K, V and O, the interval path of the tile
// engine (no block map, no masking words), LSE written through the phase's row stride.
void run_phases(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx, const Tiling& t,
                const PhasePlan& plan, const char* kernel) {
  const int64_t D = p.dilation;
  attnlab::parallel_tasks(
      TaskRange(0, static_cast<int64_t>(plan.tasks.size()), 1),
      [&](const TaskRange& range) {
        const Scratch s(thread_scratch(ctx, t.bytes, kernel), t);
        const AmxScope amx(t);
        for (int64_t task = range.begin(); task != range.end(); ++task) {
          const PhasePlan::Task& pt = plan.tasks[static_cast<size_t>(task)];
          const DilationPhase& ph = plan.phases[static_cast<size_t>(pt.phase)];
          const Problem& sub = ph.sub;
          const int64_t hk = pt.hk, i0 = pt.qt * t.br;
          Inputs sin = in;
          sin.q = strided_rows(in.q, ph.b, ph.first_q, D, sub.q_len);
          sin.q16 = strided_rows(in.q16, ph.b, ph.first_q, D, sub.q_len);
          for (auto [view, view16, src, src16] :
               {std::tuple{&sin.k, &sin.k16, &in.k, &in.k16}, std::tuple{&sin.v, &sin.v16, &in.v, &in.v16}}) {
            *view = strided_rows(*src, ph.b, ph.first_k, D, sub.kv_len);
            *view16 = strided_rows(*src16, ph.b, ph.first_k, D, sub.kv_len);
          }
          sin.kq = strided_rows(in.kq, ph.b, ph.first_k, D, sub.kv_len);  // a quantized cache's rows
          sin.vq = strided_rows(in.vq, ph.b, ph.first_k, D, sub.kv_len);
          Outputs sout = out;
          sout.o = strided_rows(out.o, ph.b, ph.first_q, D, sub.q_len);
          const LseRows lse{out.lse ? out.lse + ph.b * p.q_heads * p.q_len + ph.first_q : nullptr, p.q_len, D};
          const int64_t rows = begin_rows(sub, sin, t, s, 0, hk, i0, std::min(t.br, sub.q_len - i0));
          attend_keys(sub, sin, t, s, 0, hk, rows, Interval{0, sub.kv_len});
          finish_rows(sub, sout, t, s, 0, hk, i0, rows, &lse);
        }
      },
      tbb::simple_partitioner());
}
}  // namespace

std::shared_ptr<const Plan> prefill_plan(const Problem& p, const Tiling& t) {
  if (!p.sparse()) return nullptr;
  if (PhasePlan plan = phase_plan(p, t); !plan.phases.empty()) return std::make_shared<PhasePlan>(std::move(plan));
  return std::make_shared<BlockPlan>(build_block_map(p, t.br, /*split_globals=*/true));
}

void run_prefill(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx, const Tiling& t,
                 const char* kernel) {
  // A sparse pattern runs the block map's tiles (built by make_plan, outside the timed
  // region; here only when run without a Session).
  const BlockMap* map = nullptr;
  std::optional<BlockMap> own;
  if (p.sparse()) {
    // A dilated window runs as its dense phases (the plan's, or found here without a Session).
    const auto* phased = dynamic_cast<const PhasePlan*>(ctx.plan);
    if (phased && phased->br == t.br) return run_phases(p, in, out, ctx, t, *phased, kernel);
    if (!phased) {
      if (const PhasePlan plan = phase_plan(p, t); !plan.phases.empty())
        return run_phases(p, in, out, ctx, t, plan, kernel);
    }
    const auto* plan = dynamic_cast<const BlockPlan*>(ctx.plan);
    map = plan && plan->map.br == t.br ? &plan->map : &own.emplace(build_block_map(p, t.br, true));
  }
  // Per (b, kv head): the solo tiles of a sparse pattern first (global rows, which see every
  // key, up to br of them together), then the query tiles, the last (most keys under causal)
  // first.
  // flash_int8: every head's keys rounded once, into the workspace's shared part; flash_amx:
  // every head's tiles packed once; flash (Tiling::kt_shared): every head's K^T tiles packed once.
  std::byte* const shared = t.shared_bytes() ? ctx.workspace.data() : nullptr;
  if (t.i8_prefill) prepare_i8_keys(p, in, t, shared);
  if (t.pairs_shared) prepare_pairs(p, in, t, shared + t.i8_shared);
  if (t.kt_shared) prepare_kt(p, in, t, shared + t.i8_shared + t.pairs_shared);
  const int64_t nq = (p.q_len + t.br - 1) / t.br, ns = map ? map->solo_tiles() : 0;
  const int64_t per_bh = ns + nq;
  const int64_t tasks = p.batch * p.kv_heads * per_bh;
  attnlab::parallel_tasks(
      TaskRange(0, tasks, 1),
      [&](const TaskRange& range) {
        const Scratch s(thread_scratch(ctx, t.bytes, kernel, t.shared_bytes()), t, shared);
        const AmxScope amx(t);
        for (int64_t task = range.begin(); task != range.end(); ++task) {
          const int64_t bh = task / per_bh, b = bh / p.kv_heads, hk = bh % p.kv_heads, x = task % per_bh;
          const int64_t qt = x < ns ? nq + x : nq - 1 - (x - ns);
          const RowPositions at = x < ns ? RowPositions(map->solo_positions(qt)) : RowPositions(qt * t.br);
          const int64_t n = x < ns ? map->tile_positions(qt, p.q_len) : std::min(t.br, p.q_len - qt * t.br);
          const int64_t rows = begin_rows(p, in, t, s, b, hk, at, n);
          if (map) {
            attend_blocks(p, in, t, s, *map, b, hk, qt, at, rows);
          } else {
            attend_keys(p, in, t, s, b, hk, rows, Interval{0, p.kv_len});
          }
          finish_rows(p, out, t, s, b, hk, at, rows);
        }
      },
      tbb::simple_partitioner());
}

}  // namespace simd

namespace cpu {
namespace {

class Flash final : public Kernel {
 public:
  std::string_view name() const override { return "flash"; }
  std::string_view description() const override {
    return "FlashAttention-2 forward: Br x Bc tiles, online softmax (exp2), register-blocked "
           "micro-kernels (6 rows x 64 keys avx512, 6 x 16 avx2 and neon), packed K^T, GQA groups share tiles, "
           "oneTBB over tiles";
  }
  size_t workspace_bytes(const Problem& p, int threads) const override {
    const simd::Tiling t = simd::make_tiling(p);
    return t.shared_bytes() + t.bytes * static_cast<size_t>(threads);
  }
  // A quantized or paged cache: chunked prefill over it. The backward: src/cpu/engine/backward_tiles.cpp.
  const Capabilities& capabilities() const override {
    static constexpr Capabilities k{.patterns = true,
                                    .head_dim_v = true,
                                    .kv_quant = true,
                                    .paged = true,
                                    .backward = kBackward,
                                    .score_mods = true,
                                    .score_mods_backward = kBackward};
    return k;
  }
  Support supports(const Problem& p) const override {
    if (p.kv_paged() && p.dilation > 1) {
      return Support::no("dilation " + std::to_string(p.dilation) + " with kv_block " + std::to_string(p.kv_block) +
                         ": flash runs a dilated window as strided phases of a contiguous cache (naive and decode "
                         "read it paged)");
    }
    return simd::alibi_support(p, name());
  }
  std::shared_ptr<const Plan> make_plan(const Problem& p) const override {
    return simd::prefill_plan(p, simd::make_tiling(p));
  }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    simd::run_prefill(p, in, out, ctx, simd::make_tiling(p), "flash");
  }
  // The backward pass: src/cpu/engine/backward_tiles.cpp - not in the avx512_bf16 object, which compiles
  // flash's driver for flash_bf16 only (kBackward: capabilities() says so; the calls are discarded).
  static constexpr bool kBackward = !simd::kBf16Object;
  size_t backward_workspace_bytes(const Problem& p, int threads) const override {
    if constexpr (kBackward) return flash_backward_bytes(p, threads);
    return 0;
  }
  void run_backward(const Problem& p, const Inputs& in, const BackwardInputs& bw, const Gradients& g,
                    RunContext& ctx) const override {
    if constexpr (kBackward) {
      flash_backward(p, in, bw, g, ctx);
    } else {
      Kernel::run_backward(p, in, bw, g, ctx);  // throws: no backward here
    }
  }
  std::shared_ptr<const Plan> make_backward_plan(const Problem& p) const override {
    return kBackward && p.sparse() ? std::make_shared<PatternPlan>(p) : nullptr;
  }
};

}  // namespace

const Kernel& flash() {
  static const Flash k;
  return k;
}

}  // namespace cpu
}  // namespace attnlab::ATTN_TARGET_NS
