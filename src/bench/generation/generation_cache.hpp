// The generation loop's KV cache (generation.cpp): the K/V rows and query rows in the storage
// dtype, written token by token as a runtime writes them, contiguous or paged (blocks handed out
// as tokens arrive, never adjacent or in order, the block table growing with them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnlab/kernel.hpp"
#include "attnlab/kv_quant.hpp"
#include "attnlab/kv_summary.hpp"
#include "attnlab/tensor.hpp"
#include "bench/generation/generation.hpp"

namespace attnlab::bench {

// The cache and the query rows in the storage dtype, as raw bytes. K and V are one row per
// (kv head, token) - contiguous: kv_heads x C rows; paged (kv_block B): a pool of ceil(C / B)
// blocks of kv_heads x B rows, handed out as tokens arrive (a block when the sequence's last one
// is full, from the pool in scattered_pool_order: never adjacent or in order), the sequence's
// block table growing with them, as a paged runtime's block manager does. kv_shared: V is the
// first head_dim_v columns of K's rows (no V rows are written). A query-aware sparse decode
// (Problem::topk) also keeps K's page summaries, each appended row folded in as it is stored
// (kv_summary.hpp's summary_add_key, on the row read back as the kernels read it): part of the
// append's time, as it is a runtime's.
struct Cache {
  GenerationConfig c;
  int64_t rows;          // cache capacity C
  int64_t block;         // tokens per block (paged), else C: one "block" per kv head
  int64_t blocks;        // blocks in the pool (1 when contiguous)
  int64_t q_rows;        // query rows per head held: the prefilled prompt's, or one token's
  int64_t k_row, v_row;  // bytes of a stored K / V row
  size_t k_bytes, v_bytes, q_bytes;
  std::vector<int32_t> order, table;  // the pool's blocks in hand-out order; the sequence's blocks
  std::unique_ptr<std::byte[], AlignedFree> k, v, q;
  KvSummary summary;             // (topk only)
  std::vector<float> read_back;  // a stored K row as the kernels read it
  explicit Cache(const GenerationConfig& cfg)
      : c(cfg),
        rows(cfg.cache_rows()),
        block(cfg.head.kv_paged() ? cfg.head.kv_block : rows),
        blocks((rows + block - 1) / block),
        q_rows(std::max<int64_t>(1, std::min(cfg.prompt, cfg.prefill_max_tokens))),
        k_row(c.head.kv_row_bytes(c.head.head_dim)),
        v_row(c.head.kv_row_bytes(c.head.dim_v())),
        k_bytes(static_cast<size_t>(blocks * c.head.kv_heads * block * k_row)),
        v_bytes(c.head.kv_shared ? 0 : static_cast<size_t>(blocks * c.head.kv_heads * block * v_row)),
        q_bytes(static_cast<size_t>(c.head.q_heads * q_rows * c.head.head_dim * dtype_bytes(c.head.dtype))) {
    if (c.head.kv_paged()) order = scattered_pool_order(blocks), table.reserve(static_cast<size_t>(blocks));
  }
  size_t bytes() const { return k_bytes + v_bytes + q_bytes + summary_bytes(); }
  size_t summary_bytes() const {
    return c.head.topk()
               ? static_cast<size_t>(c.head.kv_heads * summary_stored_pages(rows) * 2 * c.head.head_dim) * sizeof(float)
               : 0;
  }
  void allocate() {
    k = alloc_bytes(k_bytes), q = alloc_bytes(q_bytes);
    if (v_bytes) v = alloc_bytes(v_bytes);
    if (c.head.topk()) {
      Problem whole = c.head;
      whole.batch = 1, whole.kv_len = rows;
      summary = make_summary(whole);
      read_back.resize(static_cast<size_t>(c.head.head_dim));
    }
  }
  // K's or V's rows as a byte view: (blocks, kv heads, block, row bytes).
  View4<std::byte> rows_of(bool value) const {
    const int64_t rb = value ? v_row : k_row;
    std::byte* base = value && !c.head.kv_shared ? v.get() : k.get();
    return {base, blocks, c.head.kv_heads, block, rb, c.head.kv_heads * block * rb, block * rb, rb};
  }
  // The sequence's first `len` keys' blocks (kv_row's table; none when contiguous).
  KvPages pages(int64_t len) const {
    if (!c.head.kv_paged()) return {};
    return {table.data(), (len + block - 1) / block, block, blocks};
  }
  // n floats stored at `at`: converted to the storage dtype, or written into a quantized cache
  // row by its layout's rule (kv_quant.hpp), as a runtime appends a token.
  void put(std::byte* at, const float* x, int64_t n, bool kv_row) const {
    store_row(kv_row ? c.head.kv_dtype : KvDType::Same, c.head.dtype, x, n, at);
  }
  // Token j of kv head h (tokens arrive in order; a new block is taken when j starts one).
  void put_kv(int64_t h, int64_t j, const float* kx, const float* vx) {
    if (c.head.kv_paged() && j / block == static_cast<int64_t>(table.size())) table.push_back(order[table.size()]);
    const KvPages pg = pages(j + 1);
    std::byte* k_at = kv_row(rows_of(false), pg, 0, h, j);
    put(k_at, kx, c.head.head_dim, true);
    if (c.head.topk()) {
      load_row(c.head.kv_dtype, c.head.dtype, k_at, c.head.head_dim, read_back.data());
      summary_add_key(summary, 0, h, j, read_back.data());
    }
    if (!c.head.kv_shared) put(kv_row(rows_of(true), pg, 0, h, j), vx, c.head.dim_v(), true);
  }
  void put_q(int64_t h, int64_t i, int64_t q_len, const float* qx) {
    put(q.get() + (h * q_len + i) * c.head.head_dim * dtype_bytes(c.head.dtype), qx, c.head.head_dim, false);
  }
  // Q (q_len rows per head, BHSD) and the first `len` keys of the cache.
  Inputs inputs(int64_t q_len, int64_t len) const {
    // A contiguous cache's views see `len` of each head's C rows; a paged one the whole pool.
    const int64_t outer = c.head.kv_paged() ? blocks : 1, seq = c.head.kv_paged() ? block : len;
    const auto elems = [&](bool value, int64_t dim) {
      const View4<std::byte> r = rows_of(value);
      const int64_t e = dtype_bytes(c.head.dtype);
      return View4<const void>{r.data, outer, r.heads, seq, dim, r.stride_b / e, r.stride_h / e, r.stride_s / e};
    };
    const View4<const void> qv{q.get(),
                               1,
                               c.head.q_heads,
                               q_len,
                               c.head.head_dim,
                               c.head.q_heads * q_len * c.head.head_dim,
                               q_len * c.head.head_dim,
                               c.head.head_dim};
    Inputs in;
    if (!c.head.kv_quantized()) {
      in = inputs_over(c.head.dtype, qv, elems(false, c.head.head_dim), elems(true, c.head.dim_v()));
    } else {  // Q float32, K and V rows of bytes (View4::dim = a row's bytes)
      const View4<const void> none{nullptr, outer, c.head.kv_heads, seq, 1, 0, 0, 0};
      in = inputs_over(DType::F32, qv, none, none);
      const auto bytes = [&](bool value) {
        const View4<std::byte> r = rows_of(value);
        return View4<const std::byte>{r.data, outer, r.heads, seq, r.dim, r.stride_b, r.stride_h, r.stride_s};
      };
      in.kv = c.head.kv_dtype;
      in.kq = bytes(false);
      in.vq = bytes(true);
    }
    if (c.head.kv_shared) share_v_with_k(c.head, in);
    in.pages = pages(len);
    if (c.head.topk()) in.summary = &summary;
    return in;
  }
};

}  // namespace attnlab::bench
