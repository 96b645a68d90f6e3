// The Python module `attnlab` (pybind11): the kernels on numpy arrays and torch / JAX tensors,
// without copies.
//
//   import attnlab                      # pip install . (pyproject.toml), or PYTHONPATH=build/python
//   o = attnlab.attention(q, k, v, kernel="flash", causal=True)
//   o, lse = attnlab.attention(q, k, v, return_lse=True, layout="bshd", threads=2)
//   attnlab.kernels(); attnlab.verify(q, k, v, causal=True); attnlab.peak()
//
// kv_dtype="q8_0" (or another quantized cache layout) writes float32 K and V into that cache
// (a copy, the cache a runtime would hold) and runs on it; Q is read in place. A cache written
// elsewhere is given as stored: uint8 k and v whose last dimension is a row's bytes in kv_dtype's
// layout, read in place; with block_table= (int32, (batch, blocks per sequence)) k and v are a
// paged cache's pool (blocks, kv_heads, block, d), read in place through the table.
// Every setting axis of the point schema (schema/point_schema.hpp) beyond layout and dtype is
// a keyword too, taking what the experiment key takes (a new axis needs no edit here).
// Inputs are 4-D C-contiguous CPU arrays, read in place (never copied): numpy arrays through the
// buffer protocol, anything else with __dlpack__ (torch, JAX) through DLPack - never through
// numpy's C structures, so the module works with numpy 1.x and 2.x alike. float32, float16,
// bfloat16 (torch/JAX), or uint16 holding bfloat16 bits with dtype="bf16". V's last dimension is
// head_dim_v. Outputs are float32 numpy arrays (made by numpy.empty), handed back as torch
// tensors when q is one (torch.from_dlpack: the same memory) and as JAX arrays for JAX input.
// Anything else is a TypeError or ValueError naming the argument and what is allowed; the lab's
// own refusals (InvalidInput: shapes, masks, a kernel that cannot run the problem) are ValueError.
// The GIL is released while a kernel runs.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attnlab/kernel.hpp"
#include "attnlab/limits.hpp"
#include "attnlab/verify.hpp"
#include "peaks/peak.hpp"
#include "schema/point_schema.hpp"

namespace py = pybind11;
using namespace attnlab;

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

// One input array, as the lab sees it: its memory (not copied), storage dtype and 4 sizes, and
// the buffer view or DLPack tensor that keeps that memory alive until the call ends (released
// with the GIL held: every Call outlives its gil_scoped_release).
struct Arr {
  const void* data = nullptr;
  DType dtype = DType::F32;
  bool bytes = false;  // uint8: a quantized cache's rows as stored (k and v only; dtype unused)
  std::array<int64_t, 4> shape{};
  std::shared_ptr<void> hold;
  std::string library = "numpy";  // the module of the object's type: where outputs go back
};

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

const char* const kAllowedDtypes =
    "; allowed: float32, float16, bfloat16 (torch, jax) or uint16 bfloat16 bits with dtype=\"bf16\" "
    "(convert with x.astype(np.float32) / x.float())";

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
  return r;
}

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
  return r;
}

Arr as_input(const py::handle& obj, const char* name, const std::optional<std::string>& dtype, Layout layout) {
  // numpy arrays by the buffer protocol (it also takes read-only arrays, which numpy's
  // __dlpack__ refuses before numpy 2.1); everything else with __dlpack__ by DLPack.
  const bool numpy = py::type::of(obj).attr("__module__").cast<std::string>() == "numpy";
  if (!numpy && py::hasattr(obj, "__dlpack__")) return from_dlpack(obj, name, dtype, layout);
  return from_buffer(obj, name, dtype, layout);
}

// A new float32 array of `shape` for an output, made by numpy's Python API (no C-API: any
// numpy), and its memory.
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

// An output in the library the inputs came from: a torch tensor for torch inputs, a JAX array
// for JAX's (both by DLPack from the numpy array: torch shares its memory; JAX may copy where
// it cannot alias), else the numpy array itself.
py::object to_library(const py::object& a, const std::string& library) {
  if (library == "torch") return py::module_::import("torch").attr("from_dlpack")(a);
  if (library == "jax" || library == "jaxlib") return py::module_::import("jax.numpy").attr("from_dlpack")(a);
  return a;
}

// A keyword's Python value as the schema's parsers read it.
nlohmann::json json_of(const py::handle& x) {
  if (x.is_none()) return nullptr;
  if (py::isinstance<py::bool_>(x)) return x.cast<bool>();
  if (py::isinstance<py::int_>(x)) return x.cast<int64_t>();
  if (py::isinstance<py::float_>(x)) return x.cast<double>();
  if (py::isinstance<py::str>(x)) return x.cast<std::string>();
  if (py::isinstance<py::list>(x) || py::isinstance<py::tuple>(x)) {
    nlohmann::json a = nlohmann::json::array();
    for (const py::handle& e : x) a.push_back(json_of(e));
    return a;
  }
  throw py::type_error("a keyword's value must be None, bool, int, float, str or a list of them; got " +
                       std::string(py::str(py::type::of(x).attr("__name__"))));
}

// The setting and mask axes given as keywords (the sparse pattern terms: sinks, global, doc_lens,
// dilation, bigbird, mask_file; a new axis of the table is a keyword here), all but the ones
// with parameters of their own (causal, window, kv_lens, layout, dtype).
bool own_parameter(std::string_view key) {
  return key == "causal" || key == "window" || key == "kv_lens" || key == "layout" || key == "dtype";
}
bool keyword_axis(const schema::Axis& a) {
  return (a.kind == schema::AxisKind::Setting || a.kind == schema::AxisKind::Mask) && !own_parameter(a.key);
}
void apply_settings(const py::kwargs& settings, Problem& p) {
  int threads = 0;
  for (const auto& [name, value] : settings) {
    const std::string key = py::str(name);
    if (key == "block_table") continue;  // make_call's: k and v are then a paged cache's pool
    const schema::Axis* a = schema::find_axis(key);
    if (!a || !keyword_axis(*a)) {
      std::string allowed = "kernel, causal, window, kv_lens, scale, layout, threads, dtype, isa, block_table";
      for (const schema::Axis& x : schema::axes()) {
        if (keyword_axis(x)) allowed += ", " + std::string(x.key);
      }
      throw py::type_error("unexpected keyword argument '" + key + "'; allowed: " + allowed);
    }
    schema::set_axis(*a, schema::Where{"", "attnlab", false}, json_of(value), p, threads);
  }
}

// The problem Q, K, V describe, with the mask arguments; validated (InvalidInput -> ValueError).
struct Call {
  Problem p;
  Arr q, k, v;  // the arrays' memory, held until the call ends
  Inputs in;
  Tensors cache;                     // a quantized or paged cache (kv_dtype, kv_block), written from the K and V arrays
  std::shared_ptr<Py_buffer> table;  // a block table given with k and v as a paged cache's pool
};

// block_table: int32 (batch, entries per sequence), C order, read in place.
std::shared_ptr<Py_buffer> block_table_of(const py::handle& obj, int64_t batch) {
  Py_buffer got{};
  if (PyObject_GetBuffer(obj.ptr(), &got, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    throw py::type_error("block_table: " + type_name(obj) + " has no buffer; allowed: a 2-D int32 numpy array");
  }
  auto view = std::shared_ptr<Py_buffer>(new Py_buffer(got), [](Py_buffer* b) {
    PyBuffer_Release(b);
    delete b;
  });
  std::string fmt = view->format ? view->format : "B";
  if (!fmt.empty() && std::string("@=<").find(fmt[0]) != std::string::npos) fmt.erase(0, 1);
  const std::vector<int64_t> shape(view->shape, view->shape + view->ndim);
  const bool c_order = view->ndim != 2 || !view->strides ||
                       (view->strides[1] == 4 && (shape[0] == 1 || view->strides[0] == 4 * shape[1]));
  if ((fmt != "i" && fmt != "l") || view->itemsize != 4 || view->ndim != 2 || !c_order || shape[0] != batch) {
    throw py::value_error("block_table: shape " + shape_text(shape) + ", format '" + fmt + "', item size " +
                          std::to_string(view->itemsize) +
                          "; allowed: a C-contiguous int32 array of shape (batch = " + std::to_string(batch) +
                          ", blocks per sequence): sequence b's key j in pool block "
                          "block_table[b][j // block]");
  }
  return view;
}

Call make_call(const py::handle& q, const py::handle& k, const py::handle& v, const py::object& causal,
               const std::optional<std::pair<int64_t, int64_t>>& window,
               const std::optional<std::vector<int64_t>>& kv_lens, const std::optional<float>& scale,
               const std::string& layout, const std::optional<std::string>& dtype,
               const py::kwargs& settings = py::kwargs()) {
  Call c;
  Problem& p = c.p;
  p.layout = parse_layout(layout);
  c.q = as_input(q, "q", dtype, p.layout), c.k = as_input(k, "k", dtype, p.layout),
  c.v = as_input(v, "v", dtype, p.layout);
  const Arr &aq = c.q, &ak = c.k, &av = c.v;
  // uint8 k and v: a quantized cache's rows as stored (kv_dtype names the layout), read in place
  const bool raw = ak.bytes || av.bytes;
  if (aq.bytes)
    throw py::type_error("q: uint8 data; allowed: float32 (uint8 is for k and v: a quantized cache's rows)");
  if (raw && !(ak.bytes && av.bytes)) {
    throw py::type_error(std::string(ak.bytes ? "v" : "k") +
                         ": float data beside a uint8 cache; allowed: k and v both a quantized cache's rows (uint8, "
                         "with kv_dtype), or both float data");
  }
  if (!raw && (ak.dtype != aq.dtype || av.dtype != aq.dtype)) {
    throw py::type_error("k, v: dtypes differ from q's; allowed: the same dtype for q, k and v");
  }
  const int si = p.layout == Layout::BHSD ? 2 : 1;
  // k and v as a paged cache's pool (blocks, kv_heads, block, d) (bshd: (blocks, block, kv_heads,
  // d)) when a block table is given: vLLM's and OpenVINO's layout, read in place.
  const py::object table = settings.contains("block_table") ? py::object(settings["block_table"]) : py::none();
  const bool pool = !table.is_none();
  const auto shape = [](const Arr& a) { return std::vector<int64_t>(a.shape.begin(), a.shape.end()); };
  size_from_arrays(p, ArrayShapes{shape(aq), shape(ak), shape(av), "q", "k", "v", raw, pool});
  if (pool) {
    c.table = block_table_of(table, p.batch);
    const int64_t entries = c.table->shape[1], block = ak.shape[si];
    p.kv_len = entries * block;
    if (kv_lens) p.kv_len = *std::max_element(kv_lens->begin(), kv_lens->end());
  }
  p.dtype = aq.dtype;
  if (causal.is_none() || (py::isinstance<py::bool_>(causal) && !causal.cast<bool>())) {
    p.causal = CausalAlign::None;
  } else if (py::isinstance<py::bool_>(causal)) {
    p.causal = CausalAlign::BottomRight;
  } else if (py::isinstance<py::str>(causal) && causal.cast<std::string>() == "top_left") {
    p.causal = CausalAlign::TopLeft;
  } else if (py::isinstance<py::str>(causal) && causal.cast<std::string>() == "bottom_right") {
    p.causal = CausalAlign::BottomRight;
  } else {
    throw py::value_error(
        "causal: " + std::string(py::repr(causal)) +
        "; allowed: False, True (bottom-right, the KV-cache convention), \"bottom_right\", \"top_left\"");
  }
  if (window) p.window_left = window->first, p.window_right = window->second;
  if (kv_lens) p.kv_lens = *kv_lens;
  p.scale = scale;
  apply_settings(settings, p);
  if (p.kv_shared) {
    throw InvalidInput(
        "kv_shared: the arrays give V as its own tensor; allowed: False here (the CLI's verify, run "
        "and sweep measure a shared cache on the lab's own inputs)");
  }
  if (raw) {
    if (!p.kv_quantized()) {
      throw InvalidInput(
          "k: uint8 data is a quantized cache's rows, read in the layout kv_dtype names; allowed: kv_dtype=\"q8_0\", "
          "\"q4_0\", \"u8\", \"u4\", \"fp8_e4m3\" or \"fp8_e5m2\" with uint8 k and v, or float k and v");
    }
    p.head_dim_v = raw_cache_dim_v(p.kv_dtype, p.head_dim, ak.shape[3], av.shape[3], "k", "v");
  }
  p.validate();
  const auto view = [&](const Arr& a, int64_t heads, int64_t seq, int64_t dim) {
    return make_view<const void>(a.data, p.batch, heads, seq, dim, p.layout);
  };
  // K and V as given: (batch, kv_heads, kv_len) rows, or a pool's (blocks, kv_heads, block).
  const int64_t outer = pool ? ak.shape[0] : p.batch, seq = pool ? ak.shape[si] : p.kv_len;
  if (pool) {
    if (p.kv_block != 0 && p.kv_block != seq) {
      throw InvalidInput("kv_block: " + std::to_string(p.kv_block) + " beside a pool of " + std::to_string(seq) +
                         "-token blocks; allowed: the pool's block size (" + std::to_string(seq) + "), or none");
    }
    if (p.kv_quantized() && !raw) {
      throw InvalidInput(std::string("kv_dtype: ") + to_string(p.kv_dtype) +
                         " with a float pool; allowed: the pool as stored (uint8 rows) for a quantized cache");
    }
    p.kv_block = seq;
    p.validate();
    c.in.pages = KvPages{static_cast<const int32_t*>(c.table->buf), c.table->shape[1], seq, outer};
    validate_block_table(p, c.in.pages);
  }
  if (raw) {  // Q float32 and the cache's rows, both read in place
    const View4<const void> none{nullptr, outer, p.kv_heads, seq, 1, 0, 0, 0};
    const KvPages pages = c.in.pages;
    c.in = inputs_over(DType::F32, view(aq, p.q_heads, p.q_len, p.head_dim), none, none);
    c.in.kv = p.kv_dtype;
    c.in.kq = make_view(static_cast<const std::byte*>(ak.data), outer, p.kv_heads, seq, ak.shape[3], p.layout);
    c.in.vq = make_view(static_cast<const std::byte*>(av.data), outer, p.kv_heads, seq, av.shape[3], p.layout);
    c.in.pages = pages;
    if (p.kv_paged() && !pool) {  // copied into a paged cache's scattered blocks
      c.cache = page_kv(p, c.in);
      c.in = c.cache.inputs;
    }
    return c;
  }
  if (pool) {
    const KvPages pages = c.in.pages;
    c.in = inputs_over(p.dtype, view(aq, p.q_heads, p.q_len, p.head_dim),
                       make_view<const void>(ak.data, outer, p.kv_heads, seq, p.head_dim, p.layout),
                       make_view<const void>(av.data, outer, p.kv_heads, seq, p.dim_v(), p.layout));
    c.in.pages = pages;
    return c;
  }
  c.in = inputs_over(p.dtype, view(aq, p.q_heads, p.q_len, p.head_dim), view(ak, p.kv_heads, p.kv_len, p.head_dim),
                     view(av, p.kv_heads, p.kv_len, p.dim_v()));
  if (p.kv_quantized()) {               // Q read in place; K and V written into the cache layout (kv_quant.hpp)
    c.cache = convert_inputs(p, c.in);  // (a paged one too)
    c.in = c.cache.inputs;
  } else if (p.kv_paged()) {  // K and V copied into a paged cache's scattered blocks
    c.cache = page_kv(p, c.in);
    c.in = c.cache.inputs;
  }
  return c;
}

// None and 0: all cores (attnlab::thread_count's rule, InvalidInput -> ValueError).
int thread_count(const std::optional<int>& threads) { return attnlab::thread_count(threads.value_or(0)); }

const Kernel& kernel_named(const std::string& name, const std::optional<std::string>& isa) {
  return kernel_or_throw(name, isa ? std::string_view(*isa) : std::string_view());
}

py::object attention(const py::handle& q, const py::handle& k, const py::handle& v, const std::string& kernel,
                     const py::object& causal, const std::optional<std::pair<int64_t, int64_t>>& window,
                     const std::optional<std::vector<int64_t>>& kv_lens, const std::optional<float>& scale,
                     const std::string& layout, const std::optional<int>& threads, bool return_lse,
                     const std::optional<std::string>& dtype, const std::optional<std::string>& isa,
                     const py::kwargs& settings) {
  const Call c = make_call(q, k, v, causal, window, kv_lens, scale, layout, dtype, settings);
  const Problem& p = c.p;
  const Kernel& kern = kernel_named(kernel, isa);
  Session session(kern, p, thread_count(threads));
  const bool bhsd = p.layout == Layout::BHSD;
  const auto [o, o_data] = new_output(bhsd ? std::vector<int64_t>{p.batch, p.q_heads, p.q_len, p.dim_v()}
                                           : std::vector<int64_t>{p.batch, p.q_len, p.q_heads, p.dim_v()});
  Outputs out;
  out.o = make_view<float>(o_data, p.batch, p.q_heads, p.q_len, p.dim_v(), p.layout);
  py::object lse;
  if (return_lse) std::tie(lse, out.lse) = new_output({p.batch, p.q_heads, p.q_len});
  {
    py::gil_scoped_release unlocked;
    session.run(c.in, out);
  }
  if (return_lse) return py::make_tuple(to_library(o, c.q.library), to_library(lse, c.q.library));
  return to_library(o, c.q.library);
}

// dQ, dK, dV of O = attention(q, k, v) for the gradient d_o flowing into O (backward.hpp), by the
// kernel's backward pass; O and LSE from its own forward unless both are given.
py::tuple attention_backward(const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& d_o,
                             const py::object& o_given, const py::object& lse_given, const std::string& kernel,
                             const py::object& causal, const std::optional<std::pair<int64_t, int64_t>>& window,
                             const std::optional<std::vector<int64_t>>& kv_lens, const std::optional<float>& scale,
                             const std::string& layout, const std::optional<int>& threads,
                             const std::optional<std::string>& dtype, const std::optional<std::string>& isa,
                             const py::kwargs& settings) {
  const Call c = make_call(q, k, v, causal, window, kv_lens, scale, layout, dtype, settings);
  const Problem& p = c.p;
  const bool bhsd = p.layout == Layout::BHSD;
  const std::vector<int64_t> o_shape = bhsd ? std::vector<int64_t>{p.batch, p.q_heads, p.q_len, p.dim_v()}
                                            : std::vector<int64_t>{p.batch, p.q_len, p.q_heads, p.dim_v()};
  // dO (and a given O) float32 in O's shape; a given LSE float32 (batch, q_heads, q_len).
  const auto float_input = [&](const py::handle& obj, const char* name, const std::vector<int64_t>& shape) {
    Arr a = as_input(obj, name, std::nullopt, p.layout);
    if (a.dtype != DType::F32) {
      throw py::type_error(std::string(name) + ": dtype " + to_string(a.dtype) + "; allowed: float32");
    }
    if (std::vector<int64_t>(a.shape.begin(), a.shape.end()) != shape) {
      throw py::value_error(std::string(name) + ": shape " + shape_text({a.shape.begin(), a.shape.end()}) +
                            "; allowed: " + shape_text(shape) + " (O's shape)");
    }
    return a;
  };
  const Arr ado = float_input(d_o, "do", o_shape);
  if (o_given.is_none() != lse_given.is_none()) {
    throw py::value_error("o, lse: give both (the forward's outputs) or neither (the kernel's own forward)");
  }
  const Kernel& kern = kernel_named(kernel, isa);
  Session session(kern, p, thread_count(threads), true);
  const auto view = [&](const void* data, int64_t heads, int64_t seq, int64_t dim) {
    return make_view<const float>(static_cast<const float*>(data), p.batch, heads, seq, dim, p.layout);
  };
  BackwardInputs bw{view(ado.data, p.q_heads, p.q_len, p.dim_v()), {}, nullptr};
  Arr ao;  // a given O, held until the call ends
  std::vector<float> lse_buf(static_cast<size_t>(p.lse_elems()));
  if (!o_given.is_none()) {
    ao = float_input(o_given, "o", o_shape);
    bw.o = view(ao.data, p.q_heads, p.q_len, p.dim_v());
    // LSE: batch * q_heads * q_len floats, copied (numpy reads any array library's by __array__).
    const py::object l = py::module_::import("numpy").attr("ascontiguousarray")(lse_given, "float32");
    Py_buffer lv{};
    if (PyObject_GetBuffer(l.ptr(), &lv, PyBUF_C_CONTIGUOUS) != 0) throw py::error_already_set();
    const bool ok = lv.len == static_cast<Py_ssize_t>(lse_buf.size() * sizeof(float));
    if (ok) std::memcpy(lse_buf.data(), lv.buf, lse_buf.size() * sizeof(float));
    PyBuffer_Release(&lv);
    if (!ok) {
      throw py::value_error("lse: " + std::to_string(lv.len / 4) + " values; allowed: (batch, q_heads, q_len) = " +
                            shape_text({p.batch, p.q_heads, p.q_len}) + " float32");
    }
  }
  bw.lse = lse_buf.data();
  const auto [dq, dq_data] = new_output(bhsd ? std::vector<int64_t>{p.batch, p.q_heads, p.q_len, p.head_dim}
                                             : std::vector<int64_t>{p.batch, p.q_len, p.q_heads, p.head_dim});
  const auto [dk, dk_data] = new_output(bhsd ? std::vector<int64_t>{p.batch, p.kv_heads, p.kv_len, p.head_dim}
                                             : std::vector<int64_t>{p.batch, p.kv_len, p.kv_heads, p.head_dim});
  const auto [dv, dv_data] = new_output(bhsd ? std::vector<int64_t>{p.batch, p.kv_heads, p.kv_len, p.dim_v()}
                                             : std::vector<int64_t>{p.batch, p.kv_len, p.kv_heads, p.dim_v()});
  Gradients g;
  g.dq = make_view<float>(dq_data, p.batch, p.q_heads, p.q_len, p.head_dim, p.layout);
  g.dk = make_view<float>(dk_data, p.batch, p.kv_heads, p.kv_len, p.head_dim, p.layout);
  g.dv = make_view<float>(dv_data, p.batch, p.kv_heads, p.kv_len, p.dim_v(), p.layout);
  std::vector<float> o_buf;
  {
    py::gil_scoped_release unlocked;
    if (!bw.o.data) {  // the kernel's own forward
      o_buf.resize(static_cast<size_t>(p.o_elems()));
      Outputs out;
      out.o = make_view<float>(o_buf.data(), p.batch, p.q_heads, p.q_len, p.dim_v(), p.layout);
      out.lse = lse_buf.data();
      session.run(c.in, out);
      bw.o = as_const(out.o);
    }
    session.run_backward(c.in, bw, g);
  }
  const std::string& lib = c.q.library;
  return py::make_tuple(to_library(dq, lib), to_library(dk, lib), to_library(dv, lib));
}

py::list kernels() {
  py::list out;
  std::vector<const Kernel*> defaults = registry();
  for (const Kernel* k : variants()) {
    const Support a = k->available();
    py::dict d;
    d["name"] = std::string(k->name());
    d["isa"] = std::string(k->isa());
    d["label"] = kernel_label(*k);
    d["description"] = std::string(k->description());
    d["precision"] = std::string(k->precision());
    d["available"] = a.ok;
    d["reason"] = a.reason;
    d["default"] = std::find(defaults.begin(), defaults.end(), k) != defaults.end();
    out.append(d);
  }
  return out;
}

py::list verify(const py::handle& q, const py::handle& k, const py::handle& v, const py::object& kernel_names,
                const py::object& causal, const std::optional<std::pair<int64_t, int64_t>>& window,
                const std::optional<std::vector<int64_t>>& kv_lens, const std::optional<float>& scale,
                const std::string& layout, const std::optional<int>& threads, int rows,
                const std::optional<std::string>& dtype, const py::kwargs& settings) {
  const Call c = make_call(q, k, v, causal, window, kv_lens, scale, layout, dtype, settings);
  if (rows < 1) throw py::value_error("rows: " + std::to_string(rows) + "; allowed: >= 1");
  const std::vector<std::string> names = py::isinstance<py::str>(kernel_names)
                                             ? std::vector<std::string>{kernel_names.cast<std::string>()}
                                             : kernel_names.cast<std::vector<std::string>>();
  std::vector<const Kernel*> ks;
  for (const std::string& n : names) {
    if (n == "all") {
      const auto r = registry();
      ks.insert(ks.end(), r.begin(), r.end());
    } else {
      ks.push_back(&kernel_or_throw(n));
    }
  }
  const int t = thread_count(threads);
  py::list out;
  py::gil_scoped_release unlocked;
  const Agreement a = prepare_agreement(c.p, c.in, sample_rows(c.p, static_cast<size_t>(rows), 7));
  for (const Kernel* kern : ks) {
    const KernelCheck r = check_kernel(*kern, c.p, c.in, a, t);
    py::gil_scoped_acquire locked;
    py::dict d;
    d["kernel"] = kernel_label(*kern);
    d["verdict"] = to_string(r.verdict);
    d["o_rel"] = r.errors.o_rel;
    d["lse"] = r.errors.lse;
    d["tol_o_rel"] = r.tol.o_rel;
    d["tol_lse"] = r.tol.lse;
    d["reason"] = r.reason;
    out.append(d);
  }
  return out;
}

py::dict peak(const std::optional<int>& threads, double seconds) {
  const int t = thread_count(threads);
  if (!(seconds > 0)) throw py::value_error("seconds: must be > 0");
  py::dict d;
  double fma = 0, read = 0;
  {
    py::gil_scoped_release unlocked;
    fma = peaks::measure_fma_flops(t, seconds);
    read = peaks::measure_read_bandwidth(t, size_t{256} << 20, 1);
  }
  d["threads"] = t;
  d["fma_flops"] = fma;
  d["read_bytes"] = read;
  return d;
}

// The point schema's input axes: key, kind, help, default (JSON-decoded; None when required).
py::list axes() {
  py::list out;
  const py::object loads = py::module_::import("json").attr("loads");
  for (const schema::Axis& a : schema::axes()) {
    py::dict d;
    d["key"] = a.key;
    d["kind"] = schema::to_string(a.kind);
    d["help"] = a.help;
    d["default"] = a.fallback ? loads(a.fallback) : py::none();
    out.append(d);
  }
  return out;
}

// The data pointers of the views the kernels read (for the no-copy test).
py::dict views(const py::handle& q, const py::handle& k, const py::handle& v, const std::string& layout,
               const std::optional<std::string>& dtype) {
  const Call c = make_call(q, k, v, py::bool_(false), std::nullopt, std::nullopt, std::nullopt, layout, dtype);
  const bool f = c.in.dtype == DType::F32;
  py::dict d;
  d["q"] = reinterpret_cast<uintptr_t>(f ? static_cast<const void*>(c.in.q.data) : c.in.q16.data);
  d["k"] = reinterpret_cast<uintptr_t>(f ? static_cast<const void*>(c.in.k.data) : c.in.k16.data);
  d["v"] = reinterpret_cast<uintptr_t>(f ? static_cast<const void*>(c.in.v.data) : c.in.v16.data);
  d["problem"] = c.p.describe();
  return d;
}

}  // namespace

PYBIND11_MODULE(_core, m) {  // attnlab._core; the package attnlab (src/python/attnlab/) imports it
  m.doc() = "attnlab's kernels on numpy arrays and torch / JAX tensors (no copies; see src/python/module.cpp)";
  py::register_exception<InvalidInput>(m, "InvalidInput", PyExc_ValueError);
  m.def("attention", &attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("kernel") = "flash",
        py::arg("causal") = false, py::arg("window") = py::none(), py::arg("kv_lens") = py::none(),
        py::arg("scale") = py::none(), py::arg("layout") = "bhsd", py::arg("threads") = py::none(),
        py::arg("return_lse") = false, py::arg("dtype") = py::none(), py::arg("isa") = py::none(),
        "O (and LSE when return_lse) of scaled-dot-product attention by one of the lab's kernels.\n"
        "q (batch, q_heads, q_len, d), k (batch, kv_heads, kv_len, d), v (..., d_v) for layout 'bhsd'\n"
        "(seq before heads for 'bshd'); causal False | True (bottom-right) | 'top_left'; window (left, right)\n"
        "with -1 unbounded; kv_lens per batch entry; threads None = all cores.");
  m.def("attention_backward", &attention_backward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("do"),
        py::arg("o") = py::none(), py::arg("lse") = py::none(), py::arg("kernel") = "flash", py::arg("causal") = false,
        py::arg("window") = py::none(), py::arg("kv_lens") = py::none(), py::arg("scale") = py::none(),
        py::arg("layout") = "bhsd", py::arg("threads") = py::none(), py::arg("dtype") = py::none(),
        py::arg("isa") = py::none(),
        "(dq, dk, dv): the gradients of attention(q, k, v, ...) for the gradient `do` flowing into O (float32,\n"
        "O's shape), by the kernel's backward pass (attnlab.kernels(): those with one); o and lse (natural log,\n"
        "(batch, q_heads, q_len)) from the forward, or both None for the kernel's own forward. Same keywords\n"
        "as attention().");
  m.def("kernels", &kernels,
        "Every kernel variant: name, isa, label, description, precision, available, reason, default.");
  m.def("verify", &verify, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("kernels") = "all",
        py::arg("causal") = false, py::arg("window") = py::none(), py::arg("kv_lens") = py::none(),
        py::arg("scale") = py::none(), py::arg("layout") = "bhsd", py::arg("threads") = py::none(),
        py::arg("rows") = 256, py::arg("dtype") = py::none(),
        "Each kernel against the float64 reference on sampled rows, with the lab's tolerance policy:\n"
        "a list of dicts (kernel, verdict PASS/FAIL/SKIP, o_rel, lse, tol_o_rel, tol_lse, reason).");
  m.def("peak", &peak, py::arg("threads") = py::none(), py::arg("seconds") = 0.1,
        "The machine's float32 FMA peak (FLOP/s) and streaming read bandwidth (bytes/s), one run each.");
  m.def("axes", &axes,
        "The point schema's input axes (experiment keys): key, kind (size, setting, mask, run), help, default.\n"
        "Every 'setting' is a keyword of attention() and verify().");
  m.def("_views", &views, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("layout") = "bhsd",
        py::arg("dtype") = py::none(), "The data pointers the kernels would read (tests: no copies).");
}
