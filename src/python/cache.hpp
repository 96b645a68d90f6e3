// A KV cache the caller owns (a numpy array or torch tensor), written and read row by row by the
// lab's rule for its layout (store_row / load_row, kv_quant.hpp): the module's write_kv and
// read_kv. The same memory goes to attention() as stored (uint8 rows with kv_dtype, or float
// rows; block_table for a pool) and is read there in place.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>
#include <string>

#include "python/arrays.hpp"

namespace attnlab::python {

// rows (float32, (batch, kv_heads, n, dim); bshd: (batch, n, kv_heads, dim)) stored at positions
// [start, start + n) of every sequence of `cache`: a contiguous (batch, kv_heads, capacity, row)
// array, or with block_table (int32 (batch, entries)) a pool (blocks, kv_heads, block, row) where
// sequence b's row j lives in block block_table[b][j // block]. kv_dtype names a quantized
// layout (cache: uint8 rows of its bytes); none: a float cache, rows rounded to its dtype.
// summary: the cache's page summaries (call.hpp's summary_of; new_kv_summary), each stored row folded
// into its page as the cache reads it back (kv_summary.hpp's summary_add_key): a query-aware sparse
// decode's (attention(..., topk_tokens=N, kv_summary=summary)) ranks kept current without a pass over
// the cache. A row written over an older one widens its page's extent (a looser bound, never a wrong one).
void write_kv(const py::handle& cache, const py::handle& rows, int64_t start,
              const std::optional<std::string>& kv_dtype, const py::object& block_table, const std::string& layout,
              const py::object& summary);

// A summary for a cache of `capacity` tokens per sequence (kv_summary.hpp's layout: float32 (batch,
// kv_heads, blocks, 2, dim, 16), 16 pages of 64 keys a block, every page empty).
py::object new_kv_summary(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t dim);

// Bytes of one row of `dim` values in quantized layout `kv_dtype`; ValueError naming what is allowed.
int64_t cache_row_bytes(const std::string& kv_dtype, int64_t dim);

// The first `length` rows of every sequence (default: all the cache or table holds) as float32
// (batch, kv_heads, length, dim), by the layout's read rule; dim found from a quantized row's
// bytes unless given.
py::object read_kv(const py::handle& cache, const std::optional<std::string>& kv_dtype,
                   const std::optional<int64_t>& length, const py::object& block_table, const std::string& layout,
                   const std::optional<int64_t>& dim);

}  // namespace attnlab::python
