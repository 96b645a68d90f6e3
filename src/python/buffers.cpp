// Inputs through the buffer protocol (arrays.hpp): numpy arrays of any numpy version.
#include <string>

#include "python/arrays.hpp"

namespace attnlab::python {

// numpy (or any object with the buffer protocol, PEP 3118): read through the buffer's format,
// item size and strides, never through numpy's C structures, so any numpy (1.x, 2.x) works.
Arr from_buffer(const py::handle& obj, const char* name, const std::optional<std::string>& dtype, Layout layout) {
  Py_buffer got{};
  if (PyObject_GetBuffer(obj.ptr(), &got, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    throw py::type_error(std::string(name) + ": " + type_name(obj) +
                         " is neither an array with the buffer protocol (numpy) nor one with __dlpack__ "
                         "(torch, jax); allowed: a 4-D array of those");
  }
  const auto view = std::shared_ptr<Py_buffer>(new Py_buffer(got), [](Py_buffer* b) {
    PyBuffer_Release(b);
    delete b;
  });
  Arr r;
  r.hold = view;
  std::string fmt = view->format ? view->format : "B";
  if (!fmt.empty() && std::string("@=<").find(fmt[0]) != std::string::npos) fmt.erase(0, 1);  // native order
  const std::vector<int64_t> shape(view->shape, view->shape + view->ndim);
  std::vector<int64_t> strides;  // in items; a stride that is not whole items is not C order
  bool whole_items = true;
  for (int i = 0; i < view->ndim && view->strides; ++i) {
    whole_items = whole_items && view->strides[i] % view->itemsize == 0;
    strides.push_back(view->strides[i] / view->itemsize);
  }
  const std::string seen = "buffer format '" + fmt + "'";
  if (fmt == "f" && view->itemsize == 4) {
    r.dtype = DType::F32;
  } else if (fmt == "e" && view->itemsize == 2) {
    r.dtype = DType::F16;
  } else if (fmt == "H" && view->itemsize == 2 && dtype == "bf16") {
    r.dtype = DType::BF16;
  } else if (fmt == "B" && view->itemsize == 1) {
    r.bytes = true;
  } else {
    const py::object d = py::getattr(obj, "dtype", py::none());
    throw py::type_error(std::string(name) + ": dtype " + (d.is_none() ? seen : std::string(py::str(d))) +
                         " is not read in place" + kAllowedDtypes);
  }
  check_array(name, shape, whole_items && c_contiguous(shape, strides), layout, r, dtype, seen);
  r.data = view->buf;
  r.read_only = view->readonly != 0;
  return r;
}

}  // namespace attnlab::python
