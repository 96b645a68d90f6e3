// Inputs through DLPack (arrays.hpp): torch, JAX and any object with __dlpack__, CPU memory only.
#include <cstring>

#include "python/arrays.hpp"

namespace attnlab::python {

namespace {

// DLPack's C structures (dmlc/dlpack's dlpack.h, the unversioned "dltensor" capsule every
// array library hands out from __dlpack__()); stable ABI, spelled here to need no header.
struct DLDevice {
  int32_t device_type;  // 1 = kDLCPU
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null = C-contiguous
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

}  // namespace

// An array library's object through DLPack (__dlpack__: torch, jax, cupy, ...): CPU memory only.
Arr from_dlpack(const py::handle& obj, const char* name, const std::optional<std::string>& dtype, Layout layout) {
  py::object cap;
  try {
    cap = obj.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    throw py::type_error(std::string(name) + ": " + type_name(obj) + ".__dlpack__() failed: " +
                         std::string(py::str(e.type().attr("__name__"))) + ": " + std::string(py::str(e.value())) +
                         " (a torch tensor that requires grad: pass x.detach(), or attnlab.torch.attention for "
                         "gradients)");
  }
  auto* mt = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), "dltensor"));
  if (!mt) throw py::error_already_set();
  PyCapsule_SetName(cap.ptr(), "used_dltensor");  // ours now: the capsule no longer frees it
  Arr r;
  r.hold = std::shared_ptr<void>(mt, [](void* x) {
    auto* t = static_cast<DLManagedTensor*>(x);
    if (t->deleter) t->deleter(t);
  });
  r.library = py::str(py::type::of(obj).attr("__module__")).cast<std::string>();
  r.library = r.library.substr(0, r.library.find('.'));
  const DLTensor& t = mt->dl_tensor;
  if (t.device.device_type != 1) {
    throw py::value_error(std::string(name) + ": on device type " + std::to_string(t.device.device_type) +
                          " (DLPack); allowed: CPU memory (x.cpu() in torch)");
  }
  const std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
  const std::vector<int64_t> strides =
      t.strides ? std::vector<int64_t>(t.strides, t.strides + t.ndim) : std::vector<int64_t>{};
  const std::string seen = "DLPack code " + std::to_string(t.dtype.code) + " bits " + std::to_string(t.dtype.bits);
  if (t.dtype.lanes == 1 && t.dtype.code == 2 && t.dtype.bits == 32) {
    r.dtype = DType::F32;
  } else if (t.dtype.lanes == 1 && t.dtype.code == 2 && t.dtype.bits == 16) {
    r.dtype = DType::F16;
  } else if (t.dtype.lanes == 1 && ((t.dtype.code == 4 && t.dtype.bits == 16) ||
                                    (t.dtype.code == 1 && t.dtype.bits == 16 && dtype == "bf16"))) {
    r.dtype = DType::BF16;
  } else if (t.dtype.lanes == 1 && t.dtype.code == 1 && t.dtype.bits == 8) {
    r.bytes = true;
  } else {
    throw py::type_error(std::string(name) + ": " + type_name(obj) + " with " + seen + " is not read in place" +
                         kAllowedDtypes);
  }
  check_array(name, shape, c_contiguous(shape, strides), layout, r, dtype, seen);
  r.data = static_cast<const char*>(t.data) + t.byte_offset;
  r.read_only = r.library == "jax" || r.library == "jaxlib";  // (unversioned DLPack has no read-only flag)
  return r;
}

}  // namespace attnlab::python
