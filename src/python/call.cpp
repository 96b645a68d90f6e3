// One call's problem from the Python arguments (call.hpp).
#include "python/call.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <memory>

#include "attnlab/kv_quant.hpp"
#include "attnlab/kv_summary.hpp"
#include "attnlab/tensor.hpp"
#include "schema/point_schema.hpp"

namespace attnlab::python {

namespace {

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
  return (a.kind == schema::AxisKind::Setting || a.kind == schema::AxisKind::Mask ||
          a.kind == schema::AxisKind::Score) &&
         !own_parameter(a.key);
}
void apply_settings(const py::kwargs& settings, Problem& p) {
  int threads = 0;
  for (const auto& [name, value] : settings) {
    const std::string key = py::str(name);
    if (key == "block_table" || key == "mask" || key == "kv_summary") continue;  // make_call's: arrays, not axes
    const schema::Axis* a = schema::find_axis(key);
    if (!a || !keyword_axis(*a)) {
      std::string allowed =
          "kernel, causal, window, kv_lens, scale, layout, threads, dtype, isa, block_table, mask, kv_summary";
      for (const schema::Axis& x : schema::axes()) {
        if (keyword_axis(x)) allowed += ", " + std::string(x.key);
      }
      throw py::type_error("unexpected keyword argument '" + key + "'; allowed: " + allowed);
    }
    schema::set_axis(*a, schema::Where{"", "attnlab", false}, json_of(value), p, threads);
  }
}

// mask: a boolean array (bool or uint8, nonzero = attend: torch's bool attn_mask) of shape
// (q_len, kv_len) or (batch|1, 1|q_heads, q_len, kv_len), C order; copied once into the problem's
// mask (the rule of a mask file: Pattern::visible). The problem's checks name a shape that does
// not fit.
std::shared_ptr<const BoolMask> mask_of(const py::handle& obj) {
  Py_buffer got{};
  if (PyObject_GetBuffer(obj.ptr(), &got, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    throw py::type_error("mask: " + type_name(obj) +
                         " has no buffer; allowed: a numpy bool or uint8 array (a torch bool tensor: .numpy())");
  }
  const std::unique_ptr<Py_buffer, void (*)(Py_buffer*)> view(&got, PyBuffer_Release);
  std::string fmt = got.format ? got.format : "B";
  if (!fmt.empty() && std::string("@=<|").find(fmt[0]) != std::string::npos) fmt.erase(0, 1);
  const std::vector<int64_t> shape(got.shape, got.shape + got.ndim);
  std::vector<int64_t> strides;
  if (got.strides) strides.assign(got.strides, got.strides + got.ndim);
  if ((fmt != "?" && fmt != "B" && fmt != "b") || got.itemsize != 1 || (got.ndim != 2 && got.ndim != 4) ||
      !c_contiguous(shape, strides)) {
    throw py::value_error("mask: shape " + shape_text(shape) + ", format '" + fmt +
                          "'; allowed: a C-contiguous bool or uint8 array (nonzero = attend) of shape (q_len, "
                          "kv_len) or (batch|1, 1|q_heads, q_len, kv_len)");
  }
  const auto* bytes = static_cast<const uint8_t*>(got.buf);
  return std::make_shared<const BoolMask>(
      bool_mask(shape, std::vector<uint8_t>(bytes, bytes + got.len), "the mask argument", "mask"));
}

}  // namespace

namespace {
// An array argument's buffer, held while the returned view lives: its format without the byte-order
// mark, its shape, and whether it is C-contiguous (each dimension's stride the bytes of the ones after
// it; size-1 dimensions aside). TypeError naming the argument when it has no (writable) buffer.
struct Buffer {
  std::shared_ptr<Py_buffer> view;
  std::string fmt;
  std::vector<int64_t> shape;
  bool c_order = true;
};
Buffer buffer_of(const py::handle& obj, const char* name, bool writable, const std::string& allowed) {
  Py_buffer got{};
  if (PyObject_GetBuffer(obj.ptr(), &got, writable ? PyBUF_RECORDS : PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    throw py::type_error(std::string(name) + ": " + type_name(obj) +
                         (writable ? " has no writable buffer" : " has no buffer") + "; allowed: " + allowed);
  }
  Buffer b;
  b.view = std::shared_ptr<Py_buffer>(new Py_buffer(got), [](Py_buffer* v) {
    PyBuffer_Release(v);
    delete v;
  });
  b.fmt = b.view->format ? b.view->format : "B";
  if (!b.fmt.empty() && std::string("@=<").find(b.fmt[0]) != std::string::npos) b.fmt.erase(0, 1);
  b.shape.assign(b.view->shape, b.view->shape + b.view->ndim);
  for (int64_t i = b.view->ndim - 1, step = b.view->itemsize; i >= 0 && b.view->strides; --i) {
    b.c_order = b.c_order && (b.shape[i] == 1 || b.view->strides[i] == step);
    step *= b.shape[i];
  }
  return b;
}
}  // namespace

// block_table: int32 (batch, entries per sequence), C order, read in place.
std::shared_ptr<Py_buffer> block_table_of(const py::handle& obj, int64_t batch) {
  const Buffer b = buffer_of(obj, "block_table", false, "a 2-D int32 numpy array");
  if ((b.fmt != "i" && b.fmt != "l") || b.view->itemsize != 4 || b.view->ndim != 2 || !b.c_order ||
      (batch >= 0 && b.shape[0] != batch)) {
    throw py::value_error("block_table: shape " + shape_text(b.shape) + ", format '" + b.fmt + "', item size " +
                          std::to_string(b.view->itemsize) + "; allowed: a C-contiguous int32 array of shape (batch" +
                          (batch >= 0 ? " = " + std::to_string(batch) : std::string()) +
                          ", blocks per sequence): sequence b's key j in pool block block_table[b][j // block]");
  }
  return b.view;
}

std::pair<KvSummary, std::shared_ptr<Py_buffer>> summary_of(const py::handle& obj, int64_t batch, int64_t kv_heads,
                                                            int64_t dim, bool writable) {
  const std::string allowed = "a C-contiguous float32 array of shape (batch = " + std::to_string(batch) +
                              ", kv_heads = " + std::to_string(kv_heads) +
                              ", blocks, 2, head_dim = " + std::to_string(dim) +
                              ", 16) (attnlab.new_kv_summary makes one)";
  const Buffer b = buffer_of(obj, "kv_summary", writable, allowed);
  const std::vector<int64_t>& shape = b.shape;
  if (b.fmt != "f" || b.view->itemsize != 4 || b.view->ndim != 6 || !b.c_order || shape[0] != batch ||
      shape[1] != kv_heads || shape[3] != 2 || shape[4] != dim || shape[5] != kSummaryBlockPages) {
    throw py::value_error("kv_summary: shape " + shape_text(shape) + ", format '" + b.fmt + "'; allowed: " + allowed);
  }
  KvSummary s;
  s.batch = batch, s.kv_heads = kv_heads, s.pages = shape[2] * kSummaryBlockPages, s.dim = dim;
  s.external = static_cast<float*>(b.view->buf);
  return {std::move(s), b.view};
}

namespace {
Call arrays_call(const py::handle& q, const py::handle& k, const py::handle& v, const py::object& causal,
                 const std::optional<std::pair<int64_t, int64_t>>& window,
                 const std::optional<std::vector<int64_t>>& kv_lens, const std::optional<float>& scale,
                 const std::string& layout, const std::optional<std::string>& dtype, const py::kwargs& settings) {
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
  if (settings.contains("mask") && !py::object(settings["mask"]).is_none()) {
    if (p.mask) throw py::value_error("mask: given beside mask_file; allowed: one of them");
    p.mask = mask_of(settings["mask"]);
  }
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

}  // namespace

Call make_call(const py::handle& q, const py::handle& k, const py::handle& v, const py::object& causal,
               const std::optional<std::pair<int64_t, int64_t>>& window,
               const std::optional<std::vector<int64_t>>& kv_lens, const std::optional<float>& scale,
               const std::string& layout, const std::optional<std::string>& dtype, const py::kwargs& settings) {
  Call c = arrays_call(q, k, v, causal, window, kv_lens, scale, layout, dtype, settings);
  const bool given = settings.contains("kv_summary") && !py::object(settings["kv_summary"]).is_none();
  if (given && !c.p.topk()) {
    throw py::value_error("kv_summary: given without topk_tokens; allowed: with topk_tokens > 0 (a sparse decode)");
  }
  if (given) {  // the caller's summaries (write_kv keeps them as rows are stored), read in place
    auto [s, buffer] = summary_of(settings["kv_summary"], c.p.batch, c.p.kv_heads, c.p.head_dim, false);
    c.cache.summary = std::make_shared<KvSummary>(std::move(s));
    c.summary_buffer = std::move(buffer);
  } else if (c.p.topk()) {  // read from the cache as given: one pass over K per call
    c.cache.summary = std::make_shared<KvSummary>(summarize_keys(c.p, c.in));
  }
  c.in.summary = c.cache.summary.get();
  return c;
}

}  // namespace attnlab::python
