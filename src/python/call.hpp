// One call's problem, built from the Python arguments (module.cpp): the arrays' sizes (core's
// array-to-Problem rule), the mask arguments, and every setting and mask axis of the point
// schema as a keyword.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attnlab/kernel.hpp"
#include "attnlab/kv_summary.hpp"
#include "python/arrays.hpp"

namespace attnlab::python {

// The problem Q, K, V describe, with the mask arguments; validated (InvalidInput -> ValueError).
struct Call {
  Problem p;
  Arr q, k, v;  // the arrays' memory, held until the call ends
  Inputs in;
  Tensors cache;                     // a quantized or paged cache (kv_dtype, kv_block), written from the K and V arrays
                                     // (and a topk problem's page summaries: kv_summary's view, or read from K)
  std::shared_ptr<Py_buffer> table;  // a block table given with k and v as a paged cache's pool
  std::shared_ptr<Py_buffer> summary_buffer;  // kv_summary's memory, read in place
};

// block_table: an int32 (batch, entries per sequence) C-order array, read in place (held by the
// returned view); batch < 0: any. ValueError / TypeError naming what is allowed.
std::shared_ptr<Py_buffer> block_table_of(const py::handle& obj, int64_t batch);

// kv_summary: page summaries (kv_summary.hpp's layout: a C-contiguous float32 array (batch, kv_heads, blocks, 2,
// head_dim, 16), new_kv_summary makes one), viewed in place (the returned buffer holds it); writable for write_kv.
// ValueError / TypeError naming what is allowed.
std::pair<KvSummary, std::shared_ptr<Py_buffer>> summary_of(const py::handle& obj, int64_t batch, int64_t kv_heads,
                                                            int64_t dim, bool writable);

Call make_call(const py::handle& q, const py::handle& k, const py::handle& v, const py::object& causal,
               const std::optional<std::pair<int64_t, int64_t>>& window,
               const std::optional<std::vector<int64_t>>& kv_lens, const std::optional<float>& scale,
               const std::string& layout, const std::optional<std::string>& dtype,
               const py::kwargs& settings = py::kwargs());

}  // namespace attnlab::python
