// Which key tiles a block of cuda_flash visits, and which of them need the mask: host and
// device code (ATTN_HD), so the rule is unit-tested on the host exhaustively
// (tests/kernels/test_cuda.cpp) rather than only through whole-kernel agreement.
//
// A block owns rows t0 .. t0 + rows - 1 of one kv head's (position, head-in-group) row space,
// position major: row t is query position t / group. Its key tiles start at span.lo and step
// by the tile width; a tile outside `span` (the union of the rows' visible intervals) is never
// visited. A tile inside `inner` (the intersection; empty when the block has rows past the
// problem or a fully masked row) is visible to every row of the block and needs no mask.
#pragma once

#include <cstdint>

#include "attnlab/blocks/interval.hpp"

namespace attnlab::cuda_impl {

struct TilePlan {
  Interval span;   // union of the block's visible intervals
  Interval inner;  // intersection; empty if any row of the block is masked or absent

  // Tile [j0, j0 + width): true when some row of the block does not see all of it.
  ATTN_HD bool needs_mask(int64_t j0, int64_t width) const { return !(j0 >= inner.lo && j0 + width <= inner.hi); }
};

ATTN_HD TilePlan plan_block(const MaskSpec& mask, int64_t t0, int64_t rows, int64_t rows_total, int64_t group) {
  const int64_t t_end = t0 + rows < rows_total ? t0 + rows : rows_total;
  const int64_t i_first = t0 / group, i_last = (t_end - 1) / group;
  TilePlan plan;
  plan.span = mask.rows(i_first, i_last + 1);
  plan.inner = Interval{0, 0};
  if (t0 + rows <= rows_total) {
    plan.inner = Interval{0, mask.kv_len};
    for (int64_t i = i_first; i <= i_last; ++i) {
      const Interval iv = mask.row(i);
      plan.inner.lo = iv.lo > plan.inner.lo ? iv.lo : plan.inner.lo;
      plan.inner.hi = iv.hi < plan.inner.hi ? iv.hi : plan.inner.hi;
    }
  }
  return plan;
}

}  // namespace attnlab::cuda_impl
