// The Python module's input and output arrays (module.cpp): every input read in place, by the
// buffer protocol (numpy, buffers.cpp) or DLPack (torch, JAX, dlpack.cpp), with the checks both
// doors share (arrays.cpp); outputs made as numpy arrays and handed back in the inputs' library.
#pragma once

#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attnlab/problem.hpp"

namespace attnlab::python {

namespace py = pybind11;

// One input array, as the lab sees it: its memory (not copied), storage dtype and 4 sizes, and
// the buffer view or DLPack tensor that keeps that memory alive until the call ends (released
// with the GIL held: every Call outlives its gil_scoped_release).
struct Arr {
  const void* data = nullptr;
  DType dtype = DType::F32;
  bool bytes = false;      // uint8: a quantized cache's rows as stored (k and v only; dtype unused)
  bool read_only = false;  // a read-only buffer, or a JAX array (immutable): never written (write_kv)
  std::array<int64_t, 4> shape{};
  std::shared_ptr<void> hold;
  std::string library = "numpy";  // the module of the object's type: where outputs go back
};

// "torch.Tensor": the type's module and name, for messages.
std::string type_name(const py::handle& obj);

// An input by whichever door its object has (numpy arrays by the buffer protocol, anything else
// with __dlpack__ by DLPack); TypeError / ValueError naming `name` and what is allowed.
Arr as_input(const py::handle& obj, const char* name, const std::optional<std::string>& dtype, Layout layout);
Arr from_dlpack(const py::handle& obj, const char* name, const std::optional<std::string>& dtype, Layout layout);
Arr from_buffer(const py::handle& obj, const char* name, const std::optional<std::string>& dtype, Layout layout);

// The checks both doors share: 4 dimensions, C order (c_contiguous), the dtype= argument.
bool c_contiguous(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides);
void check_array(const char* name, const std::vector<int64_t>& shape, bool contiguous, Layout layout, Arr& r,
                 const std::optional<std::string>& dtype, const std::string& seen);
extern const char* const kAllowedDtypes;

// A new float32 array of `shape` for an output, made by numpy's Python API (no C-API: any
// numpy), and its memory.
std::pair<py::object, float*> new_output(const std::vector<int64_t>& shape);
// An output in the library the inputs came from: a torch tensor for torch inputs, a JAX array
// for JAX's (both by DLPack from the numpy array: torch shares its memory; JAX may copy where
// it cannot alias), else the numpy array itself.
py::object to_library(const py::object& a, const std::string& library);

}  // namespace attnlab::python
