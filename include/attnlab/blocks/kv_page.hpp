// Where row j of sequence b lives in a paged KV cache (Problem::kv_block): block
// table[b * table_len + j / block] of the pool, slot j % block in it. The one rule, host and CUDA
// device code: tensor.hpp's kv_row (the CPU kernels) and the CUDA decode (src/cuda/args.hpp) call it.
#pragma once

#include <cstdint>

#include "attnlab/blocks/interval.hpp"  // ATTN_HD

namespace attnlab {

struct PageSlot {
  int64_t block, slot;
};

ATTN_HD PageSlot page_slot(const int32_t* table, int64_t table_len, int64_t block, int64_t b, int64_t j) {
  return {table[b * table_len + j / block], j % block};
}

}  // namespace attnlab
