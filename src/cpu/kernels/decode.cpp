// decode: a few new query rows (q_len 1..16) against a long KV cache - flash-decoding.
//
// Idea: with one query row per head there is nothing to parallelize over in the rows and
// each K/V byte feeds only 2 FLOP per query head, so the kernel is bound by reading the
// cache. So: (1) split the keys into fixed chunks (decode_chunk_keys) and make every
// (batch, kv head, chunk) a oneTBB task - enough tasks for any core count even at batch 1;
// (2) a task runs ALL query rows that read this kv head - the group's query heads times
// q_len - through flash's tile engine (src/cpu/simd/tiles.hpp: vector softmax, 6-row
// broadcast P.V micro-kernel) against its chunk, so every K/V byte is read from memory
// once; with few rows (up to simd::kDirectRows, 12) the engine scores straight from the K rows
// (4 rows x 2 keys (AVX2) or 4 of dot products, 4-row panels, no K^T packing, which costs as much
// as the GEMM when ~4 rows use a tile) and spreads the next tile's prefetches through the current
// tile's loops (LineStream) instead of issuing them as one burst; more rows (GQA 16, or q_len x
// group > 12) pack K^T once per tile and run flash's register-blocked panels, as a GEMM over the
// group's rows (1.08-1.24x at GQA 16: tiles.hpp); (3) each task leaves per row an
// unnormalized partial state (acc, running
// max m, sum l); a second parallel pass merges the chunks of each row exactly, in chunk
// order:
//   M = max_c m_c,  w_c = 2^(m_c - M),  L = sum_c w_c l_c,  O = sum_c w_c acc_c / L,
//   LSE = (M + log2 L) ln 2,
// with w_c = online_softmax::rescale(m_c, M) (include/attnlab/blocks/online_softmax.hpp), so NaN
// and Inf reach O and LSE as in the reference. Which chunks take part is decided by the
// row's interval alone: chunks it cannot see (past kv_lens[b], outside its causal/window
// interval) are skipped - never weighted by 0, so their scratch cannot leak NaN - while a
// chunk whose visible scores are all -inf (l_c = 0) takes part, so a NaN/Inf in V there
// reaches O as 0 * V does in the reference; a row with an empty interval gets O = 0,
// LSE = -inf.
// Sparse patterns (pattern.hpp; StreamingLLM's sinks + window is the decode case that matters):
// the block map of one q_len-row query tile (make_plan, outside the timed region) replaces the
// intervals: a chunk runs only its map entries (attend_blocks), and a row takes part in the
// merge of the chunks where the map gives it a visible key (BlockMap::row_sees).
// Query-aware sparse decode (Problem::topk_tokens; include/attnlab/kv_summary.hpp): per (batch, kv
// head) the 64-key pages topk_pages chooses from the cache's page summaries (the bound of each page
// for the group's query rows, within the token budget, with the sinks' and the recent keys' pages)
// replace the key chunks - chunk c holds chosen pages c * chunk_keys / 64 .. - and run as key tiles
// masked by the rows' intervals (attend_pages); the merge takes a row's chunks whose pages it sees.
// So the chosen keys get exactly decode's arithmetic, and a budget covering every page is dense
// decode, bit for bit. The choice is made in the run (it depends on Q): its cost is the bound of
// every page, 2 x head_dim products per page and query row (kv_summary.hpp's page_bound, float32;
// not yet on the SIMD targets).
// Thread-count independence: the chunking depends only on the problem and the merge
// order is fixed, so the output is bitwise identical for any thread count (tested in
// tests/kernels/test_threads.cpp).
// Memory: partial states batch * q_heads * q_len * ceil(kv_len / chunk keys) rows of
// (head_dim_v + 16) floats (288 KiB at q_heads 32, kv_len 32768, head_dim 128: 16 chunks), plus one
// tile-engine scratch per thread.
// Expected cost: batch * kv_heads * kv_len * (head_dim + head_dim_v) * 4 bytes of K/V streamed
// once (Problem::kv_bytes()); compute is 2 * (head_dim + head_dim_v) FLOP per (query row, key),
// i.e. group * q_len / 2 FLOP per f32 byte: memory-bound for small group * q_len. (MLA's absorbed
// decode is MQA with d 576, d_v 512, and V the first 512 columns of K's cache: Problem::kv_shared
// gives V as that view of K's rows, so the V pass reads lines the score pass just brought in, and
// a token's K/V bytes are its K row's.)
// Paged caches (Problem::kv_block): a tile's rows are walked run by run, one run per block of the
// pool it touches (microkernel.hpp's Rows), so the chunks, the tiles and the arithmetic are the
// contiguous cache's - the same bits - and only where each run starts differs.
// Precision: K and V (and Q) stored as f32, bf16 or f16 are widened exactly to float32 where
// loaded; float32 compute. A 16-bit cache is half the bytes to stream. A quantized cache
// (kv_quant.hpp: q8_0, q4_0, u8, u4, fp8) goes through the same engine with its rows as the
// element type (src/cpu/simd/kv_load.hpp): the scores and P.V read the quantized bytes and
// widen kLanes values at a time in registers by the layout's read rule, so no float32 copy of
// the cache is written or read (an earlier version read each chunk back into a float32 buffer
// first: results/2026-12-02-kv_cache, -2).
// Measured: results/2026-11-30-flash32 (% of the read bandwidth measured in the same run),
// results/2026-11-30-precision (16-bit caches).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>
#include <stdexcept>
#include <string>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "attnlab/kernel.hpp"
#include "attnlab/kv_summary.hpp"
#include "attnlab/blocks/online_softmax.hpp"
#include "cpu/engine/parallel.hpp"
#include "attnlab/kv_quant.hpp"
#include "cpu/simd/int8_dot.hpp"
#include "cpu/simd/page_bound.hpp"
#include "cpu/simd/tiles.hpp"
#include "cpu/simd/vec_math.hpp"

namespace attnlab::ATTN_TARGET_NS::cpu {
namespace {

constexpr int64_t kMaxQLen = 16;
constexpr const char* kLimitNote = "splits the keys of a few new query rows; use flash for prefill";
// Keys per task: the longest power of two up to 2048 that still leaves kMinTasks (parallel.hpp)
// tasks, at least 128. A task's first tile is read cold (touch_rows: nothing prefetched it) and
// its partial state is merged, so longer chunks leave less of both; a chunk's size does not
// matter to the caches (the tile loop is outermost: each 64-key tile is reused by every panel of
// rows while it is in L1/L2, then never again). Measured against the earlier L2-sized chunks
// (build/attn_ab_switch decode, 32/8 heads, d 128, 2 threads, Zen 3 with a 512 KiB L2; paired):
// f32 256 -> 2048 keys 1.11x at 32k, 1.16x at 128k, paged (64-token blocks) 1.12x, a mixed
// batch of 1k..64k 1.16x (paged 1.19x); bf16 512 -> 2048 1.08-1.12x; u8 1.04x, q4_0 1.00x
// (compute-bound on AVX2) - results/2026-12-03-ab, ab19.
int64_t decode_chunk_keys(const Problem& p) {
  int64_t keys = 2048;
  while (keys > 128 && p.batch * p.kv_heads * ((p.kv_len + keys - 1) / keys) < kMinTasks) keys /= 2;
  return keys;
}
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr auto kLog2 = online_softmax::Units::Log2;

// Whether a row with interval iv sees some key of `chunk`.
bool sees_chunk(const Interval& iv, int64_t chunk, int64_t chunk_keys, int64_t kv_len) {
  return std::max(iv.lo, chunk * chunk_keys) < std::min({iv.hi, (chunk + 1) * chunk_keys, kv_len});
}

// Query-aware sparse decode's chosen pages per (batch, kv head) (none: every key), cut into chunks of
// `per_chunk` pages.
struct TopkPages {
  const std::vector<std::vector<int64_t>>& pages;
  int64_t per_chunk, kv_heads;
  bool on() const { return !pages.empty(); }
  // Chunk c's pages of (b, hk): where they start and how many (0 past the list).
  std::pair<const int64_t*, int64_t> chunk(int64_t b, int64_t hk, int64_t c) const {
    const std::vector<int64_t>& list = pages[static_cast<size_t>(b * kv_heads + hk)];
    const int64_t n = static_cast<int64_t>(list.size()), lo = std::min(n, c * per_chunk);
    return {list.data() + lo, std::min(n, lo + per_chunk) - lo};
  }
  // The chunks that hold pages (of the `all` a dense decode has): the tasks and the merge run over these
  // only - a task per empty chunk of a million-key cache cost 6.7 ms a token (4096 tasks, 1 thread).
  int64_t used_chunks(int64_t all) const {
    if (!on()) return all;
    size_t most = 0;
    for (const auto& list : pages) most = std::max(most, list.size());
    return std::max<int64_t>(1, (static_cast<int64_t>(most) + per_chunk - 1) / per_chunk);
  }
};

// Whether the budget covers every page of every sequence (then the choice is every page: dense decode).
bool topk_covers_all(const Problem& p) {
  for (int64_t b = 0; b < p.batch; ++b)
    if (p.topk_tokens < p.kv_len_of(b)) return false;
  return true;
}

struct Plan {
  simd::Tiling tiling;  // the tile engine's: Br = q_len, so one task holds every row
  int64_t rows, chunk_keys, chunks, dp, row_stride;
  size_t partial_bytes;
  size_t thread_bytes;  // per thread: the engine's scratch
  Plan(const Problem& p, bool int8) : tiling(simd::make_tiling(p, p.q_len, false, false, int8)) {
    rows = p.group() * p.q_len;  // the engine's row order: (i, g) -> i * group + g
    chunk_keys = decode_chunk_keys(p);
    chunks = std::max<int64_t>(1, (p.kv_len + chunk_keys - 1) / chunk_keys);
    dp = tiling.dim_v_pad;  // the engine's accumulator rows (head_dim_v), whole vectors
    row_stride = dp + 16;   // acc (dp floats), then m at [dp], l at [dp + 1]; vector-aligned rows
    // Rounded up to whole cache lines: the per-thread scratch that follows must stay 64-byte
    // aligned (with 1-lane rows, row_stride can be odd).
    partial_bytes =
        (static_cast<size_t>(p.batch * p.kv_heads * chunks * rows * row_stride) * sizeof(float) + 63) / 64 * 64;
    thread_bytes = (tiling.bytes + 63) / 64 * 64;
  }
  float* partial(float* base, int64_t b, int64_t hk, int64_t chunk, int64_t kv_heads) const {
    return base + ((b * kv_heads + hk) * chunks + chunk) * rows * row_stride;
  }
};

// int8: decode_i8 (src/cpu/kernels/decode_i8.cpp) - the same kernel with K.Q in integers (int8_dot.hpp).
class Decode final : public Kernel {
 public:
  explicit Decode(bool int8) : int8_(int8) {}
  std::string_view name() const override { return int8_ ? "decode_i8" : "decode"; }
  std::string_view description() const override {
    if (int8_) {
      return "decode with integer K.Q and P.V: Q rounded to int8 once per row, vpdpbusd (VNNI; else vpmaddubsw + "
             "vpmaddwd) against a q8_0, q4_0, u8 or u4 cache's codes; P times V's scales rounded to 8 bits per "
             "64-key tile against V's codes (VNNI); the scales after, softmax in float32";
    }
    return "flash-decoding for q_len <= 16: key chunks of up to 2048 keys as oneTBB tasks, all query rows of a "
           "GQA group per task through flash's tile engine (K/V read once), partial (O, m, l) merged exactly";
  }
  std::string_view precision() const override {
    return int8_ ? "f32 Q to int8, P to 8 bits per tile; int32 K.Q and P.V on int caches" : Kernel::precision();
  }
  // decode_i8 reads only caches with integer codes (q8_0, q4_0, u8, u4); decode runs the others.
  const Capabilities& capabilities() const override {
    static constexpr Capabilities kF32{.patterns = true,
                                       .head_dim_v = true,
                                       .kv_quant = true,
                                       .paged = true,
                                       .score_mods = true,
                                       .topk = true,
                                       .max_q_len = kMaxQLen,
                                       .limit_note = kLimitNote};
    static constexpr Capabilities kInt8{.patterns = true,
                                        .head_dim_v = true,
                                        .kv_quant = true,
                                        .kv_int_codes_only = true,
                                        .paged = true,
                                        .score_mods = true,
                                        .topk = true,
                                        .arithmetic = Arithmetic::Int8Products,
                                        .max_q_len = kMaxQLen,
                                        .limit_note = kLimitNote};
    return int8_ ? kInt8 : kF32;
  }
  Support supports(const Problem& p) const override {
    if (!int8_) return simd::alibi_support(p, name());
    // Measured (MQA 32/1, 32k keys, the AMX Xeon): 32-row direct int8 tasks ran 0.63-0.79x decode's
    // packed float panels - then the 4 x 4 blocks' horizontal reductions cost more than the products
    // saved at that many rows. score_rows_i8 now puts keys in lanes (no reduction per row and key);
    // whether that lifts a 32-row direct task is not measured yet, so the refusal stands.
    if (p.group() * p.q_len > simd::kStreamRows) {
      return Support::no("group x q_len = " + std::to_string(p.group() * p.q_len) + " > " +
                         std::to_string(simd::kStreamRows) + ": decode_i8 scores direct tasks only; decode runs it");
    }
    return simd::alibi_support(p, name());
  }
  std::shared_ptr<const attnlab::Plan> make_plan(const Problem& p) const override {
    if (!p.sparse()) return nullptr;
    return std::make_shared<BlockPlan>(build_block_map(p, p.q_len));
  }
  size_t workspace_bytes(const Problem& p, int threads) const override {
    const Plan plan(p, int8_);
    return plan.partial_bytes + static_cast<size_t>(threads) * plan.thread_bytes;
  }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    const Plan plan(p, int8_);
    float* partials = reinterpret_cast<float*>(ctx.workspace.data());
    // A sparse pattern: the block map with one query tile of q_len rows (make_plan's, or built
    // here when run without a Session).
    const BlockMap* map = nullptr;
    std::optional<BlockMap> own;
    if (p.sparse()) {
      const auto* made = dynamic_cast<const BlockPlan*>(ctx.plan);
      map = made && made->map.br == p.q_len ? &made->map : &own.emplace(build_block_map(p, p.q_len));
    }

    // Query-aware sparse decode: per (batch, kv head) the pages its rows attend (topk_pages), their
    // chunks of plan.chunk_keys / 64 pages in place of the key chunks (the pages ascending, so the
    // merge's order stays fixed). A budget covering every page of every sequence is dense decode.
    std::vector<std::vector<int64_t>> pages;
    if (p.topk() && !topk_covers_all(p)) {
      pages.resize(static_cast<size_t>(p.batch * p.kv_heads));
      attnlab::parallel_tasks(TaskRange(0, p.batch * p.kv_heads, 1), [&](const TaskRange& range) {
        for (int64_t bh = range.begin(); bh != range.end(); ++bh)
          pages[bh] = topk_pages(p, in, bh / p.kv_heads, bh % p.kv_heads, simd::page_scores);
      });
    }
    const TopkPages chosen{pages, plan.chunk_keys / simd::kTileKeys, p.kv_heads};
    const int64_t chunks = chosen.used_chunks(plan.chunks);

    // 1. Partial states, one task per (batch, kv head, key chunk).
    const int64_t tasks = p.batch * p.kv_heads * chunks;
    attnlab::parallel_tasks(TaskRange(0, tasks, 1), [&](const TaskRange& range) {
      std::byte* mine = thread_scratch(ctx, plan.thread_bytes, "decode", plan.partial_bytes);
      const simd::Scratch s(mine, plan.tiling);
      for (int64_t t = range.begin(); t != range.end(); ++t) {
        const int64_t chunk = t % chunks;
        const int64_t bh = t / chunks;
        const int64_t b = bh / p.kv_heads, hk = bh % p.kv_heads;
        run_chunk(p, in, plan, map, chosen, s, b, hk, chunk, plan.partial(partials, b, hk, chunk, p.kv_heads));
      }
    });

    // 2. Exact merge of the chunks of every query row, in chunk order.
    attnlab::parallel_tasks(TaskRange(0, p.batch * p.kv_heads, 1), [&](const TaskRange& range) {
      for (int64_t bh = range.begin(); bh != range.end(); ++bh) {
        merge(p, out, plan, map, chosen, chunks, bh / p.kv_heads, bh % p.kv_heads, partials);
      }
    });
  }

 private:
  bool int8_;

  static void run_chunk(const Problem& p, const Inputs& in, const Plan& plan, const BlockMap* map,
                        const TopkPages& chosen, const simd::Scratch& s, int64_t b, int64_t hk, int64_t chunk,
                        float* partial) {
    const simd::Tiling& t = plan.tiling;
    const Interval keys{chunk * plan.chunk_keys, std::min((chunk + 1) * plan.chunk_keys, p.mask_for_batch(b).kv_len)};
    const int64_t rows = simd::begin_rows(p, in, t, s, b, hk, 0, p.q_len);
    if (chosen.on()) {
      const auto [first, n] = chosen.chunk(b, hk, chunk);
      simd::attend_pages(p, in, t, s, b, hk, rows, first, n);
    } else if (map) {
      simd::attend_blocks(p, in, t, s, *map, b, hk, 0, 0, rows, keys);
    } else {
      simd::attend_keys(p, in, t, s, b, hk, rows, keys);
    }
    for (int64_t rr = 0; rr < rows; ++rr) {
      float* dst = partial + rr * plan.row_stride;
      std::copy(s.o + rr * plan.dp, s.o + (rr + 1) * plan.dp, dst);
      dst[plan.dp] = s.m[rr];
      dst[plan.dp + 1] = simd::row_sum(s, rr);
    }
  }

  // Whether row r (engine order) sees a key of `chunk`: its interval, the chunk's chosen pages, or the
  // block map.
  static bool sees(const Problem& p, const Plan& plan, const BlockMap* map, const TopkPages& chosen, int64_t b,
                   int64_t hk, int64_t r, const Interval& iv, int64_t chunk) {
    const int64_t lk = p.kv_len_of(b);
    if (chosen.on()) {
      const auto [first, n] = chosen.chunk(b, hk, chunk);
      for (int64_t x = 0; x < n; ++x) {
        const int64_t j0 = first[x] * simd::kTileKeys;
        if (std::max(iv.lo, j0) < std::min({iv.hi, j0 + simd::kTileKeys, lk})) return true;
      }
      return false;
    }
    if (!map) return sees_chunk(iv, chunk, plan.chunk_keys, lk);
    return map->row_sees(map->variant(b, hk), 0, r, chunk * plan.chunk_keys,
                         std::min((chunk + 1) * plan.chunk_keys, lk));
  }

  static std::vector<uint8_t>& seen_scratch() {
    thread_local std::vector<uint8_t> v;  // per merging thread; reused across rows
    return v;
  }

  static void merge(const Problem& p, const Outputs& out, const Plan& plan, const BlockMap* map,
                    const TopkPages& chosen, int64_t chunks, int64_t b, int64_t hk, float* partials) {
    using simd::Batch;
    using simd::kLanes;
    const int64_t d = p.dim_v(), group = p.group();
    const float* first = plan.partial(partials, b, hk, 0, p.kv_heads);
    const int64_t chunk_stride = plan.rows * plan.row_stride;
    const MaskSpec mask = p.mask_for_batch(b);
    for (int64_t r = 0; r < plan.rows; ++r) {
      const int64_t h = hk * group + r % group, i = r / group;
      const float* row = first + r * plan.row_stride;
      const Interval iv = mask.row(i);
      // Chunks the row sees no key of are skipped, never weighted by 0.
      std::vector<uint8_t>& seen = seen_scratch();
      seen.assign(static_cast<size_t>(chunks), 0);
      float big_m = kNegInf;
      bool any = false;
      for (int64_t c = 0; c < chunks; ++c) {
        seen[c] = sees(p, plan, map, chosen, b, hk, r, iv, c);
        if (seen[c]) big_m = std::max(big_m, row[c * chunk_stride + plan.dp]), any = true;
      }
      float* o = out.o.row(b, h, i);
      float* lse = out.lse ? out.lse + (b * p.q_heads + h) * p.q_len + i : nullptr;
      if (!any) {  // the mask leaves the row no key (never decided by the arithmetic)
        std::fill(o, o + d, 0.f);
        if (lse) *lse = p.sink_logit(h);  // -inf, or the sink logit alone (online_softmax.hpp's rule 6)
        continue;
      }
      // Accumulate in chunk order, then one scaling per element.
      alignas(64) float acc[(Problem::kMaxHeadDim + kLanes - 1) / kLanes * kLanes];
      const int64_t nv = plan.dp / kLanes;
      std::fill(acc, acc + plan.dp, 0.f);
      double big_l = 0.0;
      for (int64_t c = 0; c < chunks; ++c) {
        if (!seen[c]) continue;
        const float* pc = row + c * chunk_stride;
        const float w = online_softmax::rescale<kLog2>(pc[plan.dp], big_m);
        big_l += static_cast<double>(w) * pc[plan.dp + 1];
        const Batch wv(w);
        for (int64_t v = 0; v < nv; ++v) {
          simd::fma(wv, Batch::load_aligned(pc + v * kLanes), Batch::load_aligned(acc + v * kLanes))
              .store_aligned(acc + v * kLanes);
        }
      }
      const online_softmax::Finish f =
          online_softmax::finish<kLog2>(false, big_m, big_l, p.sink_logit(h) * simd::kLog2e);
      simd::scale_row(acc, f.out_scale, d, o);
      if (lse) *lse = f.lse;
    }
  }
};

}  // namespace

const Kernel& decode() {
  static const Decode k(false);
  return k;
}

const Kernel& decode_with_int8_scores() {
  static const Decode k(true);
  return k;
}

}  // namespace attnlab::ATTN_TARGET_NS::cpu
