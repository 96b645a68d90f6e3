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
#include "python/arrays.hpp"

namespace attnlab::python {

// The problem Q, K, V describe, with the mask arguments; validated (InvalidInput -> ValueError).
struct Call {
  Problem p;
  Arr q, k, v;  // the arrays' memory, held until the call ends
  Inputs in;
  Tensors cache;                     // a quantized or paged cache (kv_dtype, kv_block), written from the K and V arrays
  std::shared_ptr<Py_buffer> table;  // a block table given with k and v as a paged cache's pool
};

// block_table: an int32 (batch, entries per sequence) C-order array, read in place (held by the
// returned view); batch < 0: any. ValueError / TypeError naming what is allowed.
std::shared_ptr<Py_buffer> block_table_of(const py::handle& obj, int64_t batch);

Call make_call(const py::handle& q, const py::handle& k, const py::handle& v, const py::object& causal,
               const std::optional<std::pair<int64_t, int64_t>>& window,
               const std::optional<std::vector<int64_t>>& kv_lens, const std::optional<float>& scale,
               const std::string& layout, const std::optional<std::string>& dtype,
               const py::kwargs& settings = py::kwargs());

}  // namespace attnlab::python
