// Query-aware sparse decode's page scorer at the target's width (include/attnlab/kv_summary.hpp's
// PageScorer). page_bound's arithmetic is one chain of fused multiply-adds per page, in element order;
// the summary stores 16 pages per block with the page fastest, so a vector's lanes are 16 / kLanes
// pages' chains side by side - the reference's bits on every target, and never a horizontal sum.
// The summaries stream once, block after block (16 pages: 2 x d x 64 bytes, in address order): each
// loaded vector feeds every query of the group before the next is loaded, and the group's chains are
// the independent work that hides a chain's latency (up to kHeadsAtOnce queries per pass; a larger
// group takes more passes over the block, from L1).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "attnlab/kv_summary.hpp"
#include "cpu/simd/vec_math.hpp"

namespace attnlab::ATTN_TARGET_NS::simd {

namespace page_detail {

inline constexpr int kVecs = static_cast<int>(kSummaryBlockPages) / kLanes;  // vectors per block row
inline constexpr int kHeadsAtOnce = std::max(1, 16 / kVecs);                 // 16 accumulators

// The block's bounds for queries [g0, g0 + H) of `split`, merged into m (16 lanes: the largest, NaN
// when any is NaN).
template <int H>
inline void score_heads(const float* split, int64_t g0, int64_t d, const float* block, float* m) {
  constexpr int64_t kPages = kSummaryBlockPages;
  Batch acc[H][kVecs];
  for (auto& h : acc)
    for (Batch& a : h) a = Batch(0.f);
  for (int64_t x = 0; x < d; ++x) {
    Batch lo[kVecs], hi[kVecs];
    for (int a = 0; a < kVecs; ++a) {
      lo[a] = load_unaligned(block + x * kPages + a * kLanes);
      hi[a] = load_unaligned(block + (d + x) * kPages + a * kLanes);
    }
    for (int h = 0; h < H; ++h) {
      const float* pos = split + 2 * (g0 + h) * d;
      const Batch p(pos[x]), n(pos[d + x]);
      for (int a = 0; a < kVecs; ++a) acc[h][a] = fma(n, lo[a], fma(p, hi[a], acc[h][a]));
    }
  }
  alignas(64) float u[kPages];
  for (int h = 0; h < H; ++h) {
    for (int a = 0; a < kVecs; ++a) acc[h][a].store_aligned(u + a * kLanes);
    for (int64_t l = 0; l < kPages; ++l) {
      if (std::isnan(m[l])) continue;  // (a NaN stays)
      m[l] = std::isnan(u[l]) ? u[l] : std::max(m[l], u[l]);
    }
  }
}

template <int H>
inline void score_heads_up_to(const float* split, int64_t g0, int64_t n, int64_t d, const float* block, float* m) {
  if constexpr (H > 1) {
    if (n < H) return score_heads_up_to<H / 2>(split, g0, n, d, block, m);
  }
  score_heads<H>(split, g0, d, block, m);
  if (n > H) score_heads_up_to<H>(split, g0 + H, n - H, d, block, m);
}

}  // namespace page_detail

// kv_summary.hpp's PageScorer.
inline void page_scores(const float* split, int64_t group, int64_t d, const float* blocks, int64_t pages, float* best) {
  if constexpr (kLanes == 1) {
    // The scalar target's fma is not fused (scalar_batch.hpp): the reference is its scorer.
    attnlab::page_scores_reference(split, group, d, blocks, pages, best);
  } else {
    constexpr int64_t kPages = kSummaryBlockPages;
    const int64_t block_floats = 2 * d * kPages;
    alignas(64) float m[kPages];
    for (int64_t k = 0; k * kPages < pages; ++k) {
      std::fill_n(m, kPages, -std::numeric_limits<float>::infinity());
      page_detail::score_heads_up_to<page_detail::kHeadsAtOnce>(split, 0, group, d, blocks + k * block_floats, m);
      std::copy_n(m, std::min(kPages, pages - k * kPages), best + k * kPages);
    }
  }
}

}  // namespace attnlab::ATTN_TARGET_NS::simd
