// A KV cache a caller owns, written and read by the lab's own row rule (cache.hpp): what a
// runtime holding the lab's cache layouts does per token (attnlab.hf.LabCache appends each step's
// K and V here and hands the same memory to attention() as stored, read in place).
#include "python/cache.hpp"

#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attnlab/kv_quant.hpp"
#include "attnlab/kv_summary.hpp"
#include "attnlab/tensor.hpp"
#include "python/call.hpp"

namespace attnlab::python {

namespace {

std::string n(int64_t x) { return std::to_string(x); }

// The cache's rows as bytes (View4::dim = a row's bytes) and where row (b, h, j) lives: the
// contiguous (batch, kv_heads, capacity, row) array, or a pool (blocks, kv_heads, block, row)
// through block_table (bshd: sequence before heads in both).
struct Rows {
  View4<const std::byte> view;
  KvPages pages;
  std::shared_ptr<Py_buffer> table;  // held while the rows are used
  int64_t batch = 0, heads = 0, capacity = 0, dim = 0;
  KvDType kv = KvDType::Same;
  DType dtype = DType::F32;
};

int64_t cache_row_bytes(KvDType t, int64_t dim) {
  if (t == KvDType::Same) {
    throw py::value_error(
        "kv_dtype: \"dtype\" has no row layout of its own; allowed: q8_0, q4_0, u8, u4, fp8_e4m3, "
        "fp8_e5m2");
  }
  if (dim < 1 || dim % kv_block_values(t) != 0) {
    throw py::value_error("dim: " + n(dim) + "; allowed: a multiple of " + n(kv_block_values(t)) + " for " +
                          to_string(t) + " (its blocks of values)");
  }
  return kv_row_bytes(t, dim);
}

// The values in a quantized row of `bytes` (read_kv without dim=): the one count whose row takes them.
int64_t values_of_row(KvDType t, int64_t bytes) {
  std::vector<int64_t> dims;
  for (int64_t d = Problem::kMinHeadDim; d <= Problem::kMaxHeadDim; ++d) {
    if (d % kv_block_values(t) == 0 && kv_row_bytes(t, d) == bytes) dims.push_back(d);
  }
  if (dims.size() == 1) return dims[0];
  std::string names;
  for (int64_t d : dims) names += (names.empty() ? "" : " or ") + n(d);
  throw py::value_error("cache: rows of " + n(bytes) + " bytes are " +
                        (dims.empty() ? "no " + std::string(to_string(t)) + " row" : "a row of " + names + " values") +
                        "; allowed: dim= naming the values per row (" + n(Problem::kMinHeadDim) + ".." +
                        n(Problem::kMaxHeadDim) + ")");
}

// The cache argument: a float array (a float cache, its dtype the storage's) or uint8 rows of
// kv_dtype's layout; `dim` the values per row (0: found from the row's bytes).
Rows rows_of(const Arr& c, const std::optional<std::string>& kv_dtype, const py::object& block_table, Layout layout,
             int64_t dim) {
  Rows r;
  r.kv = kv_dtype ? parse_kv_dtype(*kv_dtype) : KvDType::Same;
  if (r.kv == KvDType::Same && c.bytes) {
    throw py::type_error(
        "cache: uint8 rows without kv_dtype; allowed: kv_dtype=\"q8_0\", \"q4_0\", \"u8\", \"u4\", \"fp8_e4m3\" or "
        "\"fp8_e5m2\" naming their layout, or a float32 / bfloat16 / float16 cache");
  }
  if (r.kv != KvDType::Same && !c.bytes) {
    throw py::type_error("cache: float data with kv_dtype=\"" + *kv_dtype +
                         "\"; allowed: uint8 rows (the quantized layout's bytes), or no kv_dtype for a float cache");
  }
  r.dtype = c.dtype;
  const bool bhsd = layout == Layout::BHSD;
  const int64_t outer = c.shape[0], heads = bhsd ? c.shape[1] : c.shape[2], seq = bhsd ? c.shape[2] : c.shape[1],
                width = c.shape[3];
  const int64_t row_bytes = r.kv == KvDType::Same ? width * dtype_bytes(c.dtype) : width;
  if (r.kv != KvDType::Same) {
    if (dim == 0) dim = values_of_row(r.kv, width);
    if (cache_row_bytes(r.kv, dim) != width) {
      throw py::value_error("cache: rows of " + n(width) + " bytes; allowed: " + n(cache_row_bytes(r.kv, dim)) +
                            " (a " + *kv_dtype + " row of " + n(dim) + " values, the rows' last dimension)");
    }
  } else {
    if (dim != 0 && dim != width) {
      throw py::value_error("cache: rows of " + n(width) + " values; allowed: " + n(dim) +
                            " (the rows' last dimension)");
    }
    dim = width;
  }
  r.dim = dim, r.heads = heads;
  r.view = make_view(static_cast<const std::byte*>(c.data), outer, heads, seq, row_bytes, layout);
  if (block_table.is_none()) {
    r.batch = outer, r.capacity = seq;
    return r;
  }
  r.table = block_table_of(block_table, -1);
  const std::vector<int64_t> shape(r.table->shape, r.table->shape + r.table->ndim);
  r.batch = shape[0];
  r.pages = KvPages{static_cast<const int32_t*>(r.table->buf), shape[1], seq, outer};
  r.capacity = shape[1] * seq;
  return r;
}

// Rows [start, start + len) of every sequence must have a place: within the capacity, and (paged)
// a block of the pool in each table entry they use.
void check_span(const Rows& r, int64_t start, int64_t len, const char* what) {
  if (start < 0 || len < 0 || start + len > r.capacity) {
    throw py::value_error("start: rows [" + n(start) + ", " + n(start + len) + ") " + what + "; allowed: within [0, " +
                          n(r.capacity) + ") (" +
                          (r.pages.table ? "the block table's entries x block" : "the cache's capacity") + ")");
  }
  if (!r.pages.table || len == 0) return;
  for (int64_t b = 0; b < r.batch; ++b) {
    for (int64_t e = start / r.pages.block; e <= (start + len - 1) / r.pages.block; ++e) {
      const int32_t id = r.pages.table[b * r.pages.table_len + e];
      if (id < 0 || id >= r.pages.pool_blocks) {
        throw py::value_error("block_table[" + n(b) + "][" + n(e) + "]: " + n(id) +
                              "; allowed: a block of the pool, 0.." + n(r.pages.pool_blocks - 1) + " (rows " +
                              n(e * r.pages.block) + ".. of sequence " + n(b) + " are " + what + ")");
      }
    }
  }
}

}  // namespace

int64_t cache_row_bytes(const std::string& kv_dtype, int64_t dim) {
  return cache_row_bytes(parse_kv_dtype(kv_dtype), dim);
}

void write_kv(const py::handle& cache, const py::handle& rows, int64_t start,
              const std::optional<std::string>& kv_dtype, const py::object& block_table, const std::string& layout_name,
              const py::object& summary) {
  const Layout layout = parse_layout(layout_name);
  const Arr c = as_input(cache, "cache", std::nullopt, layout);
  if (c.read_only) {
    throw py::value_error("cache: read-only memory (" + type_name(cache) +
                          "); allowed: a writable array (numpy, torch) the rows are stored into");
  }
  const Arr x = as_input(rows, "rows", std::nullopt, layout);
  if (x.bytes || x.dtype != DType::F32) {
    throw py::type_error("rows: " + std::string(x.bytes ? "uint8" : to_string(x.dtype)) +
                         " data; allowed: float32 (the values to store; x.float() in torch)");
  }
  const bool bhsd = layout == Layout::BHSD;
  const int64_t batch = x.shape[0], heads = bhsd ? x.shape[1] : x.shape[2], len = bhsd ? x.shape[2] : x.shape[1],
                dim = x.shape[3];
  const Rows r = rows_of(c, kv_dtype, block_table, layout, dim);
  if (r.batch != batch || r.heads != heads) {
    throw py::value_error("rows: " + n(batch) + " sequences x " + n(heads) + " kv heads; allowed: the cache's " +
                          n(r.batch) + " x " + n(r.heads) +
                          (r.pages.table ? " (the block table's rows x the pool's heads)" : ""));
  }
  check_span(r, start, len, "written");
  std::optional<std::pair<KvSummary, std::shared_ptr<Py_buffer>>> s;
  if (!summary.is_none()) {
    s = summary_of(summary, batch, heads, dim, true);
    if (summary_pages(start + len) > s->first.pages) {
      throw py::value_error("summary: " + n(s->first.pages) + " pages of 64 rows; allowed: at least " +
                            n(summary_pages(start + len)) + " (rows up to " + n(start + len) +
                            " are written; new_kv_summary(batch, kv_heads, capacity, dim) for the cache's capacity)");
    }
  }
  const ConstView src = make_view(static_cast<const float*>(x.data), batch, heads, len, dim, layout);
  py::gil_scoped_release unlocked;
  std::vector<float> back(static_cast<size_t>(dim));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < len; ++j) {
        std::byte* row = const_cast<std::byte*>(kv_row(r.view, r.pages, b, h, start + j));
        store_row(r.kv, r.dtype, src.row(b, h, j), dim, row);
        if (s) {  // the row as the kernels will read it
          load_row(r.kv, r.dtype, row, dim, back.data());
          summary_add_key(s->first, b, h, start + j, back.data());
        }
      }
}

py::object new_kv_summary(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t dim) {
  if (batch < 1 || kv_heads < 1 || capacity < 0 || dim < 1) {
    throw py::value_error("new_kv_summary: batch " + n(batch) + ", kv_heads " + n(kv_heads) + ", capacity " +
                          n(capacity) + ", dim " + n(dim) + "; allowed: batch, kv_heads, dim >= 1, capacity >= 0");
  }
  const int64_t pages = summary_stored_pages(capacity);
  const auto [out, data] = new_output({batch, kv_heads, pages / kSummaryBlockPages, 2, dim, kSummaryBlockPages});
  KvSummary s;
  s.batch = batch, s.kv_heads = kv_heads, s.pages = pages, s.dim = dim, s.external = data;
  clear_summary(s);
  return out;
}

py::object read_kv(const py::handle& cache, const std::optional<std::string>& kv_dtype,
                   const std::optional<int64_t>& length, const py::object& block_table, const std::string& layout_name,
                   const std::optional<int64_t>& dim) {
  const Layout layout = parse_layout(layout_name);
  const Arr c = as_input(cache, "cache", std::nullopt, layout);
  const Rows r = rows_of(c, kv_dtype, block_table, layout, dim.value_or(0));
  const int64_t len = length.value_or(r.capacity);
  check_span(r, 0, len, "read");
  const bool bhsd = layout == Layout::BHSD;
  const auto [out, data] = new_output(bhsd ? std::vector<int64_t>{r.batch, r.heads, len, r.dim}
                                           : std::vector<int64_t>{r.batch, len, r.heads, r.dim});
  const MutView dst = make_view(data, r.batch, r.heads, len, r.dim, layout);
  {
    py::gil_scoped_release unlocked;
    for (int64_t b = 0; b < r.batch; ++b)
      for (int64_t h = 0; h < r.heads; ++h)
        for (int64_t j = 0; j < len; ++j)
          load_row(r.kv, r.dtype, kv_row(r.view, r.pages, b, h, j), r.dim, dst.row(b, h, j));
  }
  return to_library(out, c.library);
}

}  // namespace attnlab::python
