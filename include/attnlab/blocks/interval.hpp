// The visible-key rule, in ONE place, usable from host and CUDA device code.
//
// For query row i of a batch whose kv length is Lk (kv_lens[b] or kv_len) and q length Lq:
//   off = Lk - Lq            (bottom-right alignment: the default meaning of "causal",
//                             what FlashAttention >= 2.1 and every KV-cache decoder use)
//   off = 0                  (top-left alignment: PyTorch's is_causal)
//   causal      -> right = 0 (a window's right bound is clipped to 0)
//   hi = right < 0 ? Lk : min(Lk, i + off + right + 1)
//   lo = left  < 0 ? 0  : max(0,  i + off - left)
// Window bounds are inclusive: left = w sees w keys before the diagonal plus the diagonal;
// a bound reaching past the first or last key is the same as -1 (no overflow for any value).
// Without causal the window is aligned bottom-right (FlashAttention's convention).
// An interval with lo >= hi is empty: the row is fully masked (O = 0, LSE = -inf).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ATTN_HD __host__ __device__ inline
#else
#define ATTN_HD inline
#endif

namespace attnlab {

enum class CausalAlign : int {
  None = 0,
  BottomRight = 1,  // query i sees keys j <= i + (Lk - Lq)
  TopLeft = 2,      // query i sees keys j <= i  (PyTorch is_causal)
};

struct Interval {
  int64_t lo = 0;
  int64_t hi = 0;
  ATTN_HD bool empty() const { return hi <= lo; }
  ATTN_HD int64_t size() const { return hi > lo ? hi - lo : 0; }
};

// The mask of one batch entry: everything visible() needs, nothing else.
struct MaskSpec {
  int64_t q_len = 0;
  int64_t kv_len = 0;  // this batch entry's kv length (kv_lens[b] when given)
  CausalAlign causal = CausalAlign::None;
  int64_t left = -1;   // -1 = unbounded
  int64_t right = -1;  // -1 = unbounded

  // Row i's diagonal: the key position it is aligned with (ALiBi's distances count from it too).
  ATTN_HD int64_t pos(int64_t i) const { return i + (causal == CausalAlign::TopLeft ? 0 : kv_len - q_len); }

  ATTN_HD Interval row(int64_t i) const {
    int64_t r = right;
    if (causal != CausalAlign::None) r = 0;  // causal == window right bound 0
    // Compared, never summed with the bounds: any bound up to INT64_MAX is safe (a bound
    // past the last key means unbounded).
    const int64_t diag = pos(i);
    Interval iv;
    iv.hi = r < 0 || r >= kv_len - diag - 1 ? kv_len : diag + r + 1;
    iv.lo = left < 0 || left >= diag ? 0 : diag - left;
    if (iv.hi < 0) iv.hi = 0;
    if (iv.lo > iv.hi) iv.lo = iv.hi;  // canonical empty interval
    return iv;
  }

  // Smallest interval holding every visible key of rows [i0, i1). Visible intervals move
  // monotonically with i and overlap or touch, so their union is one interval; a key tile
  // outside it can be skipped for the whole row block.
  ATTN_HD Interval rows(int64_t i0, int64_t i1) const {
    Interval u{0, 0};
    bool any = false;
    for (int64_t i = i0; i < i1; ++i) {
      const Interval iv = row(i);
      if (iv.empty()) continue;
      if (!any) {
        u = iv;
        any = true;
      } else {
        u.lo = iv.lo < u.lo ? iv.lo : u.lo;
        u.hi = iv.hi > u.hi ? iv.hi : u.hi;
      }
    }
    return u;
  }
};

// One entry of a sparse pattern's block map (include/attnlab/pattern.hpp): a 64-key tile a
// query tile sees. Here, with the interval rule, because CUDA device code reads it too.
struct BlockEntry {
  int64_t key_tile;  // keys [key_tile * 64, +64)
  int64_t words;     // -1: every row sees every key of the tile; else the offset of its
                     // R = G * br words (G for a solo tile; bit k: key key_tile * 64 + k)
                     // in the map's bits
};

// The block-map variant of (b, kv head) when the map differs per batch entry (vb > 1) and/or
// per kv head (vh > 1): BlockMap::variant, and the CUDA kernels' view of it.
ATTN_HD int64_t block_variant(int64_t vb, int64_t vh, int64_t b, int64_t hk) {
  return (vb == 1 ? 0 : b) * vh + (vh == 1 ? 0 : hk);
}

}  // namespace attnlab
