// The `simd` kernel's unit of work, shared with `threaded`: one block of query rows of one
// (batch, query head) against all keys it can see. The result of a block depends only on
// (b, h, i0), never on which thread runs it or in which order blocks run, so any schedule
// over blocks gives bitwise identical outputs. Defined in src/cpu/simd.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab::simd {

inline constexpr int64_t kRowBlock = 32;  // query rows per block (Br)
inline constexpr int64_t kKeyTile = 64;   // keys per score tile (Bc)

// Scratch one call of attend_row_block needs (64-byte multiple; pass 64-byte aligned).
size_t row_block_scratch_bytes(const Problem& p);

// O rows [i0, min(i0 + kRowBlock, q_len)) of (b, h), and their LSE when out.lse is set.
// scratch: row_block_scratch_bytes(p) bytes, 64-byte aligned, owned by the caller's thread.
void attend_row_block(const Problem& p, const Inputs& in, const Outputs& out, int64_t b,
                      int64_t h, int64_t i0, std::byte* scratch);

}  // namespace attnlab::simd
