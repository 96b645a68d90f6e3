// The tolerance a peer's output is judged with (peers.hpp): the point's float32 policy, or the
// policy of the arithmetic a peer does on its own cache types and precisions, and what a peer's
// own rounding of its inputs costs.
#include "bench/peers/peers.hpp"

#include <algorithm>
#include <cmath>

#include "attnlab/kv_quant.hpp"

namespace attnlab::bench {

StoredAsFloat stored_as_float(const Problem& p, const Inputs& in) {
  StoredAsFloat f{p, {}};
  f.problem.dtype = DType::F32, f.problem.kv_dtype = KvDType::Same;
  f.tensors = allocate_tensors(f.problem);
  const auto widen = [&](const auto& from, const ConstView& to) {
    for (int64_t b = 0; b < to.batch; ++b)
      for (int64_t h = 0; h < to.heads; ++h)
        for (int64_t s = 0; s < to.seq; ++s)
          for (int64_t d = 0; d < to.dim; ++d) const_cast<float*>(to.row(b, h, s))[d] = to_float(from.row(b, h, s)[d]);
  };
  if (p.kv_quantized()) {  // (the dequantized buffers are gone after this statement: copy now)
    const DequantizedKv d = dequantize_kv(p, in);
    widen(in.q, f.tensors.inputs.q), widen(d.inputs.k, f.tensors.inputs.k), widen(d.inputs.v, f.tensors.inputs.v);
    return f;
  }
  visit_inputs(in, [&](const auto& t) {
    widen(t.q, f.tensors.inputs.q), widen(t.k, f.tensors.inputs.k), widen(t.v, f.tensors.inputs.v);
  });
  return f;
}

namespace {

// Whether a GgmlCache peer (ggml_fa) keeps the point in one of ggml's own cache types (llama.cpp's
// f16, q8_0, q4_0): it runs those points, on their stored values as floats, with the tolerance its
// arithmetic implies.
bool ggml_own_cache(PeerPolicy policy, const Problem& p) {
  return policy == PeerPolicy::GgmlCache &&
         (p.dtype == DType::F16 || p.kv_dtype == KvDType::Q8_0 || p.kv_dtype == KvDType::Q4_0);
}

}  // namespace

// Whether a peer keeps a point's 16-bit or quantized cache in a cache of its own that holds the
// lab's values, by its catalogue policy: GgmlCache (above); OpenvinoStateCache - OpenVINO's
// stateful decode keeps an f16 cache (the stored values exactly) or its u8 cache, whose
// per-(token, head) scale and zero point are the lab's u8 rule (re-quantizing the lab's
// dequantized rows gives back their codes), with float32 arithmetic: the float32 policy holds;
// and Bf16Products on bf16 points, run in the peer's bf16 arithmetic (OpenVINO's bf16 hint,
// zentorch's bf16 tensors: judged as flash_bf16's). Every other peer runs float32 points only.
bool peer_keeps_own_cache(const std::string& kernel, const Problem& p) {
  const PeerPolicy policy = peer_policy(kernel);
  switch (policy) {
    case PeerPolicy::Bf16Products: return p.dtype == DType::BF16 && !p.kv_quantized();
    case PeerPolicy::OpenvinoStateCache:
      return (p.dtype == DType::F16 && !p.kv_quantized()) ||
             (p.dtype == DType::F32 && (p.kv_dtype == KvDType::U8 || p.kv_dtype == KvDType::U4));
    case PeerPolicy::OrtIntCache: return p.dtype == DType::F32 && p.kv_quantized() && kv_int_dot(p.kv_dtype);
    default: return ggml_own_cache(policy, p);
  }
}

namespace {

// Each row of a float32 view (a StoredAsFloat copy), with its length, to round in place.
template <class F>
void for_each_row(const ConstView& v, F&& f) {
  for (int64_t b = 0; b < v.batch; ++b)
    for (int64_t h = 0; h < v.heads; ++h)
      for (int64_t s = 0; s < v.seq; ++s) f(const_cast<float*>(v.row(b, h, s)), v.dim);
}

// What a peer's own rounding of its inputs costs: the largest change, over the reference's rows and
// relative to each row's scale, of the float64 O when the point's stored values are rounded by
// `round` (applied to a float32 copy) - a peer doing that arithmetic may err kFactor times this more.
template <class F>
double rounding_cost(const Problem& p, const Inputs& in, const Agreement& ag, F&& round) {
  StoredAsFloat f = stored_as_float(p, in);
  round(f.tensors);
  const Reference rounded = reference(f.problem, f.tensors.inputs, ag.ref.rows);
  double cost = 0;
  for (size_t r = 0; r < rounded.rows.size(); ++r) {
    const double scale = ag.ref.row_scale[r] > 0 ? ag.ref.row_scale[r] : 1.0;
    for (int64_t d = 0; d < rounded.dim; ++d) {
      const size_t x = r * static_cast<size_t>(rounded.dim) + static_cast<size_t>(d);
      if (std::isfinite(rounded.o[x]) && std::isfinite(ag.ref.o[x]))
        cost = std::max(cost, std::fabs(rounded.o[x] - ag.ref.o[x]) / scale);
    }
  }
  return cost;
}
}  // namespace

PeerTolerance peer_tolerance(const std::string& kernel, const Problem& p, const Inputs& in, const Agreement& ag) {
  const PeerPolicy policy = peer_policy(kernel);
  if (policy == PeerPolicy::Bf16Products && p.dtype == DType::BF16) {
    // OpenVINO's bf16 mode and zentorch's bf16 SDPA round the products' operands to bf16 as
    // flash_bf16 does (Q and K are bf16 already; P rounded): the policy verify.cpp holds flash_bf16
    // to (tolerance_for).
    return {tolerance_for(Arithmetic::Bf16Products, p, in, ag),
            "tolerance: the bf16-products policy (flash_bf16's: P rounded to bf16), for the peer's bf16 arithmetic"};
  }
  if (policy == PeerPolicy::OpenvinoSage) {
    // OpenVINO's sage path rounds Q and K to int8 per (token, head) - symmetric, amax / 127, the
    // rule round_q_row applies to a row - and V to its u8 cache (the lab's u8 rule), and takes P.V
    // in bf16 under its bf16 hint: the bf16-products policy, plus 4x what those roundings move the
    // float64 O.
    std::vector<int8_t> codes(static_cast<size_t>(p.head_dim));
    std::vector<std::byte> row_bytes(static_cast<size_t>(kv_row_bytes(KvDType::U8, p.dim_v())));
    const double cost = rounding_cost(p, in, ag, [&](Tensors& t) {
      const auto int8 = [&](float* row, int64_t dim) {
        float scale = 0;
        if (!round_q_row(KvDType::Same, row, dim, codes.data(), &scale)) return;  // NaN/Inf: unrounded
        for (int64_t i = 0; i < dim; ++i) row[i] = static_cast<float>(codes[static_cast<size_t>(i)]) * scale;
      };
      for_each_row(t.inputs.q, int8), for_each_row(t.inputs.k, int8);
      for_each_row(t.inputs.v, [&](float* row, int64_t dim) {
        quantize_row(KvDType::U8, row, dim, row_bytes.data());
        dequantize_row(KvDType::U8, row_bytes.data(), dim, row);
      });
    });
    PeerTolerance t{tolerance_for(Arithmetic::Bf16Products, p, in, ag), ""};
    t.tol.o_rel += Tolerance::kFactor * cost;
    char text[240];
    std::snprintf(text, sizeof text,
                  "tolerance: the bf16-products policy + 4 x %.2g (what rounding Q and K to int8 per token and V to "
                  "u8, as OpenVINO's sage path does, moves the float64 O)",
                  cost);
    t.rule = text;
    return t;
  }
  if (policy == PeerPolicy::OrtIntCache && peer_keeps_own_cache(kernel, p)) {
    // ONNX Runtime's quantized GQA cache (scripts/peers/ort_peer.py: int_cache): K and V rounded per
    // (kv head, channel) against max |x| over the batch and positions - 127 levels for the lab's u8 /
    // q8_0 points (kv_cache_bit_width 8), 7 for u4 / q4_0 (4) - float32 arithmetic on the values: the
    // float32 policy, plus 4x what that rounding of the stored values moves the float64 O.
    const int levels = p.kv_dtype == KvDType::U8 || p.kv_dtype == KvDType::Q8_0 ? 127 : 7;
    const double cost = rounding_cost(p, in, ag, [&](Tensors& t) {
      for (const ConstView* view : {&t.inputs.k, &t.inputs.v}) {
        const ConstView& x = *view;
        for (int64_t h = 0; h < x.heads; ++h) {
          for (int64_t c = 0; c < x.dim; ++c) {
            float amax = 0;
            for (int64_t b = 0; b < x.batch; ++b)
              for (int64_t s = 0; s < x.seq; ++s) amax = std::max(amax, std::fabs(x.row(b, h, s)[c]));
            const float scale = amax > 0 ? amax / static_cast<float>(levels) : 1.f;
            for (int64_t b = 0; b < x.batch; ++b) {
              for (int64_t s = 0; s < x.seq; ++s) {
                float& v = const_cast<float*>(x.row(b, h, s))[c];
                if (std::isfinite(v))
                  v = std::clamp(std::nearbyint(v / scale), -static_cast<float>(levels), static_cast<float>(levels)) *
                      scale;
              }
            }
          }
        }
      }
    });
    PeerTolerance t{ag.tol, ""};
    t.tol.o_rel += Tolerance::kFactor * cost;
    char text[240];
    std::snprintf(text, sizeof text,
                  "tolerance: the float32 policy's + 4 x %.2g (what rounding K and V per kv head and channel to %d "
                  "levels a side, as ONNX Runtime's %s GQA cache does, moves the float64 O)",
                  cost, levels, levels == 127 ? "int8" : "int4");
    t.rule = text;
    return t;
  }
  if (!ggml_own_cache(policy, p)) return {ag.tol, ""};
  PeerTolerance t{ag.tol, ""};
  if (p.dtype == DType::F16) {
    // Q is already f16-exact; ggml accumulates P.V for an F16 V in f16 (11-bit significand).
    t.tol.o_rel += kGgmlF16Accumulation;
    t.rule = "tolerance: the float32 policy's + 2^-9 (ggml accumulates P.V in f16 for an F16 V)";
    return t;
  }
  // ggml rounds Q to q8_0 for its dot products with a q8_0/q4_0 K: the float64 attention with Q
  // so rounded differs from the reference by what that rounding costs; the peer may err 4x it more.
  std::vector<std::byte> block(static_cast<size_t>(kv_row_bytes(KvDType::Q8_0, p.head_dim)));
  const double cost = rounding_cost(p, in, ag, [&](Tensors& t) {
    for_each_row(t.inputs.q, [&](float* row, int64_t dim) {
      quantize_row(KvDType::Q8_0, row, dim, block.data());
      dequantize_row(KvDType::Q8_0, block.data(), dim, row);
    });
  });
  t.tol.o_rel += Tolerance::kFactor * cost;
  char text[200];
  std::snprintf(text, sizeof text,
                "tolerance: the float32 policy's + 4 x %.2g (what rounding Q to q8_0, as ggml does for a %s K, moves "
                "the float64 O)",
                cost, to_string(p.kv_dtype));
  t.rule = text;
  return t;
}

}  // namespace attnlab::bench
