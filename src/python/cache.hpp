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
void write_kv(const py::handle& cache, const py::handle& rows, int64_t start,
              const std::optional<std::string>& kv_dtype, const py::object& block_table, const std::string& layout);

// Bytes of one row of `dim` values in quantized layout `kv_dtype`; ValueError naming what is allowed.
int64_t cache_row_bytes(const std::string& kv_dtype, int64_t dim);

// The first `length` rows of every sequence (default: all the cache or table holds) as float32
// (batch, kv_heads, length, dim), by the layout's read rule; dim found from a quantized row's
// bytes unless given.
py::object read_kv(const py::handle& cache, const std::optional<std::string>& kv_dtype,
                   const std::optional<int64_t>& length, const py::object& block_table, const std::string& layout,
                   const std::optional<int64_t>& dim);

}  // namespace attnlab::python
