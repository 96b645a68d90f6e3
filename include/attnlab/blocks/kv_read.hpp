// The read rule of each quantized KV-cache layout (kv_quant.hpp), inline: the one definition that
// dequantize_row (attn_core: the reference, the baseline, naive) calls, row() per row and value()
// per value. The tile engine (flash, decode) reads the same values in registers, kLanes at a time
// (src/cpu/simd/kv_load.hpp: value() for its tails and on the scalar and NEON targets, vector
// code on AVX2/AVX-512 checked bit for bit against row() by
// SimdMath.QuantizedCacheRowsReadInRegistersAsTheRule). Same values everywhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attnlab/dtype.hpp"
#include "attnlab/kv_quant.hpp"

namespace attnlab::kv_read {

#define ATTN_KV_INLINE inline __attribute__((always_inline))
// What the CUDA decode calls too (value() and what it reads with): host and device.
#if defined(__CUDACC__)
#define ATTN_KV_HD __host__ __device__ __forceinline__
#else
#define ATTN_KV_HD ATTN_KV_INLINE
#endif

ATTN_KV_HD float scale_f16(const std::byte* p) {
#if defined(__CUDA_ARCH__)  // (rows are byte-aligned: no wider load)
  const auto bits = static_cast<uint16_t>(static_cast<unsigned>(p[0]) | static_cast<unsigned>(p[1]) << 8);
#else
  uint16_t bits;
  std::memcpy(&bits, p, 2);
#endif
  return to_float(f16{bits});
}
ATTN_KV_HD float load_f32(const std::byte* p) {
#if defined(__CUDA_ARCH__)
  uint32_t bits = 0;
  for (int i = 3; i >= 0; --i) bits = bits << 8 | static_cast<unsigned>(p[i]);
  return dtype_detail::float_of(bits);
#else
  float v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}

// ggml's block_q8_0: x = d * q.
ATTN_KV_INLINE void q8_0(const std::byte* row, int64_t dim, float* __restrict y) {
  for (int64_t b = 0; b < dim / 32; ++b) {
    const std::byte* blk = row + b * 34;
    const float d = scale_f16(blk);
    const auto* q = reinterpret_cast<const int8_t*>(blk + 2);
    float* out = y + b * 32;
    for (int j = 0; j < 32; ++j) out[j] = d * static_cast<float>(q[j]);
  }
}

// ggml's block_q4_0: byte j holds value j (low nibble) and j + 16 (high); x = (nibble - 8) * d.
ATTN_KV_INLINE void q4_0(const std::byte* row, int64_t dim, float* __restrict y) {
  for (int64_t b = 0; b < dim / 32; ++b) {
    const std::byte* blk = row + b * 18;
    const float d = scale_f16(blk);
    const auto* qs = reinterpret_cast<const uint8_t*>(blk + 2);
    float* out = y + b * 32;
    for (int j = 0; j < 16; ++j) {
      out[j] = static_cast<float>((qs[j] & 0x0f) - 8) * d;
      out[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

// A row's float32 scale and zero point, then u8 values (u4: two per byte, the even one low):
// x = (q - zp) * scale.
ATTN_KV_INLINE void u8(const std::byte* row, int64_t dim, float* __restrict y) {
  const float scale = load_f32(row), zp = load_f32(row + 4);
  const auto* q = reinterpret_cast<const uint8_t*>(row + 8);
  for (int64_t i = 0; i < dim; ++i) y[i] = (static_cast<float>(q[i]) - zp) * scale;
}
ATTN_KV_INLINE void u4(const std::byte* row, int64_t dim, float* __restrict y) {
  const float scale = load_f32(row), zp = load_f32(row + 4);
  const auto* q = reinterpret_cast<const uint8_t*>(row + 8);
  for (int64_t i = 0; i < dim / 2; ++i) {
    y[2 * i] = (static_cast<float>(q[i] & 0x0f) - zp) * scale;
    y[2 * i + 1] = (static_cast<float>(q[i] >> 4) - zp) * scale;
  }
  if (dim % 2) y[dim - 1] = (static_cast<float>(q[dim / 2] & 0x0f) - zp) * scale;
}

// OCP FP8 through binary16, exactly: E5M2 is binary16's top byte; E4M3's exponent and
// mantissa placed in binary16's are its value times 2^-8 (subnormals included), and its one
// NaN code (S.1111.111) has no binary16 counterpart, so it is made NaN by hand.
ATTN_KV_HD float e5m2(uint8_t b) { return to_float(f16{static_cast<uint16_t>(b << 8)}); }
ATTN_KV_HD float e4m3(uint8_t b) {
  const auto h = static_cast<uint16_t>(((b & 0x80u) << 8) | ((b & 0x7fu) << 7));
  const float v = to_float(f16{h}) * 256.0f;
  return (b & 0x7fu) == 0x7fu ? dtype_detail::float_of(0x7fc00000u | (uint32_t{b & 0x80u} << 24)) : v;
}
// The 256 values of each format, from the two rules above (a lookup per value: the rules'
// branches keep their loops from vectorizing, and made the read-back 3x slower).
struct Fp8Tables {
  float e4[256], e5[256];
};
inline const Fp8Tables& fp8_tables() {
  static const Fp8Tables t = [] {
    Fp8Tables x{};
    for (int b = 0; b < 256; ++b) x.e4[b] = e4m3(static_cast<uint8_t>(b)), x.e5[b] = e5m2(static_cast<uint8_t>(b));
    return x;
  }();
  return t;
}
ATTN_KV_INLINE void fp8(bool e4, const std::byte* row, int64_t dim, float* __restrict y, float scale) {
  const auto* q = reinterpret_cast<const uint8_t*>(row);
  const float* table = e4 ? fp8_tables().e4 : fp8_tables().e5;
  for (int64_t i = 0; i < dim; ++i) y[i] = table[q[i]] * scale;
}

// Value i of a row (the same rule, one value: the kernels' tails and the scalar target).
ATTN_KV_HD float value(KvDType t, const std::byte* r, int64_t i, float tensor_scale) {
  const auto* u = reinterpret_cast<const uint8_t*>(r);
  switch (t) {
    case KvDType::Q8_0: {
      const std::byte* blk = r + i / 32 * 34;
      return scale_f16(blk) * static_cast<float>(static_cast<int8_t>(u[i / 32 * 34 + 2 + i % 32]));
    }
    case KvDType::Q4_0: {
      const std::byte* blk = r + i / 32 * 18;
      const uint8_t byte = u[i / 32 * 18 + 2 + i % 16];
      return static_cast<float>((i % 32 < 16 ? byte & 0x0f : byte >> 4) - 8) * scale_f16(blk);
    }
    case KvDType::U8: return (static_cast<float>(u[8 + i]) - load_f32(r + 4)) * load_f32(r);
    case KvDType::U4: {
      const uint8_t byte = u[8 + i / 2];
      return (static_cast<float>(i % 2 ? byte >> 4 : byte & 0x0f) - load_f32(r + 4)) * load_f32(r);
    }
#if defined(__CUDA_ARCH__)  // (the tables are host memory: the rules they are made of)
    case KvDType::Fp8E4M3: return e4m3(u[i]) * tensor_scale;
    case KvDType::Fp8E5M2: return e5m2(u[i]) * tensor_scale;
#else
    case KvDType::Fp8E4M3: return fp8_tables().e4[u[i]] * tensor_scale;
    case KvDType::Fp8E5M2: return fp8_tables().e5[u[i]] * tensor_scale;
#endif
    case KvDType::Same: break;
  }
  return 0.f;
}

// One row of `dim` values (the rule of dequantize_row).
ATTN_KV_INLINE void row(KvDType t, const std::byte* r, int64_t dim, float* y, float tensor_scale) {
  switch (t) {
    case KvDType::Q8_0: return q8_0(r, dim, y);
    case KvDType::Q4_0: return q4_0(r, dim, y);
    case KvDType::U8: return u8(r, dim, y);
    case KvDType::U4: return u4(r, dim, y);
    case KvDType::Fp8E4M3: return fp8(true, r, dim, y, tensor_scale);
    case KvDType::Fp8E5M2: return fp8(false, r, dim, y, tensor_scale);
    case KvDType::Same: return;
  }
}

#undef ATTN_KV_INLINE
#undef ATTN_KV_HD

}  // namespace attnlab::kv_read
