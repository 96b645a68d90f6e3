// The quantized KV-cache layouts' write rules (include/attnlab/kv_quant.hpp); the read rule is
// include/attnlab/blocks/kv_read.hpp's, inline, shared with the per-target kernels.
#include "attnlab/kv_quant.hpp"
#include "attnlab/blocks/kv_read.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnlab/dtype.hpp"
#include "attnlab/problem.hpp"

namespace attnlab {

namespace {

constexpr int64_t kBlock = 32;  // ggml's QK8_0 = QK4_0
const float kNaN = std::numeric_limits<float>::quiet_NaN();

void store_u16(std::byte* p, uint16_t v) { std::memcpy(p, &v, 2); }
void store_f32(std::byte* p, float v) { std::memcpy(p, &v, 4); }

bool all_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return false;
  }
  return true;
}

// ggml's quantize_row_q8_0_ref on one block.
void quantize_q8_0(const float* x, std::byte* out) {
  float amax = 0.0f;
  for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
  const bool finite = all_finite(x, kBlock);
  const float d = finite ? amax / 127.0f : kNaN;
  const float id = finite && d != 0.0f ? 1.0f / d : 0.0f;
  store_u16(out, to_f16(d).bits);
  auto* q = reinterpret_cast<int8_t*>(out + 2);
  for (int64_t j = 0; j < kBlock; ++j) q[j] = finite ? static_cast<int8_t>(std::roundf(x[j] * id)) : 0;
}

// ggml's quantize_row_q4_0_ref on one block.
void quantize_q4_0(const float* x, std::byte* out) {
  float amax = 0.0f, max = 0.0f;
  for (int64_t j = 0; j < kBlock; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const bool finite = all_finite(x, kBlock);
  const float d = finite ? max / -8.0f : kNaN;
  const float id = finite && d != 0.0f ? 1.0f / d : 0.0f;
  store_u16(out, to_f16(d).bits);
  auto* qs = reinterpret_cast<uint8_t*>(out + 2);
  if (!finite) {
    std::memset(qs, 0, kBlock / 2);
    return;
  }
  for (int64_t j = 0; j < kBlock / 2; ++j) {
    // (int8_t) truncates toward zero, as ggml's cast: x / d + 8.5 lies in [0.5, 16.5] here.
    const auto lo = static_cast<uint8_t>(std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f))));
    const auto hi =
        static_cast<uint8_t>(std::min(15, static_cast<int>(static_cast<int8_t>(x[j + kBlock / 2] * id + 8.5f))));
    qs[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

// Per-row asymmetric (u8: levels 255, u4: 15).
void quantize_asym(const float* x, int64_t dim, int levels, std::byte* out) {
  float lo = x[0], hi = x[0];
  for (int64_t i = 1; i < dim; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  const bool finite = all_finite(x, dim);
  float scale = (hi - lo) / static_cast<float>(levels);
  if (scale == 0.0f) scale = 1.0f;  // a constant row: q = 0 reads back as lo exactly
  const float zp = finite ? -lo / scale : 0.0f;
  if (!finite) scale = kNaN;
  store_f32(out, scale);
  store_f32(out + 4, zp);
  auto* q = reinterpret_cast<uint8_t*>(out + 8);
  if (levels == 15) std::memset(q, 0, static_cast<size_t>((dim + 1) / 2));
  for (int64_t i = 0; i < dim; ++i) {
    const float r = finite ? std::nearbyint(x[i] / scale + zp) : 0.0f;
    const auto v = static_cast<uint8_t>(std::clamp(r, 0.0f, static_cast<float>(levels)));
    if (levels == 255) {
      q[i] = v;
    } else {
      q[i / 2] = static_cast<uint8_t>(q[i / 2] | (i % 2 == 0 ? v : v << 4));
    }
  }
}

// OCP FP8 (written here; read by kv_read.hpp): `e` exponent bits, `m` mantissa bits, bias
// 2^(e-1) - 1; E4M3 spends its top code (S.1111.111) on NaN and has no infinities, E5M2 is
// IEEE-like.
struct Fp8 {
  int e, m;
  bool ieee;
  int bias() const { return (1 << (e - 1)) - 1; }
  float max_finite() const {
    return ieee ? std::ldexp(2.0f - std::ldexp(1.0f, -m), (1 << e) - 2 - bias())      // 57344
                : std::ldexp(2.0f - std::ldexp(1.0f, 1 - m), (1 << e) - 1 - bias());  // 448
  }
  uint8_t encode(float x) const {
    const uint8_t sign = std::signbit(x) ? 0x80 : 0;
    if (std::isnan(x)) return static_cast<uint8_t>(sign | 0x7f);  // E4M3's NaN; one of E5M2's
    const float a = std::fabs(x);
    const uint8_t max_code = ieee ? static_cast<uint8_t>((((1 << e) - 2) << m) | ((1 << m) - 1))
                                  : static_cast<uint8_t>((((1 << e) - 1) << m) | ((1 << m) - 2));
    if (std::isinf(a)) return static_cast<uint8_t>(sign | (ieee ? ((1 << e) - 1) << m : max_code));
    // Round to the grid of a's binade (the subnormal grid below the smallest normal),
    // nearest even (the default rounding mode of nearbyint).
    int ex = 0;
    std::frexp(a, &ex);
    const int unbiased = std::max(ex - 1, 1 - bias());
    const float quantum = std::ldexp(1.0f, unbiased - m);
    const float r = std::nearbyint(a / quantum) * quantum;
    if (r > max_finite()) return static_cast<uint8_t>(sign | max_code);  // saturate
    if (r == 0.0f) return sign;
    std::frexp(r, &ex);
    const int u = ex - 1;
    if (u < 1 - bias()) {  // subnormal
      return static_cast<uint8_t>(sign | static_cast<int>(r / std::ldexp(1.0f, 1 - bias() - m)));
    }
    const int man = static_cast<int>(r / std::ldexp(1.0f, u - m)) - (1 << m);
    return static_cast<uint8_t>(sign | ((u + bias()) << m) | man);
  }
};
constexpr Fp8 kE4M3{4, 3, false}, kE5M2{5, 2, true};

}  // namespace

const char* to_string(KvDType t) {
  switch (t) {
    case KvDType::Same: return "dtype";
    case KvDType::Q8_0: return "q8_0";
    case KvDType::Q4_0: return "q4_0";
    case KvDType::U8: return "u8";
    case KvDType::U4: return "u4";
    case KvDType::Fp8E4M3: return "fp8_e4m3";
    case KvDType::Fp8E5M2: return "fp8_e5m2";
  }
  return "?";
}

const std::vector<KvDType>& quantized_kv_dtypes() {
  static const std::vector<KvDType> all = {KvDType::Q8_0, KvDType::Q4_0,    KvDType::U8,
                                           KvDType::U4,   KvDType::Fp8E4M3, KvDType::Fp8E5M2};
  return all;
}

KvDType parse_kv_dtype(const std::string& text) {
  if (text == to_string(KvDType::Same)) return KvDType::Same;
  std::string names = to_string(KvDType::Same);
  for (KvDType t : quantized_kv_dtypes()) {
    if (text == to_string(t)) return t;
    names += std::string(", ") + to_string(t);
  }
  throw InvalidInput("kv_dtype: '" + text + "'; allowed: " + names);
}

int64_t kv_block_values(KvDType t) { return t == KvDType::Q8_0 || t == KvDType::Q4_0 ? kBlock : 1; }

bool kv_int_dot(KvDType t) { return t == KvDType::Q8_0 || t == KvDType::Q4_0 || t == KvDType::U8 || t == KvDType::U4; }

int64_t q_block_values(KvDType t, int64_t dim) { return t == KvDType::Q8_0 || t == KvDType::Q4_0 ? kBlock : dim; }

bool round_q_row(KvDType t, const float* x, int64_t dim, int8_t* q, float* scales) {
  return round_int8(x, dim, q_block_values(t, dim), q, scales);
}

bool int8_smoothing() {
  const char* v = std::getenv("ATTN_I8_SMOOTH");
  return !(v && std::string(v) == "0");
}

bool key_mean(const float* rows, int64_t ld, int64_t n, int64_t dim, float* mean) {
  std::fill(mean, mean + dim, 0.f);
  if (n == 0) return true;
  if (!int8_smoothing()) {  // no mean; still no rounding for a head holding NaN or Inf
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < dim; ++i)
        if (!std::isfinite(rows[j * ld + i])) return false;
    return true;
  }
  std::vector<double> sum(static_cast<size_t>(dim), 0.0);
  for (int64_t j = 0; j < n; ++j) {
    const float* r = rows + j * ld;
    for (int64_t i = 0; i < dim; ++i) {
      if (!std::isfinite(r[i])) return false;
      sum[static_cast<size_t>(i)] += r[i];
    }
  }
  for (int64_t i = 0; i < dim; ++i) mean[i] = static_cast<float>(sum[static_cast<size_t>(i)] / static_cast<double>(n));
  return true;
}

bool round_smoothed_key(const float* x, const float* mean, int64_t dim, int8_t* q, float* scale) {
  float centred[Problem::kMaxHeadDim];
  if (dim > Problem::kMaxHeadDim) throw std::logic_error("round_smoothed_key: dim past Problem::kMaxHeadDim");
  for (int64_t i = 0; i < dim; ++i) centred[i] = x[i] - mean[i];
  return round_int8(centred, dim, dim, q, scale);  // false: x - mean overflowed (|x| near FLT_MAX)
}

namespace {
// One value's int8 code against its scale: roundf's rule (half away from zero) without its libm
// call, which was most of a decode task's Q rounding: |x / scale| <= 127 up to one rounding of the
// division, so the int conversion is exact; then clamped, so |q| <= 127 always.
int8_t int8_code(float x, float scale) {
  const float y = scale > 0.f ? x / scale : 0.f;
  auto r = static_cast<int32_t>(y);  // toward zero
  const float frac = y - static_cast<float>(r);
  r += frac >= 0.5f ? 1 : frac <= -0.5f ? -1 : 0;
  return static_cast<int8_t>(std::clamp(r, -127, 127));
}
}  // namespace

bool round_int8(const float* x, int64_t dim, int64_t block, int8_t* q, float* scales) {
  for (int64_t i = 0; i < dim; ++i) {
    if (!std::isfinite(x[i])) return false;
  }
  for (int64_t b0 = 0; b0 < dim; b0 += block) {
    const int64_t n = std::min(block, dim - b0);
    float amax = 0.f;
    for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[b0 + i]));
    const float scale = amax / 127.f;
    scales[b0 / block] = scale;
    for (int64_t i = 0; i < n; ++i) q[b0 + i] = int8_code(x[b0 + i], scale);
  }
  return true;
}

bool round_v_channels(const float* rows, int64_t ld, int64_t n, int64_t dv, int8_t* codes, float* scales) {
  std::fill(scales, scales + dv, 0.f);
  for (int64_t j = 0; j < n; ++j) {
    const float* r = rows + j * ld;
    for (int64_t c = 0; c < dv; ++c) {
      if (!std::isfinite(r[c])) return false;
      scales[c] = std::max(scales[c], std::fabs(r[c]));
    }
  }
  for (int64_t c = 0; c < dv; ++c) scales[c] /= 127.f;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < dv; ++c) codes[j * dv + c] = int8_code(rows[j * ld + c], scales[c]);
  return true;
}

bool p_codes_signed(KvDType t) { return t == KvDType::Q4_0; }

bool round_p_tile(const float* w, int64_t n, bool is_signed, int32_t* codes, float* quantum) {
  float wmax = 0.f;
  for (int64_t j = 0; j < n; ++j) {
    if (!std::isfinite(w[j]) || (!is_signed && w[j] < 0.f)) return false;
    wmax = std::max(wmax, std::fabs(w[j]));
  }
  const int32_t levels = is_signed ? 127 : 255;
  if (!(wmax > 0.f)) {
    std::fill(codes, codes + n, 0);
    *quantum = 0.f;
    return true;
  }
  const float inv = static_cast<float>(levels) / wmax;
  if (!std::isfinite(inv)) return false;  // weights below FLT_MIN x L: no step to round them to
  for (int64_t j = 0; j < n; ++j) {
    const auto c = static_cast<int32_t>(std::nearbyint(w[j] * inv));
    codes[j] = std::clamp(c, is_signed ? -levels : 0, levels);
  }
  *quantum = wmax / static_cast<float>(levels);
  return true;
}

int64_t kv_row_bytes(KvDType t, int64_t dim) {
  switch (t) {
    case KvDType::Q8_0: return dim / kBlock * (2 + kBlock);
    case KvDType::Q4_0: return dim / kBlock * (2 + kBlock / 2);
    case KvDType::U8: return 8 + dim;
    case KvDType::U4: return 8 + (dim + 1) / 2;
    case KvDType::Fp8E4M3:
    case KvDType::Fp8E5M2: return dim;
    case KvDType::Same: break;
  }
  throw std::logic_error("kv_row_bytes: KvDType::Same has no row layout of its own");
}

void quantize_row(KvDType t, const float* x, int64_t dim, std::byte* out, float tensor_scale) {
  switch (t) {
    case KvDType::Q8_0:
      for (int64_t b = 0; b < dim / kBlock; ++b) quantize_q8_0(x + b * kBlock, out + b * (2 + kBlock));
      return;
    case KvDType::Q4_0:
      for (int64_t b = 0; b < dim / kBlock; ++b) quantize_q4_0(x + b * kBlock, out + b * (2 + kBlock / 2));
      return;
    case KvDType::U8: return quantize_asym(x, dim, 255, out);
    case KvDType::U4: return quantize_asym(x, dim, 15, out);
    case KvDType::Fp8E4M3:
    case KvDType::Fp8E5M2: {
      const Fp8& f = t == KvDType::Fp8E4M3 ? kE4M3 : kE5M2;
      auto* q = reinterpret_cast<uint8_t*>(out);
      for (int64_t i = 0; i < dim; ++i) q[i] = f.encode(x[i] / tensor_scale);
      return;
    }
    case KvDType::Same: break;
  }
  throw std::logic_error("quantize_row: KvDType::Same");
}

void dequantize_row(KvDType t, const std::byte* row, int64_t dim, float* y, float tensor_scale) {
  if (t == KvDType::Same) throw std::logic_error("dequantize_row: KvDType::Same");
  kv_read::row(t, row, dim, y, tensor_scale);
}

void store_row(KvDType t, DType dtype, const float* x, int64_t dim, std::byte* out, float tensor_scale) {
  if (t != KvDType::Same) return quantize_row(t, x, dim, out, tensor_scale);
  visit_dtype(dtype, [&](auto e) {
    using E = decltype(e);
    E* dst = reinterpret_cast<E*>(out);
    for (int64_t i = 0; i < dim; ++i) dst[i] = from_float<E>(x[i]);
  });
}

void load_row(KvDType t, DType dtype, const std::byte* row, int64_t dim, float* y, float tensor_scale) {
  if (t != KvDType::Same) return dequantize_row(t, row, dim, y, tensor_scale);
  visit_dtype(dtype, [&](auto e) {
    using E = decltype(e);
    const E* src = reinterpret_cast<const E*>(row);
    for (int64_t i = 0; i < dim; ++i) y[i] = to_float(src[i]);
  });
}

float fp8_e4m3_to_float(uint8_t b) { return kv_read::e4m3(b); }
float fp8_e5m2_to_float(uint8_t b) { return kv_read::e5m2(b); }
uint8_t float_to_fp8_e4m3(float x) { return kE4M3.encode(x); }
uint8_t float_to_fp8_e5m2(float x) { return kE5M2.encode(x); }

}  // namespace attnlab
