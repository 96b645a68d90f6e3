// The key tiles a FlashAttention-style block visits, and which of its rows see no key: one walk
// for cuda_flash and cuda_flash_bf16 (device code; under the emulation, host code).
//
// A block owns rows t0 .. t0 + rows - 1 of one kv head's (position, head in group) row space,
// position major (row t: query position t / group). Interval masks: the tiles of the union of the
// rows' visible intervals (tile_plan.hpp's plan_block), masked where some row does not see all of
// it. A sparse pattern: the block map's entries of the block's query tile (a block is one query
// tile; made by make_plan on the host), in kN-key steps, a full entry unmasked unless it ends
// early, a partial one masked by its words.
#pragma once

#include <cstdint>

#include "cuda/device.cuh"
#include "cuda/tile_plan.hpp"

namespace attnlab::ATTN_CUDA_NS {

// Bits lo .. hi - 1 of a 64-key tile's mask (bit n: key j0 + n), lo and hi relative to j0,
// clamped to [0, 64).
__device__ __forceinline__ uint64_t key_bits(int64_t lo, int64_t hi) {
  lo = lo < 0 ? 0 : lo;
  hi = hi > 64 ? 64 : hi;
  if (hi <= lo) return 0;
  const uint64_t below_hi = hi == 64 ? ~uint64_t{0} : (uint64_t{1} << hi) - 1;
  return below_hi & ~((uint64_t{1} << lo) - 1);
}

// visit(j0, end, masked, row_bits) for each key tile [j0, j0 + kN) in order (keys from `end` on
// are not the tile's); when masked, row_bits(r) gives the keys row r of the block sees (bit n:
// key j0 + n). v: the block map's variant of (batch, kv head) (0 without a pattern).
template <int kN, class Visit>
__device__ __forceinline__ void for_each_key_tile(const DeviceArgs& a, const MaskSpec& mask, int64_t v,
                                                  int64_t query_tile, int64_t t0, int64_t rows, Visit&& visit) {
  static_assert(kN <= 64 && 64 % kN == 0, "a map entry holds whole tiles");
  const int64_t group = a.group(), rows_total = group * a.q_len;
  if (!a.sparse) {
    const cuda_impl::TilePlan plan = cuda_impl::plan_block(mask, t0, rows, rows_total, group);
    for (int64_t j0 = plan.span.lo; j0 < plan.span.hi; j0 += kN) {
      visit(j0, plan.span.hi, plan.needs_mask(j0, kN), [&](int r) {
        const int64_t t = t0 + r;
        const Interval iv = t < rows_total ? mask.row(t / group) : Interval{0, 0};
        return key_bits(iv.lo - j0, iv.hi - j0);
      });
    }
    return;
  }
  const int64_t x = v * a.map.query_tiles + query_tile;
  for (int64_t e = a.map.start[x]; e < a.map.start[x + 1]; ++e) {
    const BlockEntry en = a.map.entries[e];
    const int64_t base = en.key_tile * 64, end = base + 64 < mask.kv_len ? base + 64 : mask.kv_len;
    for (int64_t j0 = base; j0 < end; j0 += kN) {
      visit(j0, end, en.words >= 0 || end - j0 < kN, [&](int r) {
        const uint64_t w = en.words < 0 ? ~uint64_t{0} : a.map.bits[en.words + r] >> (j0 - base);
        return w & key_bits(0, end - j0);
      });
    }
  }
}

// Whether query position i, head gi of its group, sees no key (O = 0, LSE = -inf): by its
// interval, or by the block map for a pattern.
__device__ __forceinline__ bool row_sees_nothing(const DeviceArgs& a, const MaskSpec& mask, int64_t v, int64_t i,
                                                 int64_t gi) {
  return a.sparse ? a.map.row_empty[(v * a.q_len + i) * a.group() + gi] != 0 : mask.row(i).empty();
}

}  // namespace attnlab::ATTN_CUDA_NS
