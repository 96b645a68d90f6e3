// The `simd` kernel's unit of work, shared with `threaded` (defined in src/cpu/kernels/simd.cpp).
// (flash and decode use the packed tile engine instead: src/cpu/simd/tiles.hpp.)
//
// attend_rows: up to kRowBlock query rows that share one K/V head, against the keys of a
// key range, with the online softmax; it leaves the UNNORMALIZED state per row in scratch
// (accumulator, running max in log2 units, running sum), so a caller can either normalize
// it (attend_row_block) or merge it exactly with the states of other key ranges.
// Its result depends only on its arguments - never on the thread that runs it or on what
// ran before - so any schedule of calls gives bitwise identical outputs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab::ATTN_TARGET_NS::simd {

inline constexpr int64_t kRowBlock = 32;  // query rows per call (Br)
inline constexpr int64_t kKeyTile = 64;   // keys per score tile (Bc)

// One K/V head: row j of K at k + j * k_stride (head_dim contiguous elements of E: float,
// bf16 or f16, widened exactly where loaded), same for V.
template <class E>
struct KvHead {
  const E* k;
  int64_t k_stride;
  const E* v;
  int64_t v_stride;
};

// Per-row state after attend_rows, for rows r < rows (include/attnlab/blocks/online_softmax.hpp):
//   O_unnormalized(r) = acc + r * acc_stride   (head_dim floats, then zero padding)
//   m[r] = max visible score * log2(e)  (-inf if the row saw no key of the range, or only
//          scores of -inf; NaN scores may or may not show in m)
//   l[r] = sum over visible keys of 2^(score * log2(e) - subtrahend(m[r]))  (0 if none;
//          NaN if a visible score was NaN or +inf)
// so O = acc / l and LSE = (m + log2(l)) * ln 2 over that key range. Whether the row saw a
// key of the range is its interval's business (visible[r] ∩ keys), never m's or l's.
struct RowState {
  const float* acc;
  int64_t acc_stride;
  const float* m;
  const float* l;
};

// Scratch one call needs (a 64-byte multiple; pass it 64-byte aligned).
size_t row_block_scratch_bytes(const Problem& p);

// q[r]: query row r (head_dim elements); visible[r]: its visible key interval. Only keys
// in keys ∩ visible[r] are used; rows <= kRowBlock. Returns views into scratch.
// (Instantiated in src/cpu/kernels/simd.cpp for float, bf16 and f16.)
template <class E>
// mods: the rows' score modifications (Problem::score_mod; natural units), or nullptr for none; the
// sink logits are the caller's finish (online_softmax::finish).
RowState attend_rows(const Problem& p, int64_t rows, const E* const* q, const Interval* visible, const KvHead<E>& kv,
                     Interval keys, std::byte* scratch, const ScoreMod* mods = nullptr);

// O rows [i0, min(i0 + kRowBlock, q_len)) of (b, h), and their LSE when out.lse is set.
void attend_row_block(const Problem& p, const Inputs& in, const Outputs& out, int64_t b, int64_t h, int64_t i0,
                      std::byte* scratch);

}  // namespace attnlab::ATTN_TARGET_NS::simd
