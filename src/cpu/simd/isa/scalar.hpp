// The scalar target's floor: one float per "vector" (scalar_batch.hpp), compiled without
// vectorization - the baseline the vector targets' speed-ups are quoted against. Every primitive
// in plain arithmetic; no vector unit (absent.hpp). The vocabulary is isa.hpp's.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "attnlab/dtype.hpp"
#include "attnlab/kv_quant.hpp"
#include "cpu/simd/isa/scalar_batch.hpp"

namespace attnlab::ATTN_TARGET_NS::simd {

using Batch = ScalarBatch;
inline constexpr int kLanes = 1;
inline constexpr const char* kIsaName = "scalar";
inline constexpr int kVectorRegisters = 16;
inline constexpr bool kCheapScale = true;  // one float: exp2's two-factor 2^n is as cheap
inline constexpr bool kRegisterTranspose = false;
inline constexpr bool kEvenOddBf16 = false;
inline constexpr bool kKvVector = false;
inline constexpr bool kI8Vector = false;
inline constexpr bool kI8Sdot = false;
inline constexpr const char* kI8Unit = "";  // the scalar rule
inline constexpr const char* kI8ScoreUnit = kI8Unit;
inline constexpr int kI8Chunk = 64;

inline Batch abs_of(Batch a) { return Batch(std::fabs(a.v)); }
inline float reduce_sum(Batch v) { return v.v; }
inline float reduce_max(Batch v) { return v.v; }

namespace detail {
// n is integral and, once x >= lo, in [-126, 129]: 2^n is applied as two factors 2^(n/2), so
// p * 2^128 with p < 1 stays finite.
inline float pow2i(int e) {  // 2^e for e in [-126, 127]
  const uint32_t bits = static_cast<uint32_t>(e + 127) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline Batch scale_or_zero(Batch p, Batch n, Batch x, float lo) {
  if (x.v != x.v) return x;
  if (x.v < lo) return Batch(0.f);
  const int ni = static_cast<int>(n.v), half = ni >> 1;
  return Batch((p.v * pow2i(half)) * pow2i(ni - half));
}
inline Batch scale_nonpositive_or_zero(Batch p, Batch n, Batch x) { return scale_or_zero(p, n, x, -126.f); }
inline Batch clamp_hi(Batch x, float hi) { return x.v > hi ? Batch(hi) : x; }
}  // namespace detail

inline Batch transpose_sum(const Batch* rows) { return rows[0]; }
inline Batch load_partial(const float* p, int n, float fill = 0.f) { return Batch(n > 0 ? p[0] : fill); }
inline Batch keep_bits(Batch x, uint32_t bits, float fill) { return bits & 1u ? x : Batch(fill); }
inline void store_partial(float* p, Batch v, int n) {
  if (n > 0) p[0] = v.v;
}
inline Batch load_unaligned(const bf16* p) { return Batch(to_float(*p)); }
inline Batch load_unaligned(const f16* p) { return Batch(to_float(*p)); }
inline void keep_in_register(Batch&) {}

namespace i8_detail {
template <KvDType T>
int32_t sdot_codes(const int8_t* q, int32_t qsum, const uint8_t* u, int64_t d, int64_t b);  // NEON's (kI8Sdot)
}

}  // namespace attnlab::ATTN_TARGET_NS::simd

#include "cpu/simd/isa/absent.hpp"
