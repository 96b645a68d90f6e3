#include "io.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <tuple>

#include "attnlab/kv_summary.hpp"

namespace attnlab::cli {

namespace {

// The dtype Q, K and V are stored in: --dtype, else what the files hold ('<f2': f16).
DType storage_dtype(const MaskFlags& flags,
                    std::initializer_list<std::pair<const std::string*, const NpyArray*>> files) {
  const auto& [p0, a0] = *files.begin();
  const std::string dtype = flags.settings.text("dtype");
  for (const auto& [path, arr] : files) {
    if (dtype.empty() && (arr->source_dtype == "<f2") != (a0->source_dtype == "<f2")) {
      throw InvalidInput(*path + ": '" + arr->source_dtype + "' data beside " + *p0 + "'s '" + a0->source_dtype +
                         "'; allowed: the same kind of data in Q, K and V, or --dtype to convert them all");
    }
    if (arr->source_dtype == "<u2" && dtype != "bf16") {
      throw InvalidInput(*path + ": '<u2' data is read as raw bfloat16 bits, which needs --dtype bf16 (given: " +
                         (dtype.empty() ? std::string("none") : dtype) + "); allowed: --dtype bf16, or float data");
    }
  }
  if (!dtype.empty()) return parse_dtype(dtype);
  return a0->source_dtype == "<f2" ? DType::F16 : DType::F32;
}

// Whether the inputs are the float32/float64 files' own data (read as float32), uncopied.
bool float_data(const LoadedInputs& li) { return !li.q.is16() && !li.k.is16() && !li.v.is16(); }
bool float_files(const LoadedInputs& li) {
  return li.problem.dtype == DType::F32 && float_data(li) && !li.problem.kv_quantized();
}

// dst (dense, E) = the array's values: its own bits when they are already E, else widened
// to float32 and rounded to E (nearest even).
template <class E>
void store(const NpyArray& a, const View4<const E>& dst) {
  E* out = const_cast<E*>(dst.data);
  const auto n = static_cast<size_t>(dst.elems());
  const bool same =
      (a.source_dtype == "<f2" && std::is_same_v<E, f16>) || (a.source_dtype == "<u2" && std::is_same_v<E, bf16>);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (!std::is_same_v<E, float>) {
      if (same) {
        out[i] = E{a.bits16[i]};
        continue;
      }
    }
    const float x = a.is16() ? to_float(f16{a.bits16[i]}) : a.data[i];  // '<u2' only reaches bf16
    out[i] = from_float<E>(x);
  }
}
}  // namespace

namespace {
LoadedInputs load_contiguous(const std::string& qp, const std::string& kp, const std::string& vp,
                             const MaskFlags& flags);
}  // namespace

// The files are a contiguous cache; with --kv-block they are then copied into a paged one.
LoadedInputs load_inputs(const std::string& qp, const std::string& kp, const std::string& vp, const MaskFlags& flags) {
  Problem wanted;
  flags.apply(wanted);
  LoadedInputs li = load_contiguous(qp, kp, vp, flags);
  if (wanted.kv_shared) {
    throw InvalidInput(
        "kv_shared: the .npy files give V as its own tensor; allowed: kv_shared with the lab's own inputs (verify, "
        "run and sweep without --q/--k/--v)");
  }
  if (wanted.kv_paged()) {
    li.problem.kv_block = wanted.kv_block;
    li.problem.validate();
    Tensors paged = page_kv(li.problem, li.inputs);
    li.stored = std::move(paged);
    li.inputs = li.stored.inputs;
  }
  if (li.problem.topk()) {  // a sparse decode's page summaries, read from the loaded cache
    li.stored.summary = std::make_shared<KvSummary>(summarize_keys(li.problem, li.inputs));
    li.inputs.summary = li.stored.summary.get();
  }
  return li;
}

namespace {
// K and V given as a quantized cache's rows, as stored (uint8 .npy files whose last dimension is
// a row's bytes in kv_dtype's layout, include/attnlab/kv_quant.hpp): a cache written elsewhere -
// by llama.cpp (q8_0, q4_0), by an OpenVINO-style u8/u4 writer, as fp8 codes (per-tensor scale 1)
// - read as it is. Q is float (widened exactly when 16-bit). The shapes are checked by the caller
// but for the last dimension: head_dim is Q's, head_dim_v the one V's row bytes name.
void load_raw_cache(LoadedInputs& li, const std::string& kp, const std::string& vp, const MaskFlags& flags) {
  Problem& p = li.problem;
  for (auto [path, arr] : {std::pair{&kp, &li.k}, {&vp, &li.v}}) {
    if (arr->source_dtype != "|u1") {
      throw InvalidInput(*path + ": '" + arr->source_dtype +
                         "' data beside a uint8 cache; allowed: K and V both a quantized cache's rows (uint8), or "
                         "both float data");
    }
  }
  if (!p.kv_quantized()) {
    throw InvalidInput(kp +
                       ": uint8 data is a quantized cache's rows, read in the layout --kv-dtype names; allowed: "
                       "--kv-dtype q8_0, q4_0, u8, u4, fp8_e4m3 or fp8_e5m2 with uint8 K and V, or float files");
  }
  if (const std::string dtype = flags.settings.text("dtype"); !dtype.empty() && parse_dtype(dtype) != DType::F32) {
    throw InvalidInput("dtype: " + dtype + " with a quantized cache; allowed: f32 (Q is float32 beside a " +
                       to_string(p.kv_dtype) + " cache)");
  }
  p.head_dim_v = raw_cache_dim_v(p.kv_dtype, p.head_dim, li.k.shape[3], li.v.shape[3], kp, vp);
  p.dtype = DType::F32;
  p.validate();
  widen_to_float(li.q);
  li.stored = allocate_tensors(p);
  Inputs& in = li.stored.inputs;
  std::memcpy(const_cast<float*>(in.q.data), li.q.data.data(), static_cast<size_t>(p.q_elems()) * sizeof(float));
  std::memcpy(const_cast<std::byte*>(in.kq.data), li.k.bytes8.data(), li.k.bytes8.size());
  std::memcpy(const_cast<std::byte*>(in.vq.data), li.v.bytes8.data(), li.v.bytes8.size());
  li.inputs = in;
}

LoadedInputs load_contiguous(const std::string& qp, const std::string& kp, const std::string& vp,
                             const MaskFlags& flags) {
  LoadedInputs li;
  li.q = read_npy(qp);
  li.k = read_npy_cache(kp);
  li.v = read_npy_cache(vp);
  const bool raw = li.k.source_dtype == "|u1" || li.v.source_dtype == "|u1";
  Problem& p = li.problem;
  flags.apply(p);
  p.kv_block = 0;  // read as a contiguous cache first
  size_from_arrays(p, ArrayShapes{li.q.shape, li.k.shape, li.v.shape, qp, kp, vp, raw});
  if (raw) {
    load_raw_cache(li, kp, vp, flags);
    return li;
  }
  p.validate();
  p.dtype = storage_dtype(flags, {{&qp, &li.q}, {&kp, &li.k}, {&vp, &li.v}});
  if (p.kv_quantized()) {  // the cache written from the files' float K and V (kv_quant.hpp)
    if (!float_data(li)) {
      throw InvalidInput(std::string("kv_dtype: ") + to_string(p.kv_dtype) +
                         " is written from float32/float64 .npy data; allowed: float files, or --kv-dtype dtype");
    }
    p.validate();
    Inputs f32;
    f32.q = make_view<const float>(li.q.data.data(), p.batch, p.q_heads, p.q_len, p.head_dim, p.layout);
    f32.k = make_view<const float>(li.k.data.data(), p.batch, p.kv_heads, p.kv_len, p.head_dim, p.layout);
    f32.v = make_view<const float>(li.v.data.data(), p.batch, p.kv_heads, p.kv_len, p.dim_v(), p.layout);
    li.stored = convert_inputs(p, f32);
    li.inputs = li.stored.inputs;
    return li;
  }
  if (float_files(li)) {  // the files' own float32 data, uncopied
    li.inputs.q = make_view<const float>(li.q.data.data(), p.batch, p.q_heads, p.q_len, p.head_dim, p.layout);
    li.inputs.k = make_view<const float>(li.k.data.data(), p.batch, p.kv_heads, p.kv_len, p.head_dim, p.layout);
    li.inputs.v = make_view<const float>(li.v.data.data(), p.batch, p.kv_heads, p.kv_len, p.dim_v(), p.layout);
    return li;
  }
  li.stored = allocate_tensors(p);
  li.inputs = li.stored.inputs;
  visit_inputs(li.inputs, [&](const auto& dst) {
    store(li.q, dst.q);
    store(li.k, dst.k);
    store(li.v, dst.v);
  });
  return li;
}
}  // namespace

namespace {
// Non-finite values of a dense typed view: {count, first flat index}.
template <class E>
std::pair<size_t, size_t> nonfinite(const View4<const E>& v) {
  size_t count = 0, first = 0;
  const int64_t n = v.elems();
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(to_float(v.data[i]))) {
      if (count++ == 0) first = static_cast<size_t>(i);
    }
  }
  return {count, first};
}
size_t source_nonfinite(const NpyArray& a) {
  size_t n = 0;
  for (float x : a.data) n += !std::isfinite(x);
  for (uint16_t b : a.bits16) n += a.source_dtype == "<f2" ? (b & 0x7c00u) == 0x7c00u : (b & 0x7f80u) == 0x7f80u;
  return n;
}
void warn_one(const std::string& name, size_t count, size_t first, size_t made, DType dtype) {
  if (count == 0) return;
  std::cerr << "warning: " << name << " holds " << count << " NaN/Inf value(s), first at flat index " << first;
  if (made > 0) std::cerr << " (" << made << " of them overflowed to inf when rounded to " << to_string(dtype) << ")";
  std::cerr << "; every row that sees one gets NaN output (masked positions never leak)\n";
}
}  // namespace

void warn_nonfinite(const LoadedInputs& li) {
  const Problem& p = li.problem;
  if (float_files(li) || li.problem.kv_quantized()) {  // (a quantized cache is written from float files)
    // Exponent bits all ones = NaN or Inf. Branch-free, so the scan vectorizes: it reads
    // every input once, at memory speed.
    for (auto [name, arr] : {std::pair{"Q", &li.q}, {"K", &li.k}, {"V", &li.v}}) {
      size_t count = 0;
      for (float x : arr->data) count += (std::bit_cast<uint32_t>(x) & 0x7f800000u) == 0x7f800000u;
      if (count == 0) continue;
      size_t first = 0;
      while (std::isfinite(arr->data[first])) ++first;
      warn_one(name, count, first, 0, p.dtype);
    }
    return;
  }
  visit_inputs(li.inputs, [&](const auto& t) {
    for (auto [name, view, arr] : {std::tuple{"Q", t.q, &li.q}, {"K", t.k, &li.k}, {"V", t.v, &li.v}}) {
      const auto [count, first] = nonfinite(view);
      warn_one(name, count, first, count - std::min(count, source_nonfinite(*arr)), p.dtype);
    }
  });
}

}  // namespace attnlab::cli
