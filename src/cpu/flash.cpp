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

#include <tbb/blocked_range.h>
#include <tbb/partitioner.h>

#include "attnlab/kernel.hpp"
#include "cpu/parallel.hpp"
#include "cpu/simd/tiles.hpp"

namespace attnlab::ATTN_TARGET_NS::cpu {
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
    return simd::make_tiling(p).bytes * static_cast<size_t>(threads);
  }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    const simd::Tiling t = simd::make_tiling(p);
    const int64_t nq = (p.q_len + t.br - 1) / t.br;
    const int64_t tasks = p.batch * p.kv_heads * nq;
    attnlab::parallel_tasks(
        tbb::blocked_range<int64_t>(0, tasks, 1),
        [&](const tbb::blocked_range<int64_t>& range) {
          const simd::Scratch s(thread_scratch(ctx, t.bytes, "flash"), t);
          for (int64_t task = range.begin(); task != range.end(); ++task) {
            const int64_t bh = task / nq, b = bh / p.kv_heads, hk = bh % p.kv_heads;
            const int64_t i0 = (nq - 1 - task % nq) * t.br;  // last (most keys under causal) first
            const int64_t rows = simd::begin_rows(p, in, t, s, b, hk, i0, std::min(t.br, p.q_len - i0));
            simd::attend_keys(p, in, t, s, b, hk, rows, Interval{0, p.kv_len});
            simd::finish_rows(p, out, t, s, b, hk, i0, rows);
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
