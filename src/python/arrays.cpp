// The checks both input doors share, the choice of door, and the outputs (arrays.hpp).
#include "python/arrays.hpp"

#include "attnlab/dtype.hpp"

namespace attnlab::python {

std::string type_name(const py::handle& obj) {
  const py::handle t = py::type::of(obj);
  return std::string(py::str(t.attr("__module__"))) + "." + std::string(py::str(t.attr("__name__")));
}

// Whether `strides` (in elements; empty = compact) describe a C-contiguous array of `shape`
// (a dimension of size 1 may have any stride).
bool c_contiguous(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  if (strides.empty()) return true;
  int64_t want = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != want) return false;
    want *= shape[i];
  }
  return true;
}

// The checks both ways in share: 4 dimensions, C order, the dtype= argument.
void check_array(const char* name, const std::vector<int64_t>& shape, bool contiguous, Layout layout, Arr& r,
                 const std::optional<std::string>& dtype, const std::string& seen) {
  check_array_shape(name, shape, layout);  // (the CLI's rule for .npy files too: InvalidInput -> ValueError)
  if (!contiguous) {
    throw py::value_error(std::string(name) +
                          ": not C-contiguous; allowed: a C-contiguous array (np.ascontiguousarray(x), "
                          "x.contiguous() in torch: the module reads arrays in place and never copies)");
  }
  if (dtype && !r.bytes && *dtype != to_string(r.dtype)) {
    throw py::type_error(std::string(name) + ": dtype=\"" + *dtype + "\" given for " + seen +
                         " data; allowed: float32 for \"f32\", float16 for \"f16\", bfloat16 (or uint16 "
                         "bits) for \"bf16\"");
  }
  for (int i = 0; i < 4; ++i) r.shape[i] = shape[i];
}

extern const char* const kAllowedDtypes;
const char* const kAllowedDtypes =
    "; allowed: float32, float16, bfloat16 (torch, jax) or uint16 bfloat16 bits with dtype=\"bf16\" "
    "(convert with x.astype(np.float32) / x.float())";

Arr as_input(const py::handle& obj, const char* name, const std::optional<std::string>& dtype, Layout layout) {
  // numpy arrays by the buffer protocol (it also takes read-only arrays, which numpy's
  // __dlpack__ refuses before numpy 2.1); everything else with __dlpack__ by DLPack.
  const bool numpy = py::type::of(obj).attr("__module__").cast<std::string>() == "numpy";
  if (!numpy && py::hasattr(obj, "__dlpack__")) return from_dlpack(obj, name, dtype, layout);
  return from_buffer(obj, name, dtype, layout);
}

std::pair<py::object, float*> new_output(const std::vector<int64_t>& shape) {
  py::tuple t(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t[i] = py::int_(shape[i]);
  py::object a = py::module_::import("numpy").attr("empty")(t, py::arg("dtype") = "float32");
  Py_buffer view{};
  if (PyObject_GetBuffer(a.ptr(), &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) throw py::error_already_set();
  auto* data = static_cast<float*>(view.buf);
  PyBuffer_Release(&view);  // `a` keeps the memory
  return {a, data};
}

py::object to_library(const py::object& a, const std::string& library) {
  if (library == "torch") return py::module_::import("torch").attr("from_dlpack")(a);
  if (library == "jax" || library == "jaxlib") return py::module_::import("jax.numpy").attr("from_dlpack")(a);
  return a;
}

}  // namespace attnlab::python
