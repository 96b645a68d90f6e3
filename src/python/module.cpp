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
// paged cache's pool (blocks, kv_heads, block, d), read in place through the table; mask= a
// boolean array (nonzero = attend), copied once into the problem's mask.
// Every setting and mask axis of the point schema (schema/point_schema.hpp) beyond the
// parameters of their own is a keyword too, taking what the experiment key takes (a new axis
// needs no edit here).
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

#include "attnlab/auto.hpp"
#include "attnlab/kernel.hpp"
#include "attnlab/kv_summary.hpp"
#include "attnlab/limits.hpp"
#include "attnlab/verify.hpp"
#include "peaks/peak.hpp"
#include "python/arrays.hpp"
#include "python/cache.hpp"
#include "python/call.hpp"
#include "schema/point_schema.hpp"

namespace py = pybind11;
using namespace attnlab;
using namespace attnlab::python;

namespace {

// None and 0: all cores (attnlab::thread_count's rule, InvalidInput -> ValueError).
int thread_count(const std::optional<int>& threads) { return attnlab::thread_count(threads.value_or(0)); }

// The named kernel, or for "auto" the one auto.hpp's table chooses for p.
AutoChoice kernel_for(const std::string& name, const std::optional<std::string>& isa, const Problem& p, int threads,
                      const std::string& arithmetic = "native") {
  if (name != kAutoKernel && arithmetic != "native") {
    throw InvalidInput("arithmetic: '" + arithmetic + "' with kernel '" + name + "'; allowed: with kernel 'auto' only");
  }
  return resolve_kernel(name, isa ? std::string_view(*isa) : std::string_view(), p, threads,
                        parse_auto_arithmetic(arithmetic));
}

// return_info's dict: the kernel that ran and why.
py::dict info_of(const AutoChoice& c) {
  py::dict d;
  d["kernel"] = kernel_label(*c.kernel);
  d["name"] = std::string(c.kernel->name());
  d["isa"] = std::string(c.kernel->isa());
  d["rule"] = c.rule;
  d["passed_over"] = c.passed_over;
  return d;
}

py::object attention(const py::handle& q, const py::handle& k, const py::handle& v, const std::string& kernel,
                     const py::object& causal, const std::optional<std::pair<int64_t, int64_t>>& window,
                     const std::optional<std::vector<int64_t>>& kv_lens, const std::optional<float>& scale,
                     const std::string& layout, const std::optional<int>& threads, bool return_lse,
                     const std::optional<std::string>& dtype, const std::optional<std::string>& isa,
                     const std::string& arithmetic, bool return_info, const py::kwargs& settings) {
  const Call c = make_call(q, k, v, causal, window, kv_lens, scale, layout, dtype, settings);
  const Problem& p = c.p;
  const int n_threads = thread_count(threads);
  const AutoChoice chosen = kernel_for(kernel, isa, p, n_threads, arithmetic);
  Session session(*chosen.kernel, p, n_threads);
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
  py::object o_out = to_library(o, c.q.library);
  if (return_lse && return_info) return py::make_tuple(o_out, to_library(lse, c.q.library), info_of(chosen));
  if (return_lse) return py::make_tuple(o_out, to_library(lse, c.q.library));
  if (return_info) return py::make_tuple(o_out, info_of(chosen));
  return o_out;
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
  Problem asked = p;
  asked.pass = Pass::Backward;
  const int n_threads = thread_count(threads);
  Session session(*kernel_for(kernel, isa, asked, n_threads).kernel, p, n_threads, true);
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
  py::object dsink;  // the sink logits' gradient (backward.hpp), one per query head
  if (!p.sink_logits.empty()) {
    auto [ds, ds_data] = new_output({p.q_heads});
    dsink = ds;
    g.dsink = ds_data;
  }
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
  if (!p.sink_logits.empty()) {
    return py::make_tuple(to_library(dq, lib), to_library(dk, lib), to_library(dv, lib), to_library(dsink, lib));
  }
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
  m.def("attention", &attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("kernel") = "auto",
        py::arg("causal") = false, py::arg("window") = py::none(), py::arg("kv_lens") = py::none(),
        py::arg("scale") = py::none(), py::arg("layout") = "bhsd", py::arg("threads") = py::none(),
        py::arg("return_lse") = false, py::arg("dtype") = py::none(), py::arg("isa") = py::none(),
        py::arg("arithmetic") = "native", py::arg("return_info") = false,
        "O (and LSE when return_lse) of scaled-dot-product attention by one of the lab's kernels.\n"
        "kernel 'auto' (the default): the fastest kernel that runs the problem here (`attnlab list` prints the\n"
        "table); arithmetic 'native' (bf16 products for bf16 inputs, else float32), 'f32' or 'int8' (int8\n"
        "products allowed for float32 inputs: flash_int8). return_info:\n"
        "a dict last in the result - kernel (the variant that ran), name, isa, rule, passed_over.\n"
        "q (batch, q_heads, q_len, d), k (batch, kv_heads, kv_len, d), v (..., d_v) for layout 'bhsd'\n"
        "(seq before heads for 'bshd'); causal False | True (bottom-right) | 'top_left'; window (left, right)\n"
        "with -1 unbounded; kv_lens per batch entry; threads None = all cores.");
  m.def("attention_backward", &attention_backward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("do"),
        py::arg("o") = py::none(), py::arg("lse") = py::none(), py::arg("kernel") = "auto", py::arg("causal") = false,
        py::arg("window") = py::none(), py::arg("kv_lens") = py::none(), py::arg("scale") = py::none(),
        py::arg("layout") = "bhsd", py::arg("threads") = py::none(), py::arg("dtype") = py::none(),
        py::arg("isa") = py::none(),
        "(dq, dk, dv): the gradients of attention(q, k, v, ...) for the gradient `do` flowing into O (float32,\n"
        "O's shape), by the kernel's backward pass (attnlab.kernels(): those with one); o and lse (natural log,\n"
        "(batch, q_heads, q_len)) from the forward, or both None for the kernel's own forward. Same keywords\n"
        "as attention(); with sink_logits a fourth array, dsink (q_heads float32: the sink logits' gradient).");
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
  m.def("write_kv", &write_kv, py::arg("cache"), py::arg("rows"), py::arg("start"), py::arg("kv_dtype") = py::none(),
        py::arg("block_table") = py::none(), py::arg("layout") = "bhsd", py::arg("summary") = py::none(),
        "Stores rows (float32 (batch, kv_heads, n, d)) at positions [start, start + n) of a KV cache you hold,\n"
        "by the lab's rule for its layout: cache (batch, kv_heads, capacity, row) - uint8 rows of kv_dtype's\n"
        "bytes (q8_0, q4_0, u8, u4, fp8_e4m3, fp8_e5m2), or a float32/bfloat16/float16 cache (rounded to\n"
        "nearest even) - or, with block_table (int32 (batch, entries)), a pool (blocks, kv_heads, block, row).\n"
        "attention(q, cache_k, cache_v, kv_dtype=..., kv_lens=..., block_table=...) then reads it in place.\n"
        "summary (new_kv_summary's array): each stored K row folded into its 64-row page's min and max, as the\n"
        "cache reads it back - what attention(..., topk_tokens=N, kv_summary=summary) ranks pages by.");
  m.def("new_kv_summary", &new_kv_summary, py::arg("batch"), py::arg("kv_heads"), py::arg("capacity"), py::arg("dim"),
        "Page summaries for a K cache of `capacity` rows per sequence: float32 (batch, kv_heads, blocks, 2, dim, 16):\n"
        "page p's minima in [:, :, p // 16, 0, :, p % 16], its maxima in [..., 1, ...]; 64 rows a page, every page\n"
        "empty (min +inf, max -inf); write_kv(..., summary=) keeps them current.");
  m.attr("SUMMARY_PAGE_KEYS") = kSummaryPageKeys;      // rows per page of a summary
  m.attr("SUMMARY_BLOCK_PAGES") = kSummaryBlockPages;  // pages per block
  m.def("read_kv", &read_kv, py::arg("cache"), py::arg("kv_dtype") = py::none(), py::arg("length") = py::none(),
        py::arg("block_table") = py::none(), py::arg("layout") = "bhsd", py::arg("dim") = py::none(),
        "A cache's first `length` rows per sequence read back as float32 (batch, kv_heads, length, d): the\n"
        "values attention() multiplies. Same cache arguments as write_kv.");
  m.def(
      "kv_row_bytes", [](const std::string& kv_dtype, int64_t dim) { return cache_row_bytes(kv_dtype, dim); },
      py::arg("kv_dtype"), py::arg("dim"),
      "Bytes of one cache row of `dim` values in a quantized layout (kv_quant.hpp).");
  m.attr("KV_BLOCKS") = py::make_tuple(Problem::kMinKvBlock, Problem::kMaxKvBlock);  // a paged cache's block sizes
  m.def("_views", &views, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("layout") = "bhsd",
        py::arg("dtype") = py::none(), "The data pointers the kernels would read (tests: no copies).");
}
