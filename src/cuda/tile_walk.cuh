// The key tiles a FlashAttention-style block visits, and which of its rows see no key: one walk
// for cuda_flash and cuda_flash_bf16 (device code; under the emulation, host code), as a cursor
// (KeyTiles: a pipelined kernel asks for the next tile before it computes this one) and as a visit.
//
// A block owns rows t0 .. t0 + rows - 1 of one kv head's (position, head in group) row space,
// position major (row t: query position t / group). Interval masks: the tiles of the union of the
// rows' visible intervals (tile_plan.hpp's plan_block), masked where some row does not see all of
// it. A sparse pattern: the block map's entries of the block's query tile (a block is one query
// tile; made by make_plan on the host), in kN-key steps, a full entry unmasked unless it ends
// early, a partial one masked by its words.
#pragma once

#include <cstdint>

#include "attnlab/blocks/online_softmax.hpp"
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

// One key tile of a block's walk: keys [j0, j0 + kN), those from `end` on not the tile's; masked
// when some row of the block does not see all of it.
struct KeyTile {
  int64_t j0 = 0, end = 0;
  bool masked = false;
  int64_t words = -1, base = 0;  // a sparse pattern's: the map entry's words (-1: full) and first key
};

// The key tiles of a block, in order, one at a time (a kernel that loads the next tile while it
// computes this one needs it before visiting). v: the block map's variant of (batch, kv head) (0
// without a pattern).
template <int kN>
class KeyTiles {
  static_assert(kN <= 64 && 64 % kN == 0, "a map entry holds whole tiles");

 public:
  __device__ __forceinline__ KeyTiles(const DeviceArgs& a, const MaskSpec& mask, int64_t v, int64_t query_tile,
                                      int64_t t0, int64_t rows)
      : a_(a), mask_(mask), t0_(t0), group_(a.group()), rows_total_(a.group() * a.q_len) {
    if (!a.sparse) {
      plan_ = cuda_impl::plan_block(mask, t0, rows, rows_total_, group_);
      j0_ = plan_.span.lo;
    } else {
      const int64_t x = v * a.map.query_tiles + query_tile;
      e_ = a.map.start[x], e_end_ = a.map.start[x + 1];
      j0_ = -1;  // the entry's first tile next
    }
  }

  // The next tile into t; false when the walk is over.
  __device__ __forceinline__ bool next(KeyTile& t) {
    if (!a_.sparse) {
      if (j0_ >= plan_.span.hi) return false;
      t = KeyTile{j0_, plan_.span.hi, plan_.needs_mask(j0_, kN), -1, 0};
      j0_ += kN;
      return true;
    }
    for (; e_ < e_end_; ++e_, j0_ = -1) {
      const BlockEntry en = a_.map.entries[e_];
      const int64_t base = en.key_tile * 64, end = base + 64 < mask_.kv_len ? base + 64 : mask_.kv_len;
      if (j0_ < 0) j0_ = base;
      if (j0_ < end) {
        t = KeyTile{j0_, end, en.words >= 0 || end - j0_ < kN, en.words, base};
        j0_ += kN;
        return true;
      }
    }
    return false;
  }

  // The keys row r of the block sees in a masked tile (bit n: key t.j0 + n).
  __device__ __forceinline__ uint64_t row_bits(const KeyTile& t, int r) const {
    if (!a_.sparse) {
      const int64_t row = t0_ + r;
      const Interval iv = row < rows_total_ ? mask_.row(row / group_) : Interval{0, 0};
      return key_bits(iv.lo - t.j0, iv.hi - t.j0);
    }
    const uint64_t w = t.words < 0 ? ~uint64_t{0} : a_.map.bits[t.words + r] >> (t.j0 - t.base);
    return w & key_bits(0, t.end - t.j0);
  }

 private:
  const DeviceArgs& a_;
  MaskSpec mask_;
  int64_t t0_, group_, rows_total_;
  cuda_impl::TilePlan plan_{};
  int64_t j0_ = 0, e_ = 0, e_end_ = 0;
};

// visit(j0, end, masked, row_bits) for each key tile [j0, j0 + kN) in order (keys from `end` on
// are not the tile's); when masked, row_bits(r) gives the keys row r of the block sees (bit n:
// key j0 + n).
template <int kN, class Visit>
__device__ __forceinline__ void for_each_key_tile(const DeviceArgs& a, const MaskSpec& mask, int64_t v,
                                                  int64_t query_tile, int64_t t0, int64_t rows, Visit&& visit) {
  KeyTiles<kN> tiles(a, mask, v, query_tile, t0, rows);
  KeyTile t;
  while (tiles.next(t)) visit(t.j0, t.end, t.masked, [&](int r) { return tiles.row_bits(t, r); });
}

// Whether query position i, head gi of its group, sees no key (O = 0, LSE = -inf): by its
// interval, or by the block map for a pattern.
__device__ __forceinline__ bool row_sees_nothing(const DeviceArgs& a, const MaskSpec& mask, int64_t v, int64_t i,
                                                 int64_t gi) {
  return a.sparse ? a.map.row_empty[(v * a.q_len + i) * a.group() + gi] != 0 : mask.row(i).empty();
}

// The end of row t of a block's row space (kv head hk of sequence b), both flash kernels' epilogue
// (m in log2 units): its LSE written when `writes` (the one lane of the row that does) and LSE is
// wanted, and where its O goes with the factor that normalizes it, the head's sink logit taken in
// (online_softmax::finish; a row that sees no key: O = 0, LSE = -inf or the sink logit).
struct RowEnd {
  float* o;
  float inv;
};
__device__ __forceinline__ RowEnd end_row(const DeviceArgs& a, const MaskSpec& mask, int64_t v, int64_t b, int64_t hk,
                                          int64_t t, float m, float l_row, bool writes) {
  const int64_t group = a.group(), i = t / group, h = hk * group + t % group;
  const bool empty = row_sees_nothing(a, mask, v, i, t % group);
  const online_softmax::Finish fin =
      row_finish<online_softmax::Units::Log2>(empty, m, l_row, a.sink(h, kLog2e));
  if (writes && a.lse) a.lse[a.lse_index(b, h, i)] = fin.lse;
  return {a.o + a.os.at(b, h, i), fin.out_scale};
}

}  // namespace attnlab::ATTN_CUDA_NS
