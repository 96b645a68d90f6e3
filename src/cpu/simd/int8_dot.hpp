// decode_i8's integer K.Q (Arithmetic::Int8Products, include/attnlab/kernel.hpp): a direct task's
// Q rows are rounded to int8 once (round_q_row, kv_quant.hpp: per 32-value block for q8_0 / q4_0,
// per row for u8 / u4), then every score of a q8_0, q4_0, u8 or u4 key is an exact int32 dot product
// of Q's codes with the cache's codes, the scales applied after (log2 units, as the float engine):
//   q8_0, q4_0  s = sum_b (dq_b scale log2e) dk_b I_b,   I_b = sum_{i in b} q_i c_i
//               (c: q8_0's int8 code; q4_0's nibble - 8, i.e. sum q nib - 8 sum_b q)
//   u8, u4      s = (dq scale log2e) sc (I - zp sum q),  I = sum_i q_i c_i (c: the code 0..255 / 0..15)
// score_row_rule is the definition (the scalar target runs it). The avx512 and avx2 targets compute
// the same integers with vpdpbusd where the CPU has AVX512-VNNI resp. AVX-VNNI (unsigned bytes x
// signed bytes, four products summed per 32-bit lane, never saturating): K's codes are the unsigned
// operand - q8_0's as c + 128 (one xor), the extra 128 sum q taken back by starting each lane's
// accumulator at -128 x (its four q's), q4_0's -8 the same way - and Q's codes the signed one, stored
// in the order K's codes unpack in (nibbles: the lows, then the highs), so no K byte is shuffled.
// Elsewhere vpmaddubsw + vpmaddwd make the same sums (score_rows_i8 says how). Block types convert
// each lane to float and scale it by its block's dq dk; row types add the row in int32, scale once.
// Why: a widened code costs a load, two conversions and a multiply per lane before its FMA
// (kv_load.hpp); vpdpbusd does four products per lane in one instruction, on the codes as stored.
#pragma once

#ifndef ATTN_TARGET_NS
#error "src/cpu/simd/ is per-target code: include it only from ATTN_TARGET_SOURCES (src/cpu/target.hpp)"
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attnlab/kv_quant.hpp"
#include "attnlab/kv_read.hpp"
#include "attnlab/problem.hpp"
#include "cpu/simd/kv_load.hpp"
#include "cpu/simd/microkernel.hpp"

namespace attnlab::ATTN_TARGET_NS::simd {

template <class E>
inline constexpr bool kIntDot = false;
template <>
inline constexpr bool kIntDot<Quant<KvDType::Q8_0>> = true;
template <>
inline constexpr bool kIntDot<Quant<KvDType::Q4_0>> = true;
template <>
inline constexpr bool kIntDot<Quant<KvDType::U8>> = true;
template <>
inline constexpr bool kIntDot<Quant<KvDType::U4>> = true;

inline constexpr bool is_row_type(KvDType t) { return t == KvDType::U8 || t == KvDType::U4; }

// The VNNI unit of this target (the ISA name the CPU must run for vpdpbusd, isa.cpp), and the
// values a vector step takes. Without it (or with ATTN_NO_VNNI=1 in the environment: tests and
// comparisons) the same sums come from vpmaddubsw + vpmaddwd (Tiling::i8_vnni, make_tiling).
#if defined(__AVX512F__)
inline constexpr const char* kI8Unit = "avx512_vnni";
inline constexpr int kI8Chunk = 64;  // Q/K values per vector step
#elif defined(__AVX2__)
inline constexpr const char* kI8Unit = "avx_vnni";
inline constexpr int kI8Chunk = 32;
#else
inline constexpr const char* kI8Unit = "";  // the scalar rule
inline constexpr int kI8Chunk = 64;
#endif
inline constexpr bool kI8VnniBuilt = kI8Unit[0] != '\0';  // this target has a vpdpbusd path

// One Q row's integer form (I8Layout::row bytes each, 64-byte aligned): dpad = d rounded up to 64.
//   nat[dpad]     the codes in natural order (score_row_rule), zero padded
//   vec[dpad]     the same codes in the vector order (vec_slot)
//   corr[dpad/4]  per 32-bit lane of vec: -off x the sum of its four codes (off: 128 q8_0, 8 q4_0, 0)
//   dws[dpad/4]   per 32-bit lane of vec: its block's dq scale log2e (block types)
//   bs[dpad/32]   per block: dq scale log2e (row types: one)
//   bsum[dpad/32] per block: the sum of its codes (row types: one)
struct I8Layout {
  int64_t d = 0, dpad = 0, row = 0;
  explicit I8Layout(int64_t dim = 0) : d(dim), dpad((dim + 63) / 64 * 64) {
    row = (dpad * 2 + dpad / 4 * 8 + dpad / 32 * 8 + 63) / 64 * 64;
  }
};
struct I8Row {
  int8_t* nat;
  int8_t* vec;
  int32_t* corr;
  float* dws;
  float* bs;
  int32_t* bsum;
  I8Row(std::byte* base, const I8Layout& l)
      : nat(reinterpret_cast<int8_t*>(base)),
        vec(nat + l.dpad),
        corr(reinterpret_cast<int32_t*>(vec + l.dpad)),
        dws(reinterpret_cast<float*>(corr + l.dpad / 4)),
        bs(dws + l.dpad / 4),
        bsum(reinterpret_cast<int32_t*>(bs + l.dpad / 32)) {}
};

// Where natural value k of a row lies in the vector order: the order the target's loader
// (load_codes) unpacks a chunk of K's codes in.
inline int64_t vec_slot(KvDType t, int64_t k) {
  const int64_t c = k / kI8Chunk * kI8Chunk, x = k % kI8Chunk;
  if (t == KvDType::U4) return c + (x % 2 ? kI8Chunk / 2 : 0) + x / 2;  // lows (even values), then highs
  if (t == KvDType::Q4_0 && kI8Chunk == 64) {                           // two blocks: lows of both, then highs of both
    const int64_t blk = x / 32, y = x % 32;
    return c + (y / 16) * 32 + blk * 16 + y % 16;
  }
  return k;  // q8_0, u8; q4_0 with one block per chunk (its 16 lows then 16 highs are 0..31)
}

// Rounds Q row x (d floats) into its integer form; false when round_q_row cannot (the task then
// scores in float32 and never reads the row).
inline bool pack_i8_row(KvDType t, const float* x, const I8Layout& l, float q_scale, std::byte* base) {
  const I8Row r(base, l);
  std::memset(base, 0, static_cast<size_t>(l.row));
  float scales[Problem::kMaxHeadDim];
  if (!round_q_row(t, x, l.d, r.nat, scales)) return false;
  const int64_t block = q_block_values(t, l.d);
  const int32_t off = t == KvDType::Q8_0 ? 128 : t == KvDType::Q4_0 ? 8 : 0;
  // Block by block: a division per value would cost as much as the rounding (decode's short
  // chunks round Q once per task).
  for (int64_t b = 0, b0 = 0; b0 < l.d; ++b, b0 += block) {
    r.bs[b] = scales[b] * q_scale;
    int32_t sum = 0;
    for (int64_t k = b0; k < std::min(b0 + block, l.d); ++k) {
      const int64_t v = vec_slot(t, k);
      r.vec[v] = r.nat[k];
      r.corr[v / 4] -= off * r.nat[k];
      r.dws[v / 4] = r.bs[b];
      sum += r.nat[k];
    }
    r.bsum[b] = sum;
  }
  return true;
}

// The rule: one score of Q row q against K row kr (type T), by the formulas above.
template <KvDType T>
inline float score_row_rule(const I8Row& q, const std::byte* kr, int64_t d) {
  const auto* u = reinterpret_cast<const uint8_t*>(kr);
  if constexpr (is_row_type(T)) {
    int32_t dot = 0;
    for (int64_t i = 0; i < d; ++i) {
      const int32_t c = T == KvDType::U8 ? u[8 + i] : (i % 2 ? u[8 + i / 2] >> 4 : u[8 + i / 2] & 0x0f);
      dot += q.nat[i] * c;
    }
    const float sc = kv_read::load_f32(kr), zp = kv_read::load_f32(kr + 4);
    return std::fma(-zp, static_cast<float>(q.bsum[0]), static_cast<float>(dot)) * q.bs[0] * sc;
  } else {
    constexpr int64_t kBytes = T == KvDType::Q8_0 ? 34 : 18;
    float s = 0.f;
    for (int64_t b = 0; b < d / 32; ++b) {
      const uint8_t* blk = u + b * kBytes;
      int32_t dot = 0;
      for (int i = 0; i < 32; ++i) {
        const int32_t c = T == KvDType::Q8_0 ? static_cast<int8_t>(blk[2 + i])
                                             : (i < 16 ? blk[2 + i] & 0x0f : blk[2 + i - 16] >> 4) - 8;
        dot += q.nat[b * 32 + i] * c;
      }
      s += q.bs[b] * kv_read::scale_f16(kr + b * kBytes) * static_cast<float>(dot);
    }
    return s;
  }
}

#if defined(__AVX512F__) || defined(__AVX2__)
namespace i8_detail {

#if defined(__AVX512F__)
using IVec = __m512i;
inline IVec bytes80() { return _mm512_set1_epi8(static_cast<char>(0x80)); }
// acc + the sums of four u8 x s8 products per 32-bit lane. vpdpbusd as inline assembly (EVEX): the
// target's flags lack VNNI, and only a CPU that has it runs this (Tiling::i8_vnni). Without VNNI:
// vpmaddubsw (pairs into int16, saturating - exact here: u <= 128, |s| <= 127) and vpmaddwd by 1.
template <bool Vnni>
inline IVec dot4(IVec acc, IVec u, IVec s) {
  if constexpr (Vnni) {
    asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
  } else {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
  }
}
inline IVec abs8(IVec x) { return _mm512_abs_epi8(x); }
// s where c >= 0, -s where c < 0 (c = 0: |c| = 0 makes the product 0 whatever s is).
inline IVec sign8(IVec s, IVec c) { return _mm512_mask_sub_epi8(s, _mm512_movepi8_mask(c), _mm512_setzero_si512(), s); }
inline Batch to_float(IVec x) { return _mm512_cvtepi32_ps(x); }
inline IVec load_ivec(const void* p) { return _mm512_load_si512(p); }
inline IVec izero() { return _mm512_setzero_si512(); }
inline IVec bcast32(int32_t x) { return _mm512_set1_epi32(x); }
// Lows of 32 bytes, then their highs, as 64 codes.
inline IVec nibbles(__m256i x) {
  const __m256i m = _mm256_set1_epi8(0x0f);
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(x, m)),
                            _mm256_and_si256(_mm256_srli_epi16(x, 4), m), 1);
}
inline __mmask64 first_bytes(int64_t n) { return n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1; }

// Chunk c (values [64c, 64c + 64)) of K row kr as codes in vec_slot's order, and (block types) the
// per-lane dk. rem: the row's values from 64c on (< 64 only in the last chunk). The codes are
// unsigned (dot4's u) but for q8_0 and u8 without VNNI: signed, q8_0's as stored, u8's minus 128
// (one xor) - score_rows_i8 takes their magnitude and moves their sign onto Q.
template <KvDType T, bool Vnni>
inline IVec load_codes(const std::byte* kr, int64_t c, int64_t rem, Batch& dk) {
  if constexpr (T == KvDType::Q8_0) {
    const std::byte* b0 = kr + 2 * c * 34;
    const bool two = rem > 32;
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 2));
    const __m256i hi = two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 34 + 2)) : _mm256_setzero_si256();
    const auto h0 = static_cast<short>(kv_detail::load_u16(b0));
    const auto h1 = static_cast<short>(two ? kv_detail::load_u16(b0 + 34) : 0);
    dk = _mm512_cvtph_ps(_mm256_mask_blend_epi16(0xff00, _mm256_set1_epi16(h0), _mm256_set1_epi16(h1)));
    const IVec c8 = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    return Vnni ? _mm512_xor_si512(c8, bytes80()) : c8;
  } else if constexpr (T == KvDType::Q4_0) {
    const std::byte* b0 = kr + 2 * c * 18;
    const bool two = rem > 32;
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 2));
    const __m128i hi = two ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 18 + 2)) : _mm_setzero_si128();
    const auto h0 = static_cast<short>(kv_detail::load_u16(b0));
    const auto h1 = static_cast<short>(two ? kv_detail::load_u16(b0 + 18) : 0);
    dk = _mm512_cvtph_ps(_mm256_mask_blend_epi16(0xf0f0, _mm256_set1_epi16(h0), _mm256_set1_epi16(h1)));
    return nibbles(_mm256_set_m128i(hi, lo));
  } else if constexpr (T == KvDType::U8) {
    const std::byte* p = kr + 8 + 64 * c;
    const IVec u = rem >= 64 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(first_bytes(rem), p);
    return Vnni ? u : _mm512_xor_si512(u, bytes80());
  } else {
    static_assert(T == KvDType::U4);
    const std::byte* p = kr + 8 + 32 * c;
    const int64_t n = (rem + 1) / 2;
    const __m256i x = n >= 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                              : _mm256_maskz_loadu_epi8(static_cast<__mmask32>(first_bytes(n)), p);
    return nibbles(x);
  }
}
#else  // AVX2 with AVX-VNNI
using IVec = __m256i;
inline IVec bytes80() { return _mm256_set1_epi8(static_cast<char>(0x80)); }
// As the AVX-512 dot4: AVX-VNNI's VEX-encoded vpdpbusd on ymm ({vex}: the EVEX form needs
// AVX512-VNNI), else vpmaddubsw + vpmaddwd.
template <bool Vnni>
inline IVec dot4(IVec acc, IVec u, IVec s) {
  if constexpr (Vnni) {
    asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));  // %{ %}: braces, not asm dialects
    return acc;
  } else {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
  }
}
inline IVec abs8(IVec x) { return _mm256_abs_epi8(x); }
inline IVec sign8(IVec s, IVec c) { return _mm256_sign_epi8(s, c); }
inline Batch to_float(IVec x) { return _mm256_cvtepi32_ps(x); }
inline IVec load_ivec(const void* p) { return _mm256_load_si256(static_cast<const __m256i*>(p)); }
inline IVec izero() { return _mm256_setzero_si256(); }
inline IVec bcast32(int32_t x) { return _mm256_set1_epi32(x); }
inline IVec nibbles(__m128i x) {
  const __m128i m = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
}
// n < full bytes at p, zero padded (AVX2 has no byte-masked load).
inline void copy_bytes(const std::byte* p, int64_t n, std::byte* out, int64_t full) {
  std::memset(out, 0, static_cast<size_t>(full));
  std::memcpy(out, p, static_cast<size_t>(n));
}

template <KvDType T, bool Vnni>
inline IVec load_codes(const std::byte* kr, int64_t c, int64_t rem, Batch& dk) {
  if constexpr (T == KvDType::Q8_0) {
    const std::byte* b = kr + c * 34;
    dk = Batch(kv_read::scale_f16(b));
    const IVec c8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    return Vnni ? _mm256_xor_si256(c8, bytes80()) : c8;
  } else if constexpr (T == KvDType::Q4_0) {
    const std::byte* b = kr + c * 18;
    dk = Batch(kv_read::scale_f16(b));
    return nibbles(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)));
  } else if constexpr (T == KvDType::U8) {
    const std::byte* p = kr + 8 + 32 * c;
    IVec u;
    if (rem >= 32) {
      u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    } else {
      alignas(32) std::byte buf[32];
      copy_bytes(p, rem, buf, 32);
      u = _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
    }
    return Vnni ? u : _mm256_xor_si256(u, bytes80());
  } else {
    static_assert(T == KvDType::U4);
    const std::byte* p = kr + 8 + 16 * c;
    const int64_t n = (rem + 1) / 2;
    if (n >= 16) return nibbles(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    alignas(16) std::byte buf[16];
    copy_bytes(p, n, buf, 16);
    return nibbles(_mm_load_si128(reinterpret_cast<const __m128i*>(buf)));
  }
}
#endif

}  // namespace i8_detail

// score_rows (microkernel.hpp) in integers: s[m * kTileKeys + j] for rows m < MR (I8Row rows
// `ld` bytes apart from q0; rows past MR read `zero`, an all-zero row) and keys [ja, jb). The same
// register block as the float path (kDotRows rows x kDotKeys keys), reduced by transpose_sum.
// Vnni: dot4 by vpdpbusd (the CPU has the target's VNNI unit), else by vpmaddubsw + vpmaddwd, whose
// unsigned operand must stay <= 128: q8_0's codes and u8's minus 128 go in as their magnitudes with
// their signs moved onto Q (sign8), so q8_0 needs no offset (no -128 sum q start) and u8's sum is
// I - 128 sum q (its zero point read 128 lower).
template <int MR, KvDType T, bool Vnni, class Step>
void score_rows_i8(const std::byte* q0, int64_t ld, const std::byte* zero, const I8Layout& l, const Rows<Quant<T>>& k,
                   int ja, int jb, float* s, Step& step) {
  using namespace i8_detail;
  constexpr int kAcc = kDotRows * kDotKeys;
  constexpr bool kRow = is_row_type(T);
  constexpr bool kSigned = !Vnni && (T == KvDType::Q8_0 || T == KvDType::U8);  // magnitude x moved sign
  constexpr float kZpShift = !Vnni && T == KvDType::U8 ? 128.f : 0.f;
  const int64_t d = l.d, chunks = (d + kI8Chunk - 1) / kI8Chunk;
  for (int r0 = 0; r0 < MR; r0 += kDotRows) {
    I8Row q[kDotRows] = {I8Row(const_cast<std::byte*>(zero), l), I8Row(const_cast<std::byte*>(zero), l),
                         I8Row(const_cast<std::byte*>(zero), l), I8Row(const_cast<std::byte*>(zero), l)};
    static_assert(kDotRows == 4, "the initializer above");
    for (int r = 0; r < kDotRows && r0 + r < MR; ++r) q[r] = I8Row(const_cast<std::byte*>(q0 + (r0 + r) * ld), l);
    alignas(64) float row_sum[kAcc], row_scale[kAcc];  // row types: sum q and dq scale log2e per lane
    for (int a = 0; a < kAcc; ++a) {
      row_sum[a] = static_cast<float>(q[a / kDotKeys].bsum[0]), row_scale[a] = q[a / kDotKeys].bs[0];
    }
    for (int j = ja; j < jb; j += kDotKeys) {
      const std::byte* kr[kDotKeys];  // keys past jb repeat the last one (computed, never stored)
      for (int c = 0; c < kDotKeys; ++c) kr[c] = reinterpret_cast<const std::byte*>(k.row(j + c < jb ? j + c : jb - 1));
      Batch facc[kAcc];
      IVec iacc[kAcc];
      for (int a = 0; a < kAcc; ++a) facc[a] = Batch(0.f), iacc[a] = izero();
      for (int64_t c = 0; c < chunks; ++c) {
        for (int x = 0; x < kI8Chunk / kLanes; ++x) step();  // as many prefetch steps as the float path
        IVec codes[kDotKeys];
        Batch dk[kDotKeys];
        IVec mag[kDotKeys];  // kSigned: the codes' magnitudes (dot4's unsigned operand)
        for (int i = 0; i < kDotKeys; ++i) {
          codes[i] = load_codes<T, Vnni>(kr[i], c, d - c * kI8Chunk, dk[i]);
          mag[i] = kSigned ? abs8(codes[i]) : codes[i];
        }
        for (int r = 0; r < kDotRows; ++r) {
          const IVec qv = load_ivec(q[r].vec + c * kI8Chunk);
          if constexpr (kRow) {
            for (int i = 0; i < kDotKeys; ++i) {
              iacc[r * kDotKeys + i] = dot4<Vnni>(iacc[r * kDotKeys + i], mag[i], kSigned ? sign8(qv, codes[i]) : qv);
            }
          } else {
            const IVec init = kSigned ? izero() : load_ivec(q[r].corr + c * kI8Chunk / 4);
            const Batch dq = Batch::load_aligned(q[r].dws + c * kI8Chunk / 4);
            for (int i = 0; i < kDotKeys; ++i) {
              const IVec sum = dot4<Vnni>(init, mag[i], kSigned ? sign8(qv, codes[i]) : qv);
              facc[r * kDotKeys + i] = simd::fma(to_float(sum), dq * dk[i], facc[r * kDotKeys + i]);
            }
          }
        }
      }
      alignas(64) float tile[kAcc];
      if constexpr (kRow) {
        // (I - zp sum q) dq sc per (row, key), a vector of them at a time: lane r * kDotKeys + i.
        for (int a = 0; a < kAcc; ++a) facc[a] = to_float(iacc[a]);
        alignas(64) float zp[kAcc], sc[kAcc];
        for (int a = 0; a < kAcc; ++a) {
          sc[a] = kv_read::load_f32(kr[a % kDotKeys]), zp[a] = kv_read::load_f32(kr[a % kDotKeys] + 4) - kZpShift;
        }
        for (int g = 0; g < kAcc; g += kLanes) {
          const Batch v =
              simd::fma(-Batch::load_aligned(zp + g), Batch::load_aligned(row_sum + g), transpose_sum(facc + g));
          (v * Batch::load_aligned(row_scale + g) * Batch::load_aligned(sc + g)).store_aligned(tile + g);
        }
      } else {
        for (int g = 0; g < kAcc; g += kLanes) transpose_sum(facc + g).store_aligned(tile + g);
      }
      const int rows = MR - r0 < kDotRows ? MR - r0 : kDotRows, keys = jb - j < kDotKeys ? jb - j : kDotKeys;
      for (int r = 0; r < rows; ++r) {
        std::memcpy(s + (r0 + r) * kTileKeys + j, tile + r * kDotKeys, sizeof(float) * static_cast<size_t>(keys));
      }
    }
  }
}
#else
// The scalar target: the rule, key by key.
template <int MR, KvDType T, bool Vnni, class Step>
void score_rows_i8(const std::byte* q0, int64_t ld, const std::byte*, const I8Layout& l, const Rows<Quant<T>>& k,
                   int ja, int jb, float* s, Step& step) {
  for (int m = 0; m < MR; ++m) {
    const I8Row q(const_cast<std::byte*>(q0 + m * ld), l);
    for (int j = ja; j < jb; ++j) {
      step();
      s[m * kTileKeys + j] = score_row_rule<T>(q, reinterpret_cast<const std::byte*>(k.row(j)), l.d);
    }
  }
}
#endif

// round_int8 (kv_quant.hpp) over one block of n values, in vectors: the same operations in the same
// order per value (amax by max, scale = amax / 127, y = x / scale, truncation, the fraction's test,
// the clamp), so the same codes and scale bit for bit - tests/test_simd_math.cpp checks it on every
// target. The rule's scalar form spends a division and a branch per value: flash_int8 rounds every
// Q and K value once per run.
inline bool round_int8_row(const float* x, int64_t n, int8_t* q, float* scale_out) {
#if defined(__AVX512F__) || defined(__AVX2__)
  Batch amax(0.f), bad(0.f);
  for (int64_t i = 0; i < n; i += kLanes) {
    const Batch v = load_partial(x + i, static_cast<int>(std::min<int64_t>(kLanes, n - i)));
    bad += v - v;  // 0 for finite values; NaN from a NaN or an Inf
    amax = max(amax, xsimd::abs(v));
  }
  if (reduce_sum(bad) != 0.f) return false;
  const float scale = reduce_max(amax) / 127.f;
  *scale_out = scale;
  if (!(scale > 0.f)) {
    std::memset(q, 0, static_cast<size_t>(n));
    return true;
  }
  const Batch sc(scale), half(0.5f), one(1.f);
  for (int64_t i = 0; i < n; i += kLanes) {
    const int m = static_cast<int>(std::min<int64_t>(kLanes, n - i));
    const Batch y = load_partial(x + i, m) / sc;
#if defined(__AVX512F__)
    const __m512i t = _mm512_cvttps_epi32(y);
    const Batch r = _mm512_cvtepi32_ps(t);
#else
    const __m256i t = _mm256_cvttps_epi32(y);
    const Batch r = _mm256_cvtepi32_ps(t);
#endif
    const Batch frac = y - r;
    // r + 1, r - 1 or r: exact in float (|r| <= 128), then clamped to +-127 as the rule.
    const Batch rounded = select(frac >= half, r + one, select(frac <= -half, r - one, r));
    const Batch c = min(max(rounded, Batch(-127.f)), Batch(127.f));
    alignas(64) float out[kLanes];
    c.store_aligned(out);
    for (int k = 0; k < m; ++k) q[i + k] = static_cast<int8_t>(out[k]);
  }
  return true;
#else
  return round_int8(x, n, n, q, scale_out);
#endif
}

// round_smoothed_key (kv_quant.hpp) by round_int8_row: x - mean in float32, then the row's rounding.
inline bool round_smoothed_row(const float* x, const float* mean, int64_t n, int8_t* q, float* scale) {
  alignas(64) float centred[Problem::kMaxHeadDim];
  for (int64_t i = 0; i < n; ++i) centred[i] = x[i] - mean[i];
  return round_int8_row(centred, n, q, scale);
}

// flash_int8's K.Q (src/cpu/flash_int8.cpp): Q rows and smoothed K rows rounded to int8 per row
// (round_q_row, round_smoothed_key: kv_quant.hpp), the scores exact int32 dot products scaled
// after. K is rounded once per run, per (batch, kv head), into key tiles of this layout:
//   words[w * kTileKeys + j]   the 32-bit word of key j's codes 4w .. 4w + 3 (K^T by words;
//                              codes past d and keys past the tile's zero)
//   scale[kTileKeys]           key j's scale
//   corr[kTileKeys]            -128 x the sum of key j's codes (the VNNI path's start, below)
// and a task's Q rows into panels as flash packs them, words instead of floats: panel word
// (w, m) at qw[w * MR + m]. vpdpbusd multiplies unsigned by signed bytes, so with VNNI Q goes in
// as q + 128 (its codes xor 0x80), K as stored, and each lane starts at corr: the sum is
// sum (q + 128) k - 128 sum k = q.k exactly. Without VNNI vpmaddubsw + vpmaddwd take |k| and Q
// with k's sign (sign8: no int16 saturation, as score_rows_i8).
// Word rows are stored rounded up to 16 (zero): whole AMX tiles for flash_int8_amx's TDPBSSD.
struct I8KeyTile {
  int64_t words = 0;  // ceil(d / 4)
  int64_t rows = 0;   // words rounded up to 16
  size_t bytes = 0;   // of one tile, a 64-byte multiple
  explicit I8KeyTile(int64_t d = 0)
      : words((d + 3) / 4),
        rows((words + 15) / 16 * 16),
        bytes(static_cast<size_t>(rows * kTileKeys * 4 + 2 * kTileKeys * 4)) {}
  static int32_t* word_at(std::byte* tile) { return reinterpret_cast<int32_t*>(tile); }
  float* scale(std::byte* tile) const { return reinterpret_cast<float*>(tile + rows * kTileKeys * 4); }
  int32_t* corr(std::byte* tile) const {
    return reinterpret_cast<int32_t*>(tile + rows * kTileKeys * 4 + kTileKeys * 4);
  }
};

// Key j (< kTileKeys) of a tile from its d codes and scale.
inline void put_i8_key(const I8KeyTile& l, std::byte* tile, int j, const int8_t* codes, int64_t d, float scale) {
  int32_t* w = I8KeyTile::word_at(tile);
  alignas(64) int8_t padded[Problem::kMaxHeadDim + 4] = {};
  std::memcpy(padded, codes, static_cast<size_t>(d));
  int32_t sum = 0;
  for (int64_t i = 0; i < d; ++i) sum += codes[i];
  for (int64_t x = 0; x < l.words; ++x) std::memcpy(w + x * kTileKeys + j, padded + 4 * x, 4);
  l.scale(tile)[j] = scale;
  l.corr(tile)[j] = -128 * sum;
}

// Q row rr of a task (R rows, panels of kPanelRows) as its panel's words; vnni: q + 128.
inline void put_i8_q_row(const I8KeyTile& l, int32_t* qw, int64_t R, int64_t rr, const int8_t* codes, int64_t d,
                         bool vnni) {
  const int64_t panel0 = rr / kPanelRows * kPanelRows, mr = std::min<int64_t>(kPanelRows, R - panel0);
  int32_t* dst = qw + panel0 * l.words + (rr - panel0);
  alignas(64) int8_t padded[Problem::kMaxHeadDim + 4] = {};
  std::memcpy(padded, codes, static_cast<size_t>(d));
  const uint32_t flip = vnni ? 0x80808080u : 0u;  // the padding too: q + 128 of a zero code
  for (int64_t x = 0; x < l.words; ++x) {
    uint32_t word = 0;
    std::memcpy(&word, padded + 4 * x, 4);
    dst[x * mr] = static_cast<int32_t>(word ^ flip);
  }
}

// GEMM 1 for one register panel in integers: s[m * kTileKeys + j] = qsc[m] scale_j (q_m . k_j) + qc[m]
// for the register blocks overlapping [ja, jb) (whole blocks: keys past the tile's are zero codes
// and never read unmasked). qw: the panel's words (qw[w * MR + m]); qsc: per row Q's scale times
// the score scale (log2 units); qc: per row the smoothing's term, q.mean in the same units.
#if defined(__AVX512F__) || defined(__AVX2__)
template <int MR, bool Vnni>
void score_panel_i8(const int32_t* qw, const I8KeyTile& l, const std::byte* tile, const float* qsc, const float* qc,
                    int ja, int jb, float* s) {
  using namespace i8_detail;
  constexpr int kV = static_cast<int>(sizeof(IVec) / 4);  // int32 lanes per vector = kLanes
  static_assert(kV == kLanes, "one int32 vector per float vector of scores");
  constexpr int NV = kBlockKeys / kV;
  const auto* kw = reinterpret_cast<const int32_t*>(tile);
  const float* ks = l.scale(const_cast<std::byte*>(tile));
  const int32_t* corr = l.corr(const_cast<std::byte*>(tile));
  for (int j0 = ja / kBlockKeys * kBlockKeys; j0 < jb; j0 += kBlockKeys) {
    IVec acc[MR][NV];
    for (int v = 0; v < NV; ++v) {
      const IVec init = Vnni ? load_ivec(corr + j0 + v * kV) : izero();
      for (int m = 0; m < MR; ++m) acc[m][v] = init;
    }
    for (int64_t w = 0; w < l.words; ++w) {
      IVec kv[NV], mag[NV];
      for (int v = 0; v < NV; ++v) {
        kv[v] = load_ivec(kw + w * kTileKeys + j0 + v * kV);
        if constexpr (!Vnni) mag[v] = abs8(kv[v]);
      }
      for (int m = 0; m < MR; ++m) {
        const IVec qb = bcast32(qw[w * MR + m]);
        for (int v = 0; v < NV; ++v) {
          acc[m][v] = Vnni ? dot4<true>(acc[m][v], qb, kv[v]) : dot4<false>(acc[m][v], mag[v], sign8(qb, kv[v]));
        }
      }
    }
    for (int v = 0; v < NV; ++v) {
      const Batch sc = Batch::load_aligned(ks + j0 + v * kV);
      for (int m = 0; m < MR; ++m) {
        simd::fma(to_float(acc[m][v]) * sc, Batch(qsc[m]), Batch(qc[m])).store_aligned(s + m * kTileKeys + j0 + v * kV);
      }
    }
  }
}
#else
// The scalar and NEON targets: the same integers, key by key.
template <int MR, bool Vnni>
void score_panel_i8(const int32_t* qw, const I8KeyTile& l, const std::byte* tile, const float* qsc, const float* qc,
                    int ja, int jb, float* s) {
  static_assert(!Vnni, "no VNNI unit on this target");
  const auto* kw = reinterpret_cast<const int32_t*>(tile);
  const float* ks = l.scale(const_cast<std::byte*>(tile));
  const int j1 = std::min(kTileKeys, (jb + kBlockKeys - 1) / kBlockKeys * kBlockKeys);
  for (int m = 0; m < MR; ++m) {
    for (int j = ja / kBlockKeys * kBlockKeys; j < j1; ++j) {
      int32_t dot = 0;
      for (int64_t w = 0; w < l.words; ++w) {
        const auto q = static_cast<uint32_t>(qw[w * MR + m]), k = static_cast<uint32_t>(kw[w * kTileKeys + j]);
        for (int b = 0; b < 4; ++b) {
          dot += static_cast<int8_t>(q >> (8 * b)) * static_cast<int8_t>(k >> (8 * b));
        }
      }
      s[m * kTileKeys + j] = std::fma(static_cast<float>(dot) * ks[j], qsc[m], qc[m]);
    }
  }
}
#endif

// decode_i8's P.V in integers, on a V tile that every row of the panel sees whole (nk = kTileKeys).
// Each row's P times V's scales is rounded per V scale block by round_p_tile's rule (kv_quant.hpp:
// u8 codes against the tile's largest weight; signed, 127 levels, for q4_0), then each output
// column is an exact int32 sum over the tile's 64 keys of the P codes times V's codes as stored,
// scaled once by the block's quantum:
//   u8, u4  O_i += q sum_j P_j c_ji - q sum_j P_j zp_j      (c: the code; u8 read as c - 128, zp - 128)
//   q8_0    O_i += q_b sum_j P_jb c_ji                        (c: the int8 code)
//   q4_0    O_i += q_b sum_j P_jb n_ji - 8 q_b sum_j P_jb     (n: the nibble; P signed)
// vpdpbusd takes four keys per 32-bit lane: four V rows' codes for one column run interleave in
// registers (two unpack stages), P's four codes of those keys broadcast as one word, and the
// accumulators' column order (lane 4L + c of vector k holds column 16L + 4k + c) is undone once per
// tile by a 4 x 4 transpose of 128-bit lanes. Against the float path per key and 64 columns:
// 4 V loads and 8 unpacks per 4 keys, one vpdpbusd per row, instead of widening 64 codes (two
// conversions per 16) and 4 FMAs per row.
#if defined(__AVX512F__) || defined(__AVX2__)
#define ATTN_I8_PV_VECTOR 1
#else
#define ATTN_I8_PV_VECTOR 0
#endif
inline constexpr int kMaxPBlocks = Problem::kMaxHeadDim / 32;
template <int MR>
struct PCodes {
  alignas(64) uint8_t code[MR][kMaxPBlocks][kTileKeys];  // round_p_tile's codes as bytes (q4_0: int8)
  float quantum[MR][kMaxPBlocks];
  float sub[MR][kMaxPBlocks];  // what comes off each column of the block, per row (formulas above)
};

// V's scale of key row r for column block b, and (row types) its zero point.
template <KvDType T>
inline float v_scale(const std::byte* r, int64_t b) {
  if constexpr (is_row_type(T)) return kv_read::load_f32(r);
  return kv_read::scale_f16(r + b * (T == KvDType::Q8_0 ? 34 : 18));
}
template <KvDType T>
inline int64_t p_blocks(int64_t dv) {
  return is_row_type(T) ? 1 : dv / 32;
}
// The zero point as P.V's sum sees it: u8's codes go in as c - 128 (vpdpbusd's signed operand).
template <KvDType T>
inline float zp_of(const std::byte* r) {
  return kv_read::load_f32(r + 4) - (T == KvDType::U8 && ATTN_I8_PV_VECTOR ? 128.f : 0.f);
}

// One row's P (kTileKeys weights' p) times the scales sc rounded into out by round_p_tile's rule, in
// vectors on AVX2 / AVX-512 (bit for bit the rule: the same max, one division, the same products
// and the same round-half-to-even conversion; tests/test_simd_math.cpp), the rule itself elsewhere.
// *quantum: wmax / L; *corr: sum_j code_j zp_j (zp given: row types) or sum_j code_j. false when a
// weight is NaN or Inf (nothing written that is used).
template <bool kSigned>
inline bool round_p_row(const float* p, const float* sc, const float* zp, uint8_t* out, float* quantum,
                        float* corr_out) {
  [[maybe_unused]] constexpr int32_t kLevels = kSigned ? 127 : 255;  // round_p_tile's
  float q = 0.f, corr = 0.f;
#if ATTN_I8_PV_VECTOR
  alignas(64) float w[kTileKeys];
  Batch amax(0.f), bad(0.f);
  for (int j = 0; j < kTileKeys; j += kLanes) {
    const Batch x = Batch::load_aligned(p + j) * Batch::load_aligned(sc + j);
    x.store_aligned(w + j);
    bad += x - x;  // 0 for finite weights; NaN from a NaN or an Inf
    amax = max(amax, xsimd::abs(x));
  }
  if (reduce_sum(bad) != 0.f) return false;
  const float wmax = reduce_max(amax);
  if (wmax > 0.f) {
    q = wmax / static_cast<float>(kLevels);
    const Batch inv(static_cast<float>(kLevels) / wmax);
    Batch acc(0.f);
    alignas(64) int32_t ci[kTileKeys];
    for (int j = 0; j < kTileKeys; j += kLanes) {
#if defined(__AVX512F__)
      __m512i c = _mm512_cvtps_epi32(Batch::load_aligned(w + j) * inv);  // MXCSR's round half to even
      c = _mm512_min_epi32(_mm512_max_epi32(c, _mm512_set1_epi32(kSigned ? -kLevels : 0)), _mm512_set1_epi32(kLevels));
      _mm512_store_si512(ci + j, c);
      const Batch cf = _mm512_cvtepi32_ps(c);
#else
      __m256i c = _mm256_cvtps_epi32(Batch::load_aligned(w + j) * inv);
      c = _mm256_min_epi32(_mm256_max_epi32(c, _mm256_set1_epi32(kSigned ? -kLevels : 0)), _mm256_set1_epi32(kLevels));
      _mm256_store_si256(reinterpret_cast<__m256i*>(ci + j), c);
      const Batch cf = _mm256_cvtepi32_ps(c);
#endif
      acc = zp ? simd::fma(cf, Batch::load_aligned(zp + j), acc) : acc + cf;
    }
    corr = reduce_sum(acc);
#if defined(__AVX512F__)
    for (int j = 0; j < kTileKeys; j += 16) {
      _mm_store_si128(reinterpret_cast<__m128i*>(out + j), _mm512_cvtepi32_epi8(_mm512_load_si512(ci + j)));
    }
#else
    for (int j = 0; j < kTileKeys; j += 32) {
      const auto* c = reinterpret_cast<const __m256i*>(ci + j);
      const __m256i w16a = _mm256_packs_epi32(_mm256_load_si256(c), _mm256_load_si256(c + 1));
      const __m256i w16b = _mm256_packs_epi32(_mm256_load_si256(c + 2), _mm256_load_si256(c + 3));
      const __m256i bytes = kSigned ? _mm256_packs_epi16(w16a, w16b) : _mm256_packus_epi16(w16a, w16b);
      _mm256_store_si256(reinterpret_cast<__m256i*>(out + j),
                         _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
#endif
  } else {
    std::memset(out, 0, kTileKeys);
  }
#else  // the rule itself
  float w[kTileKeys];
  int32_t ci[kTileKeys];
  for (int j = 0; j < kTileKeys; ++j) w[j] = p[j] * sc[j];
  if (!round_p_tile(w, kTileKeys, kSigned, ci, &q)) return false;
  for (int j = 0; j < kTileKeys; ++j) {
    out[j] = static_cast<uint8_t>(ci[j]);
    corr += static_cast<float>(ci[j]) * (zp ? zp[j] : 1.f);
  }
#endif
  *quantum = q, *corr_out = corr;
  return true;
}

// Rounds the panel's P (MR rows, kTileKeys apart) times V's scales (vr: the tile's V rows) into pc,
// row by row and block by block (round_p_row); false when a weight is NaN or Inf (then nothing is
// used: the tile runs in float32).
template <int MR, KvDType T>
inline bool round_p_rows(const float* p, const std::byte* const* vr, int64_t dv, PCodes<MR>& pc) {
  constexpr bool kSigned = T == KvDType::Q4_0;
  const int64_t nb = p_blocks<T>(dv);
  for (int64_t b = 0; b < nb; ++b) {
    alignas(64) float sc[kTileKeys], zp[kTileKeys];
    if constexpr (is_row_type(T) || !ATTN_I8_PV_VECTOR) {
      for (int j = 0; j < kTileKeys; ++j) {
        sc[j] = v_scale<T>(vr[j], b);
        if constexpr (is_row_type(T)) zp[j] = zp_of<T>(vr[j]);
      }
    } else {  // the f16 scales by F16C, kLanes at a time (a scalar conversion per key and block cost more)
      alignas(64) uint16_t bits[kTileKeys];
      for (int j = 0; j < kTileKeys; ++j) bits[j] = kv_detail::load_u16(vr[j] + b * (T == KvDType::Q8_0 ? 34 : 18));
#if defined(__AVX512F__)
      for (int j = 0; j < kTileKeys; j += 16) {
        _mm512_store_ps(sc + j, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(bits + j))));
      }
#elif defined(__AVX2__)
      for (int j = 0; j < kTileKeys; j += 8) {
        _mm256_store_ps(sc + j, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(bits + j))));
      }
#endif
    }
    for (int m = 0; m < MR; ++m) {
      float q = 0.f, corr = 0.f;
      if (!round_p_row<kSigned>(p + m * kTileKeys, sc, is_row_type(T) ? zp : nullptr, pc.code[m][b], &q, &corr)) {
        return false;
      }
      pc.quantum[m][b] = q;
      pc.sub[m][b] = is_row_type(T) ? q * corr : kSigned ? 8.f * q * corr : 0.f;
    }
  }
  return true;
}

#if ATTN_I8_PV_VECTOR
namespace i8_detail {
#if defined(__AVX512F__)
inline constexpr int kPvRows = 4;  // rows per pass: 4 x 4 accumulators, the 4 rows' codes and their unpacks
// V row r's codes for columns [c0, c0 + 64) in column order, zero past the row (rem: its columns
// from c0 on): u8 as c - 128 (vpdpbusd's signed operand), u4 and q4_0 as nibbles 0..15, q8_0 as stored.
template <KvDType T>
inline IVec v_codes(const std::byte* r, int64_t c0, int64_t rem) {
  if constexpr (T == KvDType::U8) {
    const std::byte* p = r + 8 + c0;
    const IVec u = rem >= 64 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(first_bytes(rem), p);
    return _mm512_xor_si512(u, bytes80());
  } else if constexpr (T == KvDType::U4) {
    const std::byte* p = r + 8 + c0 / 2;
    const int64_t n = (rem + 1) / 2;
    const __m256i y = n >= 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                              : _mm256_maskz_loadu_epi8(static_cast<__mmask32>(first_bytes(n)), p);
    // byte 2i: byte i's low nibble, byte 2i + 1 its high one: (z | z << 4) & 0x0f0f per word
    const IVec z = _mm512_cvtepu8_epi16(y);
    return _mm512_ternarylogic_epi32(z, _mm512_slli_epi16(z, 4), _mm512_set1_epi16(0x0f0f), 0xa8);
  } else if constexpr (T == KvDType::Q8_0) {
    const std::byte* b0 = r + c0 / 32 * 34;
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 2));
    const __m256i hi =
        rem > 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 36)) : _mm256_setzero_si256();
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  } else {
    static_assert(T == KvDType::Q4_0);
    // A block's 16 bytes hold values 0..15 (low nibbles) and 16..31 (high): lanes [B0, B0, B1, B1],
    // the odd lanes shifted by 4, then the nibbles.
    const std::byte* b0 = r + c0 / 32 * 18;
    const __m128i x0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 2));
    const __m128i x1 = rem > 32 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 20)) : _mm_setzero_si128();
    IVec z =
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_broadcastsi128_si256(x0)), _mm256_broadcastsi128_si256(x1), 1);
    z = _mm512_mask_srli_epi16(z, 0xff00ff00u, z, 4);
    return _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
  }
}
inline IVec lo8(IVec a, IVec b) { return _mm512_unpacklo_epi8(a, b); }
inline IVec hi8(IVec a, IVec b) { return _mm512_unpackhi_epi8(a, b); }
inline IVec lo16(IVec a, IVec b) { return _mm512_unpacklo_epi16(a, b); }
inline IVec hi16(IVec a, IVec b) { return _mm512_unpackhi_epi16(a, b); }
// x[k] lane 4L + c holds column 16L + 4k + c: out[n] = columns 16n .. 16n + 15 (128-bit lane n of each x[k]).
inline void column_order(const IVec x[4], IVec out[4]) {
  const IVec t0 = _mm512_shuffle_i32x4(x[0], x[1], 0x44), t1 = _mm512_shuffle_i32x4(x[2], x[3], 0x44);
  const IVec t2 = _mm512_shuffle_i32x4(x[0], x[1], 0xee), t3 = _mm512_shuffle_i32x4(x[2], x[3], 0xee);
  out[0] = _mm512_shuffle_i32x4(t0, t1, 0x88), out[1] = _mm512_shuffle_i32x4(t0, t1, 0xdd);
  out[2] = _mm512_shuffle_i32x4(t2, t3, 0x88), out[3] = _mm512_shuffle_i32x4(t2, t3, 0xdd);
}
// P's operand for keys 4g .. 4g + 3 of row m over columns [c0, c0 + 64): the word of each lane's block.
template <KvDType T, int MR>
inline IVec p_word(const PCodes<MR>& pc, int m, int g, int64_t c0, bool two) {
  int32_t w0, w1;
  if constexpr (is_row_type(T)) {
    std::memcpy(&w0, pc.code[m][0] + 4 * g, 4);
    return bcast32(w0);
  } else {
    const int64_t b = c0 / 32;
    std::memcpy(&w0, pc.code[m][b] + 4 * g, 4);
    std::memcpy(&w1, pc.code[m][two ? b + 1 : b] + 4 * g, 4);
    return _mm512_mask_blend_epi32(0xff00, bcast32(w0), bcast32(w1));  // columns 32.. of the chunk: block b + 1
  }
}
#else  // AVX2 with AVX-VNNI
inline constexpr int kPvRows = 2;  // 16 registers: 2 x 4 accumulators, the 4 rows' codes and their unpacks
template <KvDType T>
inline IVec v_codes(const std::byte* r, int64_t c0, int64_t rem) {
  if constexpr (T == KvDType::U8) {
    const std::byte* p = r + 8 + c0;
    IVec u;
    if (rem >= 32) {
      u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    } else {
      alignas(32) std::byte buf[32];
      copy_bytes(p, rem, buf, 32);
      u = _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
    }
    return _mm256_xor_si256(u, bytes80());
  } else if constexpr (T == KvDType::U4) {
    const std::byte* p = r + 8 + c0 / 2;
    const int64_t n = (rem + 1) / 2;
    __m128i x;
    if (n >= 16) {
      x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    } else {
      alignas(16) std::byte buf[16];
      copy_bytes(p, n, buf, 16);
      x = _mm_load_si128(reinterpret_cast<const __m128i*>(buf));
    }
    const IVec z = _mm256_cvtepu8_epi16(x);
    return _mm256_and_si256(_mm256_or_si256(z, _mm256_slli_epi16(z, 4)), _mm256_set1_epi16(0x0f0f));
  } else if constexpr (T == KvDType::Q8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + c0 / 32 * 34 + 2));
  } else {
    static_assert(T == KvDType::Q4_0);
    const IVec z = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + c0 / 32 * 18 + 2)));
    return _mm256_and_si256(_mm256_blend_epi32(z, _mm256_srli_epi16(z, 4), 0xf0), _mm256_set1_epi8(0x0f));
  }
}
inline IVec lo8(IVec a, IVec b) { return _mm256_unpacklo_epi8(a, b); }
inline IVec hi8(IVec a, IVec b) { return _mm256_unpackhi_epi8(a, b); }
inline IVec lo16(IVec a, IVec b) { return _mm256_unpacklo_epi16(a, b); }
inline IVec hi16(IVec a, IVec b) { return _mm256_unpackhi_epi16(a, b); }
// x[k] lane 4L + c holds column 16L + 4k + c: out[n] = columns 8n .. 8n + 7.
inline void column_order(const IVec x[4], IVec out[4]) {
  out[0] = _mm256_permute2x128_si256(x[0], x[1], 0x20), out[1] = _mm256_permute2x128_si256(x[2], x[3], 0x20);
  out[2] = _mm256_permute2x128_si256(x[0], x[1], 0x31), out[3] = _mm256_permute2x128_si256(x[2], x[3], 0x31);
}
template <KvDType T, int MR>
inline IVec p_word(const PCodes<MR>& pc, int m, int g, int64_t c0, bool) {
  int32_t w;
  std::memcpy(&w, pc.code[m][is_row_type(T) ? 0 : c0 / 32] + 4 * g, 4);  // a 32-column chunk: one block
  return bcast32(w);
}
#endif
}  // namespace i8_detail

// o[m] (ldo apart, dv_pad floats) = o[m] alpha[m] (alpha given) + the tile's P.V by the formulas above;
// vr: the tile's kTileKeys V rows.
template <int MR, KvDType T, class Step>
void pv_tile_i8(const PCodes<MR>& pc, const std::byte* const* vr, int64_t dv, float* o, int64_t ldo, const float* alpha,
                Step& step) {
  using namespace i8_detail;
  const int64_t dv_pad = padded_dim(dv);
  if (alpha) {
    for (int m = 0; m < MR; ++m) {
      const Batch a(alpha[m]);
      for (int64_t x = 0; x < dv_pad; x += kLanes)
        (Batch::load_aligned(o + m * ldo + x) * a).store_aligned(o + m * ldo + x);
    }
  }
  for (int64_t c0 = 0; c0 < dv; c0 += kI8Chunk) {
    const int64_t rem = dv - c0;
    const bool two = rem > 32;  // block types, AVX-512: the chunk's second block exists
    for (int m0 = 0; m0 < MR; m0 += kPvRows) {
      constexpr int kRows = MR < kPvRows ? MR : kPvRows;
      const int rows = MR - m0 < kRows ? MR - m0 : kRows;
      IVec acc[kRows][4];
      for (int r = 0; r < kRows; ++r)
        for (int k = 0; k < 4; ++k) acc[r][k] = izero();
      for (int g = 0; g < kTileKeys / 4; ++g) {
        for (int x = 0; x < kI8Chunk / kLanes; ++x) step();
        const IVec r0 = v_codes<T>(vr[4 * g], c0, rem), r1 = v_codes<T>(vr[4 * g + 1], c0, rem);
        const IVec r2 = v_codes<T>(vr[4 * g + 2], c0, rem), r3 = v_codes<T>(vr[4 * g + 3], c0, rem);
        const IVec a = lo8(r0, r1), b = lo8(r2, r3), c = hi8(r0, r1), d = hi8(r2, r3);
        const IVec xk[4] = {lo16(a, b), hi16(a, b), lo16(c, d), hi16(c, d)};
        for (int r = 0; r < kRows; ++r) {
          if (r >= rows) break;
          const IVec pw = p_word<T>(pc, m0 + r, g, c0, two);
          for (int k = 0; k < 4; ++k) {
            acc[r][k] = T == KvDType::Q4_0 ? dot4<true>(acc[r][k], xk[k], pw) : dot4<true>(acc[r][k], pw, xk[k]);
          }
        }
      }
      for (int r = 0; r < rows; ++r) {
        const int m = m0 + r;
        IVec cols[4];
        column_order(acc[r], cols);
        for (int n = 0; n < 4; ++n) {
          const int64_t col = c0 + n * kLanes;
          if (col >= dv_pad) break;
          const int64_t b = is_row_type(T) ? 0 : col / 32;
          float* dst = o + m * ldo + col;
          const Batch v = simd::fma(to_float(cols[n]), Batch(pc.quantum[m][b]), Batch::load_aligned(dst));
          (v - Batch(pc.sub[m][b])).store_aligned(dst);
        }
      }
    }
  }
}
#else
// The scalar and NEON targets: the same sums, column by column (codes as they are; u8's zero point unshifted).
template <int MR, KvDType T, class Step>
void pv_tile_i8(const PCodes<MR>& pc, const std::byte* const* vr, int64_t dv, float* o, int64_t ldo, const float* alpha,
                Step& step) {
  for (int m = 0; m < MR; ++m) {
    float* om = o + m * ldo;
    if (alpha)
      for (int64_t i = 0; i < dv; ++i) om[i] *= alpha[m];
    for (int64_t i = 0; i < dv; ++i) {
      const int64_t b = is_row_type(T) ? 0 : i / 32;
      int32_t sum = 0;
      for (int j = 0; j < kTileKeys; ++j) {
        step();
        const auto* u = reinterpret_cast<const uint8_t*>(vr[j]);
        int32_t c;
        if constexpr (T == KvDType::U8) {
          c = u[8 + i];
        } else if constexpr (T == KvDType::U4) {
          c = i % 2 ? u[8 + i / 2] >> 4 : u[8 + i / 2] & 0x0f;
        } else if constexpr (T == KvDType::Q8_0) {
          c = static_cast<int8_t>(u[b * 34 + 2 + i % 32]);
        } else {
          const int64_t y = i % 32;
          c = y < 16 ? u[b * 18 + 2 + y] & 0x0f : u[b * 18 + 2 + y - 16] >> 4;
        }
        const int32_t pj = T == KvDType::Q4_0 ? static_cast<int8_t>(pc.code[m][b][j]) : pc.code[m][b][j];
        sum += pj * c;
      }
      om[i] = std::fma(static_cast<float>(sum), pc.quantum[m][b], om[i]) - pc.sub[m][b];
    }
  }
}
#endif

// decode_i8's P.V on a u8 / u4 V tile that every row of the panel sees whole (nk = kTileKeys):
// x_j = (c_j - zp_j) sc_j, so sum_j p_j x_j = sum_j (p_j sc_j) c_j - sum_j p_j sc_j zp_j. P (MR rows,
// kTileKeys apart) takes each key's scale in place and off[m] gets row m's second sum, to come off
// O after the P.V over the codes alone (Codes<T>): V's widening loses its subtract and multiply.
// A NaN scale or zero point (a V row that held NaN or Inf) makes the row's O NaN, as the reference.
template <int MR, KvDType T>
inline void fold_row_scales(float* p, const Rows<Quant<T>>& v, float* off) {
  alignas(64) float sc[kTileKeys], zp[kTileKeys];
  for (int j = 0; j < kTileKeys; ++j) {
    const auto* r = reinterpret_cast<const std::byte*>(v.row(j));
    sc[j] = kv_read::load_f32(r), zp[j] = kv_read::load_f32(r + 4);
  }
  for (int m = 0; m < MR; ++m) {
    Batch c(0.f);
    for (int j = 0; j < kTileKeys; j += kLanes) {
      const Batch pj = Batch::load_aligned(p + m * kTileKeys + j) * Batch::load_aligned(sc + j);
      pj.store_aligned(p + m * kTileKeys + j);
      c = simd::fma(pj, Batch::load_aligned(zp + j), c);
    }
    off[m] = reduce_sum(c);
  }
}

// The codes of V's rows: each run's first row 8 bytes on (past its scale and zero point).
template <KvDType T>
inline Rows<Codes<T>> codes_of(const Rows<Quant<T>>& v) {
  Rows<Codes<T>> c;
  for (int r = 0; r < v.runs; ++r) {
    c.at[r] = reinterpret_cast<const Codes<T>*>(reinterpret_cast<const std::byte*>(v.at[r]) + 8);
  }
  std::copy(v.first, v.first + Rows<Quant<T>>::kMaxRuns + 1, c.first);
  c.runs = v.runs, c.ld = v.ld;
  return c;
}

}  // namespace attnlab::ATTN_TARGET_NS::simd
