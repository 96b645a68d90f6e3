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
// operand - q8_0's as c + 128 (one xor), the extra 128 sum_b q taken back by starting one lane per key
// at -128 sum_b q, q4_0's -8 the same way - and Q's codes the signed one, stored in the order K's
// u4 nibbles unpack in (the lows, then the highs), so no K byte is shuffled; keys ride in 128-bit
// lanes (score_rows_i8). Elsewhere vpmaddubsw + vpmaddwd make the same sums (score_rows_i8 says how).
// Block types scale each block's int32 sum by its dq dk; row types add the row in int32, scale once.
// decode_i8's P.V in integers (round_p_rows, pv_tile_i8) follows below.
// Why: a widened code costs a load, two conversions and a multiply per lane before its FMA
// (kv_load.hpp); vpdpbusd does four products per lane in one instruction, on the codes as stored.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "attnlab/kv_quant.hpp"
#include "attnlab/blocks/kv_read.hpp"
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

// The VNNI unit of this target (kI8Unit: the ISA name the CPU must run for vpdpbusd, isa.cpp), the
// values a vector step takes (kI8Chunk) and the unit decode_i8's K.Q sums with (kI8ScoreUnit: the VNNI
// unit, or on the NEON target sdot; "" on the scalar target: the rule) are the floor's. Without VNNI
// (or with ATTN_NO_VNNI=1 in the environment: tests and comparisons) the same sums come from
// vpmaddubsw + vpmaddwd (Tiling::i8_vnni, make_tiling).
inline constexpr bool kI8VnniBuilt = kI8Unit[0] != '\0';  // this target has a vpdpbusd path

// One Q row's integer form (I8Layout::row bytes each, 64-byte aligned): dpad = d rounded up to 64.
//   nat[dpad]     the codes in natural order (score_row_rule; the block types' slices), zero padded
//   vec[dpad]     the same codes in the vector order (vec_slot: u4's lows then highs per chunk)
//   bs[dpad/32]   per block: dq scale log2e (row types: one)
//   bsum[dpad/32] per block: the sum of its codes (row types: one)
struct I8Layout {
  int64_t d = 0, dpad = 0, row = 0;
  constexpr explicit I8Layout(int64_t dim = 0) : d(dim), dpad((dim + 63) / 64 * 64) {
    row = (dpad * 2 + dpad / 32 * 8 + 63) / 64 * 64;
  }
};
struct I8Row {
  int8_t* nat;
  int8_t* vec;
  float* bs;
  int32_t* bsum;
  I8Row(std::byte* base, const I8Layout& l)
      : nat(reinterpret_cast<int8_t*>(base)),
        vec(nat + l.dpad),
        bs(reinterpret_cast<float*>(vec + l.dpad)),
        bsum(reinterpret_cast<int32_t*>(bs + l.dpad / 32)) {}
};

// Where natural value k of a row lies in the vector order: the order score_rows_i8 unpacks a chunk
// of a u4 row's codes in (the bytes' low nibbles - the even values - then their high ones).
inline int64_t vec_slot(KvDType t, int64_t k) {
  const int64_t c = k / kI8Chunk * kI8Chunk, x = k % kI8Chunk;
  if (t == KvDType::U4) return c + (x % 2 ? kI8Chunk / 2 : 0) + x / 2;
  return k;
}

// round_int8's per-value rule (kv_quant.cpp: int8_code) on y = x / scale, lane by lane: truncation,
// the fraction's test, then r + 1, r - 1 or r - exact in float (|r| <= 128) - clamped to +-127.
inline Batch int8_code_lanes(Batch y) {
  const Batch r = trunc_float(y), half(0.5f), one(1.f);
  const Batch frac = y - r;
  const Batch rounded = select(frac >= half, r + one, select(frac <= -half, r - one, r));
  return min(max(rounded, Batch(-127.f)), Batch(127.f));
}

// round_int8 (kv_quant.hpp) over one block of n values, in vectors: the same operations in the same
// order per value (amax by max, scale = amax / 127, y = x / scale, truncation, the fraction's test,
// the clamp), so the same codes and scale bit for bit - tests/kernels/test_simd_math.cpp checks it on every
// target. The rule's scalar form spends a division and a branch per value: flash_int8 rounds every
// Q and K value once per run, decode_i8 its Q rows once per task (pack_i8_row).
inline bool round_int8_row(const float* x, int64_t n, int8_t* q, float* scale_out) {
  if constexpr (!kI8Vector) {
    return round_int8(x, n, n, q, scale_out);
  } else {
    Batch amax(0.f), bad(0.f);
    for (int64_t i = 0; i < n; i += kLanes) {
      const Batch v = load_partial(x + i, static_cast<int>(std::min<int64_t>(kLanes, n - i)));
      bad += v - v;  // 0 for finite values; NaN from a NaN or an Inf
      amax = max(amax, abs_of(v));
    }
    if (reduce_sum(bad) != 0.f) return false;
    const float scale = reduce_max(amax) / 127.f;
    *scale_out = scale;
    if (!(scale > 0.f)) {
      std::memset(q, 0, static_cast<size_t>(n));
      return true;
    }
    const Batch sc(scale);
    for (int64_t i = 0; i < n; i += kLanes) {
      const int m = static_cast<int>(std::min<int64_t>(kLanes, n - i));
      alignas(64) float out[kLanes];
      int8_code_lanes(load_partial(x + i, m) / sc).store_aligned(out);
      for (int k = 0; k < m; ++k) q[i + k] = static_cast<int8_t>(out[k]);
    }
    return true;
  }
}

// Rounds Q row x (d floats) into its integer form; false when round_q_row cannot (the task then
// scores in float32 and never reads the row).
inline bool pack_i8_row(KvDType t, const float* x, const I8Layout& l, float q_scale, std::byte* base) {
  const I8Row r(base, l);
  std::memset(base, 0, static_cast<size_t>(l.row));
  const int64_t block = q_block_values(t, l.d);
  // round_q_row's rule block by block in vectors (round_int8_row: the same codes and scales), not the
  // rule's division per value: decode_i8 1.04-1.13x at GQA 4-16 (q4_0 and u8, 32k keys, paired), as
  // decode's short chunks round Q once per task. A row with a NaN or an Inf in any block: no rounding.
  for (int64_t b = 0, b0 = 0; b0 < l.d; ++b, b0 += block) {
    float scale = 0.f;
    if (!round_int8_row(x + b0, std::min(block, l.d - b0), r.nat + b0, &scale)) return false;
    r.bs[b] = scale * q_scale;
    int32_t sum = 0;
    for (int64_t k = b0; k < std::min(b0 + block, l.d); ++k) {
      r.vec[vec_slot(t, k)] = r.nat[k];
      sum += r.nat[k];
    }
    r.bsum[b] = sum;
  }
  return true;
}

// A score from its integer dot products: dot(b) is the exact int32 sum of Q's codes times K's codes
// over block b (a row type: b = 0, the whole row, K's codes as stored, the zero point after). The
// rule and the NEON target's sdot path combine their integers here, so they agree bit for bit.
template <KvDType T, class Dot>
inline float score_from_dots(const I8Row& q, const std::byte* kr, int64_t d, Dot&& dot) {
  if constexpr (is_row_type(T)) {
    const float sc = kv_read::load_f32(kr), zp = kv_read::load_f32(kr + 4);
    return std::fma(-zp, static_cast<float>(q.bsum[0]), static_cast<float>(dot(0))) * q.bs[0] * sc;
  } else {
    constexpr int64_t kBytes = T == KvDType::Q8_0 ? 34 : 18;
    float s = 0.f;
    for (int64_t b = 0; b < d / 32; ++b)
      s += q.bs[b] * kv_read::scale_f16(kr + b * kBytes) * static_cast<float>(dot(b));
    return s;
  }
}

// The rule: one score of Q row q against K row kr (type T), by the formulas above.
template <KvDType T>
inline float score_row_rule(const I8Row& q, const std::byte* kr, int64_t d) {
  const auto* u = reinterpret_cast<const uint8_t*>(kr);
  return score_from_dots<T>(q, kr, d, [&](int64_t b) {
    int32_t dot = 0;
    if constexpr (is_row_type(T)) {
      for (int64_t i = 0; i < d; ++i) {
        const int32_t c = T == KvDType::U8 ? u[8 + i] : (i % 2 ? u[8 + i / 2] >> 4 : u[8 + i / 2] & 0x0f);
        dot += q.nat[i] * c;
      }
    } else {
      const uint8_t* blk = u + b * (T == KvDType::Q8_0 ? 34 : 18);
      for (int i = 0; i < 32; ++i) {
        const int32_t c = T == KvDType::Q8_0 ? static_cast<int8_t>(blk[2 + i])
                                             : (i < 16 ? blk[2 + i] & 0x0f : blk[2 + i - 16] >> 4) - 8;
        dot += q.nat[b * 32 + i] * c;
      }
    }
    return dot;
  });
}

inline constexpr int kSliceBlock = 4 * i8_detail::kSliceKeys;      // keys per register block: 4 vectors of keys
inline constexpr int kSliceRows = kVectorRegisters == 32 ? 4 : 2;  // rows per pass: 4 x 4 accumulators (AVX2: 2 x 4)

// score_rows (microkernel.hpp) in integers, on the floor's integer vectors (kI8Vector): s[m * kTileKeys
// + j] for rows m < MR (I8Row rows `ld` bytes apart from q0) and keys [ja, jb). Keys ride in 128-bit
// lanes: a vector holds kSliceKeys keys (4 on AVX-512, 2 on AVX2), each with the same 16 of its codes
// (a slice, put together from the K rows by lane-masked broadcasts: slice_of), and vpdpbusd against
// Q's matching 16 codes broadcast to every lane leaves per key 4 partial sums; summing those is one
// shuffle stage per 4 vectors of keys (group_sums), where a key x row block of dot products would
// need a whole horizontal reduction per (row, key). Slices: u8 16 codes; u4 a slice of 16 bytes
// gives two (lows, highs: Q's vec_slot order); q8_0 a block's two halves; q4_0 a block's 16 bytes
// give its values 0..15 and 16..31. Row types sum in int32 across the row and scale once per key:
// (I - zp sum q) dq sc; block types scale each block's int32 sum by dq_b dk_b (dk per lane: its
// key's), summed in float.
// Vnni: dot4 by vpdpbusd (the CPU has the target's VNNI unit), else by vpmaddubsw + vpmaddwd, whose
// unsigned operand must stay <= 128: q8_0's codes and u8's minus 128 go in as their magnitudes with
// their signs moved onto Q (sign8), so q8_0 needs no offset and u8's sum is I - 128 sum q (its zero
// point read 128 lower). With VNNI q8_0's codes go in as c + 128 (one xor) and q4_0's nibbles as
// they are; each block's lane 0 per key starts at -128 sum_b q resp. -8 sum_b q.
// The slices of the kSliceKeys keys at p (row types): chunk c's kI8Chunk / 16 vectors (rem: the
// row's values from the chunk on).
template <KvDType T, bool Vnni>
inline void row_slices(const std::byte* const* p, int64_t c, int64_t rem, i8_detail::IVec* v) {
  using namespace i8_detail;
  if constexpr (T == KvDType::U8) {
    for (int x = 0; x < kI8Chunk / 16; ++x) {
      v[x] = slice_of(p, 8 + c * kI8Chunk + 16 * x, rem - 16 * x);
      if constexpr (!Vnni) v[x] = xor80(v[x]);
    }
  } else {  // u4: kI8Chunk / 32 slices of 16 bytes, lows then highs (vec_slot's order)
    constexpr int kB = kI8Chunk / 32;
    for (int x = 0; x < kB; ++x) {
      const IVec a = slice_of(p, 8 + c * kI8Chunk / 2 + 16 * x, (rem + 1) / 2 - 16 * x);
      v[x] = nibbles_lo(a), v[kB + x] = nibbles_hi(a);
    }
  }
}
// The slices of the kSliceKeys keys at p (block types): block b's two (values 0..15, 16..31).
template <KvDType T, bool Vnni>
inline void block_slices(const std::byte* const* p, int64_t b, i8_detail::IVec* v) {
  using namespace i8_detail;
  constexpr int kBytes = T == KvDType::Q8_0 ? 34 : 18;
  if constexpr (T == KvDType::Q8_0) {
    v[0] = slice_of(p, b * kBytes + 2, 16), v[1] = slice_of(p, b * kBytes + 18, 16);
    if constexpr (Vnni) v[0] = xor80(v[0]), v[1] = xor80(v[1]);
  } else {
    const IVec a = slice_of(p, b * kBytes + 2, 16);
    v[0] = nibbles_lo(a), v[1] = nibbles_hi(a);
  }
}
template <int MR, KvDType T, bool Vnni, class Step>
void score_rows_i8_slices(const I8Layout& l, const std::byte* q0, int64_t ld, const Rows<Quant<T>>& k, int ja, int jb,
                          float* s, Step& step) {
  using namespace i8_detail;
  constexpr bool kRow = is_row_type(T);
  constexpr bool kSigned = !Vnni && (T == KvDType::Q8_0 || T == KvDType::U8);  // magnitude x moved sign
  constexpr float kZpShift = !Vnni && T == KvDType::U8 ? 128.f : 0.f;
  const int64_t d = l.d, chunks = (d + kI8Chunk - 1) / kI8Chunk, blocks = d / 32;
  // One dot4 of a K slice with Q's slice at q (int8, 16 codes).
  const auto dot = [](IVec acc, IVec kv, const int8_t* q) {
    const IVec qb = bcast_slice(q);
    return kSigned ? dot4<Vnni>(acc, abs8(kv), sign8(qb, kv)) : dot4<Vnni>(acc, kv, qb);
  };
  for (int j0 = ja / kSliceBlock * kSliceBlock; j0 < jb; j0 += kSliceBlock) {
    const std::byte* kr[kSliceBlock];  // keys past jb repeat the last one (computed, never stored)
    for (int c = 0; c < kSliceBlock; ++c)
      kr[c] = reinterpret_cast<const std::byte*>(k.row(j0 + c < jb ? j0 + c : jb - 1));
    alignas(64) float sc[kSliceBlock], zp[kSliceBlock];
    if constexpr (kRow) {
      for (int c = 0; c < kSliceBlock; ++c)
        sc[c] = kv_read::load_f32(kr[c]), zp[c] = kv_read::load_f32(kr[c] + 4) - kZpShift;
    }
    const int n = jb - j0 < kSliceBlock ? jb - j0 : kSliceBlock;
    const int lo = ja > j0 ? ja - j0 : 0;
    for (int r0 = 0; r0 < MR; r0 += kSliceRows) {
      constexpr int kR = MR < kSliceRows ? MR : kSliceRows;
      const int rows = MR - r0 < kR ? MR - r0 : kR;
      const auto q = [&](int r) {  // rows past MR repeat the pass's first (computed, never stored)
        return I8Row(const_cast<std::byte*>(q0 + (r0 + (r < rows ? r : 0)) * ld), l);
      };
      Batch sums[kR];
      if constexpr (kRow) {
        IVec acc[kR][4];
        for (int r = 0; r < kR; ++r)
          for (int g = 0; g < 4; ++g) acc[r][g] = izero();
        for (int64_t c = 0; c < chunks; ++c) {
          const int64_t rem = d - c * kI8Chunk;
#pragma GCC unroll 4
          for (int g = 0; g < 4; ++g) {
            for (int x = 0; x < kSliceKeys * kI8Chunk / kLanes / kDotKeys; ++x) step();  // score_rows' pace
            IVec v[kI8Chunk / 16];
            row_slices<T, Vnni>(kr + g * kSliceKeys, c, rem, v);
            for (int r = 0; r < kR; ++r) {
              const int8_t* qv = q(r).vec + c * kI8Chunk;
              for (int x = 0; x < kI8Chunk / 16; ++x) acc[r][g] = dot(acc[r][g], v[x], qv + 16 * x);
            }
          }
        }
        for (int r = 0; r < kR; ++r) {
          const Batch dot_sum = to_float(group_sums(acc[r]));
          sums[r] = simd::fma(-Batch::load_aligned(zp), Batch(static_cast<float>(q(r).bsum[0])), dot_sum) *
                    Batch(q(r).bs[0]) * Batch::load_aligned(sc);
        }
      } else {
        Batch acc[kR][4];
        for (int r = 0; r < kR; ++r)
          for (int g = 0; g < 4; ++g) acc[r][g] = Batch(0.f);
        constexpr int kBytes = T == KvDType::Q8_0 ? 34 : 18;
        for (int64_t b = 0; b < blocks; ++b) {
          const Batch dk = f16_at(kr, b * kBytes);
          IVec start[kR];  // each key's lane 0: the codes' offset times the block's sum of Q codes
          for (int r = 0; r < kR; ++r) {
            start[r] = Vnni ? lane0_of_each_key((T == KvDType::Q8_0 ? -128 : -8) * q(r).bsum[b])
                            : lane0_of_each_key(T == KvDType::Q4_0 ? -8 * q(r).bsum[b] : 0);
          }
#pragma GCC unroll 4
          for (int g = 0; g < 4; ++g) {
            for (int x = 0; x < kSliceKeys * 32 / kLanes / kDotKeys; ++x) step();
            IVec v[2];
            block_slices<T, Vnni>(kr + g * kSliceKeys, b, v);
            const IVec v0 = v[0], v1 = v[1];
            const Batch dkv = spread_keys(dk, g);
            for (int r = 0; r < kR; ++r) {
              const int8_t* qn = q(r).nat + 32 * b;
              const IVec sum = dot(dot(start[r], v0, qn), v1, qn + 16);
              acc[r][g] = simd::fma(to_float(sum), dkv * Batch(q(r).bs[b]), acc[r][g]);
            }
          }
        }
        for (int r = 0; r < kR; ++r) sums[r] = group_sums(acc[r]);
      }
      for (int r = 0; r < rows; ++r) {
        float* dst = s + (r0 + r) * kTileKeys + j0;
        if (lo == 0 && n == kSliceBlock) {
          sums[r].store_aligned(dst);
        } else {  // an edge block: its keys in [ja, jb) only
          alignas(64) float lanes[kSliceBlock];
          sums[r].store_aligned(lanes);
          for (int c = lo; c < n; ++c) dst[c] = lanes[c];
        }
      }
    }
  }
}
// A direct task of 2 panels or more (decode_i8 at GQA >= 8; tiles.cpp's prep_i8_tile) scores every
// panel against the same tile, so the tile is laid out once as a small GEMM's operand (prep_k_words):
// K^T by 32-bit words, as flash_int8's key tiles -
//   words[x * kTileKeys + j]   key j's codes 4x .. 4x + 3 in Q's order (nat; u4: vec), the unsigned
//                              operand as score_rows_i8_slices takes it (zero past the row's codes)
//   scale[b * kTileKeys + j]   block types: key j's scale of block b as a float; row types: its
//                              scale, then (at kTileKeys + j) its zero point as the sum sees it
// so one vpdpbusd sums a word of kLanes keys against a broadcast Q word and a key's block sum ends
// in one lane: block types scale once per block, key vector and row (a conversion and an FMA per 8
// vpdpbusd, where the slices spend them per 2), and no group_sums. Made from kLanes keys' packed code
// bytes (key_bytes) transposed by words (transpose_words), nibbles split after the transpose.
inline constexpr bool is_nibble_type(KvDType t) { return t == KvDType::U4 || t == KvDType::Q4_0; }
// Transposes per kLanes keys: the row's code bytes, 4 kLanes at a time.
inline constexpr int64_t key_byte_steps(KvDType t, int64_t d) {
  const int64_t bytes = t == KvDType::U8 || t == KvDType::Q8_0 ? d : (d + 1) / 2;
  return (bytes + 4 * kLanes - 1) / (4 * kLanes);
}
// Word rows a tile holds, and the words a score sums (Q's codes past them are zero).
inline constexpr int64_t key_word_rows(KvDType t, int64_t d) {
  return key_byte_steps(t, d) * kLanes * (is_nibble_type(t) ? 2 : 1);
}
inline constexpr int64_t key_words_summed(KvDType t, int64_t d) {
  return is_row_type(t) ? (d + kI8Chunk - 1) / kI8Chunk * (kI8Chunk / 4) : d / 4;
}
inline constexpr size_t key_words_bytes(KvDType t, int64_t d) {
  return static_cast<size_t>((key_word_rows(t, d) + (is_row_type(t) ? 2 : d / 32)) * kTileKeys * 4);
}
// The word of packed dword px (bytes 4px .. 4px + 3 of the codes; nibble types: their low nibbles,
// the high ones' word is lo_word + kHiWords): q4_0's block holds values 0..15 in its low nibbles and
// 16..31 in its high ones; u4's chunk of kI8Chunk values its even values low, odd high (vec_slot).
template <KvDType T>
inline constexpr int64_t kHiWords = T == KvDType::Q4_0 ? 4 : kI8Chunk / 8;
template <KvDType T>
inline int64_t lo_word(int64_t px) {
  if constexpr (is_nibble_type(T)) return px / kHiWords<T> * 2 * kHiWords<T> + px % kHiWords<T>;
  return px;
}

template <KvDType T, bool Vnni>
void prep_k_words(const I8Layout& l, const Rows<Quant<T>>& k, int nk, std::byte* out) {
  using namespace i8_detail;
  constexpr bool kFlip = Vnni ? T == KvDType::Q8_0 : T == KvDType::U8;  // q8_0 as c + 128; no VNNI: u8 as c - 128
  const int64_t d = l.d, steps = key_byte_steps(T, d);
  auto* w = reinterpret_cast<int32_t*>(out);
  float* sc = reinterpret_cast<float*>(out) + key_word_rows(T, d) * kTileKeys;
  for (int j0 = 0; j0 < kTileKeys; j0 += kLanes) {
    const std::byte* kr[kLanes];  // keys past nk repeat the last (computed, never stored)
    for (int c = 0; c < kLanes; ++c) kr[c] = reinterpret_cast<const std::byte*>(k.row(j0 + c < nk ? j0 + c : nk - 1));
    for (int64_t t = 0; t < steps; ++t) {
      IVec x[kLanes];
      for (int c = 0; c < kLanes; ++c) x[c] = key_bytes<T>(kr[c], t, d);
      transpose_words(x);
      for (int y = 0; y < kLanes; ++y) {
        const int64_t px = t * kLanes + y;
        if constexpr (is_nibble_type(T)) {
          store_ivec(w + lo_word<T>(px) * kTileKeys + j0, nibbles_lo(x[y]));
          store_ivec(w + (lo_word<T>(px) + kHiWords<T>)*kTileKeys + j0, nibbles_hi(x[y]));
        } else {
          store_ivec(w + px * kTileKeys + j0, kFlip ? xor80(x[y]) : x[y]);
        }
      }
    }
    if constexpr (is_row_type(T)) {
      constexpr float kZpShift = !Vnni && T == KvDType::U8 ? 128.f : 0.f;
      for (int c = 0; c < kLanes; ++c)
        sc[j0 + c] = kv_read::load_f32(kr[c]), sc[kTileKeys + j0 + c] = kv_read::load_f32(kr[c] + 4) - kZpShift;
    } else {
      constexpr int kBytes = T == KvDType::Q8_0 ? 34 : 18;
      for (int64_t b = 0; b < d / 32; ++b) f16_at(kr, b * kBytes).store_aligned(sc + b * kTileKeys + j0);
    }
  }
}

// score_rows_i8 on a tile's words (prep_k_words): rows in passes of kWordRows, NV vectors of keys
// at a time, each step one word of every key vector against each row's broadcast word.
inline constexpr int kWordRows = kVectorRegisters == 32 ? 4 : 2;
template <int MR, KvDType T, bool Vnni, class Step>
void score_rows_i8_words(const I8Layout& l, const std::byte* q0, int64_t ld, int ja, int jb, float* s, Step& step,
                         const std::byte* pre) {
  using namespace i8_detail;
  constexpr bool kRow = is_row_type(T);
  constexpr bool kSigned = !Vnni && (T == KvDType::Q8_0 || T == KvDType::U8);  // magnitude x moved sign
  constexpr int kR = MR < kWordRows ? MR : kWordRows;
  // int32 (and for block types float) accumulators, NV key vectors and kR Q words in registers
  constexpr int NV = kRow && kVectorRegisters == 32 ? 4 : 2;
  const int64_t d = l.d, nw = key_words_summed(T, d);
  const auto* w = reinterpret_cast<const int32_t*>(pre);
  const float* sc = reinterpret_cast<const float*>(pre) + key_word_rows(T, d) * kTileKeys;
  const int va = ja / kLanes, vb = (jb + kLanes - 1) / kLanes;
  for (int v0 = va; v0 < vb; v0 += NV) {
    const int nv = vb - v0 < NV ? vb - v0 : NV;  // vectors past nv repeat v0 (computed, never stored)
    for (int r0 = 0; r0 < MR; r0 += kR) {
      const int rows = MR - r0 < kR ? MR - r0 : kR;
      const auto q = [&](int r) {  // rows past MR repeat the pass's first (computed, never stored)
        return I8Row(const_cast<std::byte*>(q0 + (r0 + (r < rows ? r : 0)) * ld), l);
      };
      const int8_t* qc[kR];
      for (int r = 0; r < kR; ++r) qc[r] = T == KvDType::U4 ? q(r).vec : q(r).nat;
      // Word x of the NV key vectors times each row's word x.
      const auto word = [&](IVec(&acc)[kR][NV], int64_t x) {
        IVec kv[NV];
        for (int n = 0; n < NV; ++n) {
          step();
          kv[n] = load_ivec(w + x * kTileKeys + (v0 + (n < nv ? n : 0)) * kLanes);
        }
        for (int r = 0; r < kR; ++r) {
          int32_t qw;
          std::memcpy(&qw, qc[r] + 4 * x, 4);
          const IVec qb = bcast32(qw);
          for (int n = 0; n < NV; ++n)
            acc[r][n] =
                kSigned ? dot4<Vnni>(acc[r][n], abs8(kv[n]), sign8(qb, kv[n])) : dot4<Vnni>(acc[r][n], kv[n], qb);
        }
      };
      Batch out[kR][NV];
      if constexpr (kRow) {
        IVec acc[kR][NV];
        for (int r = 0; r < kR; ++r)
          for (int n = 0; n < NV; ++n) acc[r][n] = izero();
        for (int64_t x = 0; x < nw; ++x) word(acc, x);
        for (int r = 0; r < kR; ++r)
          for (int n = 0; n < NV; ++n) {
            const float* kc = sc + (v0 + (n < nv ? n : 0)) * kLanes;
            out[r][n] = simd::fma(-Batch::load_aligned(kc + kTileKeys), Batch(static_cast<float>(q(r).bsum[0])),
                                  to_float(acc[r][n])) *
                        Batch(q(r).bs[0]) * Batch::load_aligned(kc);
          }
      } else {
        for (int r = 0; r < kR; ++r)
          for (int n = 0; n < NV; ++n) out[r][n] = Batch(0.f);
        for (int64_t b = 0; b < d / 32; ++b) {
          IVec acc[kR][NV];  // each lane starts at the codes' offset times the block's sum of Q codes
          for (int r = 0; r < kR; ++r) {
            const int32_t off = Vnni ? (T == KvDType::Q8_0 ? -128 : -8) : (T == KvDType::Q4_0 ? -8 : 0);
            for (int n = 0; n < NV; ++n) acc[r][n] = bcast32(off * q(r).bsum[b]);
          }
          for (int64_t x = 8 * b; x < 8 * b + 8; ++x) word(acc, x);
          for (int r = 0; r < kR; ++r)
            for (int n = 0; n < NV; ++n) {
              const Batch dk = Batch::load_aligned(sc + b * kTileKeys + (v0 + (n < nv ? n : 0)) * kLanes);
              out[r][n] = simd::fma(to_float(acc[r][n]), dk * Batch(q(r).bs[b]), out[r][n]);
            }
        }
      }
      for (int r = 0; r < rows; ++r)
        for (int n = 0; n < nv; ++n) {
          const int j = (v0 + n) * kLanes;
          float* dst = s + (r0 + r) * kTileKeys + j;
          if (j >= ja && j + kLanes <= jb) {
            out[r][n].store_aligned(dst);
          } else {  // an edge vector: its keys in [ja, jb) only
            alignas(64) float lanes[kLanes];
            out[r][n].store_aligned(lanes);
            for (int c = std::max(ja - j, 0); c < std::min(jb - j, kLanes); ++c) dst[c] = lanes[c];
          }
        }
    }
  }
}

// Elsewhere the rule, key by key; the NEON target with Vnni (the CPU has sdot: kI8Sdot): the same
// integers by the floor's sdot_codes, combined by the rule's own code (score_from_dots).
template <int MR, KvDType T, bool Vnni, class Step>
void score_rows_i8_keys(const I8Layout& l, const std::byte* q0, int64_t ld, const Rows<Quant<T>>& k, int ja, int jb,
                        float* s, Step& step) {
  for (int m = 0; m < MR; ++m) {
    const I8Row q(const_cast<std::byte*>(q0 + m * ld), l);
    for (int j = ja; j < jb; ++j) {
      step();
      const auto* kr = reinterpret_cast<const std::byte*>(k.row(j));
      if constexpr (Vnni && kI8Sdot) {
        const auto* u = reinterpret_cast<const uint8_t*>(kr);
        s[m * kTileKeys + j] = score_from_dots<T>(
            q, kr, l.d, [&](int64_t b) { return i8_detail::sdot_codes<T>(q.nat, q.bsum[0], u, l.d, b); });
      } else {
        s[m * kTileKeys + j] = score_row_rule<T>(q, kr, l.d);
      }
    }
  }
}

// score_rows (microkernel.hpp) in integers: on the floor's integer vectors (kI8Vector) the tile's
// words (pre: prep_k_words) when made, else the slices; elsewhere key by key.
template <int MR, KvDType T, bool Vnni, class Step>
void score_rows_i8(const std::byte* q0, int64_t ld, const std::byte*, const I8Layout& l, const Rows<Quant<T>>& k,
                   int ja, int jb, float* s, Step& step, const std::byte* pre = nullptr) {
  if constexpr (kI8Vector) {
    if (pre) return score_rows_i8_words<MR, T, Vnni>(l, q0, ld, ja, jb, s, step, pre);
    score_rows_i8_slices<MR, T, Vnni>(l, q0, ld, k, ja, jb, s, step);
  } else {
    score_rows_i8_keys<MR, T, Vnni>(l, q0, ld, k, ja, jb, s, step);
  }
}

// round_v_channels (kv_quant.hpp: flash_int8's V, per channel over n rows ld apart) in vectors: the
// same maxima, one division per scale, the same per-value operations as the rule - the same codes
// and scales bit for bit (tests/kernels/test_simd_math.cpp). The rule's division per value was a
// tenth of flash_int8's time at 8/8, d 128, 4096.
inline bool round_v_rows(const float* rows, int64_t ld, int64_t n, int64_t dv, int8_t* codes, float* scales) {
  if constexpr (!kI8Vector) {
    return round_v_channels(rows, ld, n, dv, codes, scales);
  } else {
    Batch bad(0.f);
    for (int64_t c = 0; c < dv; c += kLanes) {
      const int m = static_cast<int>(std::min<int64_t>(kLanes, dv - c));
      Batch amax(0.f);
      for (int64_t j = 0; j < n; ++j) {
        const Batch v = load_partial(rows + j * ld + c, m);
        bad += v - v;  // 0 for finite values; NaN from a NaN or an Inf
        amax = max(amax, abs_of(v));
      }
      store_partial(scales + c, amax / Batch(127.f), m);
    }
    if (reduce_sum(bad) != 0.f) return false;
    const Batch zero(0.f);
    for (int64_t c = 0; c < dv; c += kLanes) {
      const int m = static_cast<int>(std::min<int64_t>(kLanes, dv - c));
      const Batch sc = load_partial(scales + c, m);
      const auto live = sc > zero;  // a zero scale: codes 0 (x / 0 is NaN there)
      for (int64_t j = 0; j < n; ++j) {
        alignas(64) float out[kLanes];
        int8_code_lanes(select(live, load_partial(rows + j * ld + c, m) / sc, zero)).store_aligned(out);
        for (int k = 0; k < m; ++k) codes[j * dv + c + k] = static_cast<int8_t>(out[k]);
      }
    }
    return true;
  }
}

// round_smoothed_key (kv_quant.hpp) by round_int8_row: x - mean in float32, then the row's rounding.
inline bool round_smoothed_row(const float* x, const float* mean, int64_t n, int8_t* q, float* scale) {
  alignas(64) float centred[Problem::kMaxHeadDim];
  for (int64_t i = 0; i < n; ++i) centred[i] = x[i] - mean[i];
  return round_int8_row(centred, n, q, scale);
}

// flash_int8's K.Q (src/cpu/kernels/flash_int8.cpp): Q rows and smoothed K rows rounded to int8 per row
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
// The floor's integer vectors (kI8Vector): vpdpbusd, or vpmaddubsw + vpmaddwd.
template <int MR, bool Vnni, int LdS = kTileKeys>
void score_panel_i8_vector(const int32_t* qw, const I8KeyTile& l, const std::byte* tile, const float* qsc,
                           const float* qc, int ja, int jb, float* s) {
  using namespace i8_detail;
  constexpr int kV = kLanes;  // int32 lanes per vector
  static_assert(!kI8Vector || sizeof(IVec) == 4 * kLanes, "one int32 vector per float vector of scores");
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
        simd::fma(to_float(acc[m][v]) * sc, Batch(qsc[m]), Batch(qc[m])).store_aligned(s + m * LdS + j0 + v * kV);
      }
    }
  }
}
// Elsewhere: the same integers, key by key.
template <int MR, bool Vnni, int LdS = kTileKeys>
void score_panel_i8_words(const int32_t* qw, const I8KeyTile& l, const std::byte* tile, const float* qsc,
                          const float* qc, int ja, int jb, float* s) {
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
      s[m * LdS + j] = std::fma(static_cast<float>(dot) * ks[j], qsc[m], qc[m]);
    }
  }
}
// LdS: the score rows' stride (kTileKeys; a wide step's, kWideKeys).
template <int MR, bool Vnni, int LdS = kTileKeys>
void score_panel_i8(const int32_t* qw, const I8KeyTile& l, const std::byte* tile, const float* qsc, const float* qc,
                    int ja, int jb, float* s) {
  if constexpr (kI8Vector) {
    score_panel_i8_vector<MR, Vnni, LdS>(qw, l, tile, qsc, qc, ja, jb, s);
  } else {
    score_panel_i8_words<MR, Vnni, LdS>(qw, l, tile, qsc, qc, ja, jb, s);
  }
}

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
// The vector form runs where the floor has the integer vectors (kI8Vector), the rule elsewhere.
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
  return kv_read::load_f32(r + 4) - (T == KvDType::U8 && kI8Vector ? 128.f : 0.f);
}

// The MR rows' P (kTileKeys apart) times the scales sc of V scale block b rounded into pc by
// round_p_tile's rule. Vector targets: bit for bit the rule (the same max, one division, the same
// products, the same round-half-to-even conversion; tests/kernels/test_simd_math.cpp), four rows' horizontal
// max and sum at a time; `bad` gathers NaN from a NaN / Inf weight and, unsigned, from a negative
// one (the rule's false), checked once per tile by the caller (bad_weights). The rule itself
// elsewhere (false at once). zp: row types' zero points (sub = q sum code zp), else nullptr
// (sub = 8 q sum code for q4_0, 0 for q8_0). sc = nullptr (flash_int8: V's scales are per channel,
// applied after): the weights are P itself, exp2's results, never negative - no product, no sign test.
// LdP: P's row stride (kTileKeys; flash_int8's wide steps, kWideKeys).
template <int MR, bool kSigned, int LdP = kTileKeys>
inline bool round_p_block(const float* p, const float* sc, const float* zp, int64_t b, PCodes<MR>& pc, Batch& bad) {
  [[maybe_unused]] constexpr int32_t kLevels = kSigned ? 127 : 255;  // round_p_tile's
  if constexpr (kI8Vector) {
    constexpr int kV = kTileKeys / kLanes;
    Batch w[MR][kV], amax[MR + 3];
    for (int m = 0; m < MR; ++m) {
      amax[m] = Batch(0.f);
      for (int v = 0; v < kV; ++v) {
        w[m][v] = Batch::load_aligned(p + m * LdP + v * kLanes);
        if (sc) w[m][v] = w[m][v] * Batch::load_aligned(sc + v * kLanes);
        bad += w[m][v] - w[m][v];  // 0 for finite weights; NaN from a NaN or an Inf
        if (!kSigned && sc) {
          bad += select(w[m][v] < Batch(0.f), Batch(std::numeric_limits<float>::quiet_NaN()), Batch(0.f));
        }
        amax[m] = max(amax[m], abs_of(w[m][v]));
      }
    }
    for (int m = MR; m < MR + 3; ++m) amax[m] = Batch(0.f);
    alignas(64) float wmax[MR + 3], lanes[kLanes];
    for (int m = 0; m < MR; m += 4) {
      reduce4<true>(amax[m], amax[m + 1], amax[m + 2], amax[m + 3]).store_aligned(lanes);
      for (int x = 0; x < 4 && m + x < MR; ++x) wmax[m + x] = lanes[x];
    }
    Batch corr[MR + 3];
    for (int m = 0; m < MR + 3; ++m) corr[m] = Batch(0.f);
    for (int m = 0; m < MR; ++m) {
      uint8_t* out = pc.code[m][b];
      const float inv_s = static_cast<float>(kLevels) / wmax[m];
      if (!(wmax[m] > 0.f) || !std::isfinite(inv_s)) {  // all zero; a NaN or subnormal weights (rejected)
        if (wmax[m] > 0.f || std::isnan(wmax[m])) bad += Batch(std::numeric_limits<float>::quiet_NaN());
        std::memset(out, 0, kTileKeys);
        pc.quantum[m][b] = 0.f;
        continue;
      }
      pc.quantum[m][b] = wmax[m] / static_cast<float>(kLevels);
      const Batch inv(inv_s);
      for (int v = 0; v < kV; ++v) {
        // MXCSR's round half to even; |c| <= L
        const Batch cf = i8_detail::round_to_codes<kSigned>(w[m][v] * inv, out + v * kLanes);
        corr[m] = zp ? simd::fma(cf, Batch::load_aligned(zp + v * kLanes), corr[m]) : corr[m] + cf;
      }
    }
    for (int m = 0; m < MR; m += 4) {
      reduce4<false>(corr[m], corr[m + 1], corr[m + 2], corr[m + 3]).store_aligned(lanes);
      for (int x = 0; x < 4 && m + x < MR; ++x) {
        const float q = pc.quantum[m + x][b];
        pc.sub[m + x][b] = zp ? q * lanes[x] : kSigned ? 8.f * q * lanes[x] : 0.f;
      }
    }
    return true;
  } else {  // the rule itself
    (void)bad;
    for (int m = 0; m < MR; ++m) {
      float w[kTileKeys];
      int32_t ci[kTileKeys];
      for (int j = 0; j < kTileKeys; ++j) w[j] = sc ? p[m * LdP + j] * sc[j] : p[m * LdP + j];
      float q = 0.f;
      if (!round_p_tile(w, kTileKeys, kSigned, ci, &q)) return false;
      float corr = 0.f;
      for (int j = 0; j < kTileKeys; ++j) {
        pc.code[m][b][j] = static_cast<uint8_t>(ci[j]);
        corr += static_cast<float>(ci[j]) * (zp ? zp[j] : 1.f);
      }
      pc.quantum[m][b] = q;
      pc.sub[m][b] = zp ? q * corr : kSigned ? 8.f * q * corr : 0.f;
    }
    return true;
  }
}
inline bool bad_weights(Batch bad) { return reduce_sum(bad) != 0.f; }

// V's scales of a whole tile's rows (vr) as P.V multiplies P by them: per V scale block b (p_blocks)
// kTileKeys floats at out + b * kTileKeys, then (row types) the zero points (zp_of). A task of 3 panels
// or more gathers them once per tile (tiles.cpp's prep_i8_tile), the others once per panel.
inline int64_t v_scale_floats(KvDType t, int64_t dv) {
  return ((is_row_type(t) ? 1 : dv / 32) + (is_row_type(t) ? 1 : 0)) * kTileKeys;
}
template <KvDType T>
inline void v_tile_scales(const std::byte* const* vr, int64_t dv, float* out) {
  const int64_t nb = p_blocks<T>(dv);
  for (int64_t b = 0; b < nb; ++b) {
    float* sc = out + b * kTileKeys;
    if constexpr (is_row_type(T) || !kI8Vector) {
      for (int j = 0; j < kTileKeys; ++j) sc[j] = v_scale<T>(vr[j], b);
    } else {  // the f16 scales gathered and converted kLanes at a time (f16_at)
      for (int j = 0; j < kTileKeys; j += kLanes)
        f16_at(vr + j, b * (T == KvDType::Q8_0 ? 34 : 18)).store_aligned(sc + j);
    }
  }
  if constexpr (is_row_type(T)) {
    for (int j = 0; j < kTileKeys; ++j) out[nb * kTileKeys + j] = zp_of<T>(vr[j]);
  }
}

// Rounds the panel's P (MR rows, kTileKeys apart) times V's scales (vr: the tile's V rows; pre: their
// v_tile_scales, or nullptr) into pc, block by block (round_p_block); false when a weight is NaN or Inf
// (or negative, unsigned): then nothing is used and the tile runs in float32.
template <int MR, KvDType T>
inline bool round_p_rows(const float* p, const std::byte* const* vr, int64_t dv, PCodes<MR>& pc,
                         const float* pre = nullptr) {
  constexpr bool kSigned = T == KvDType::Q4_0;
  const int64_t nb = p_blocks<T>(dv);
  alignas(64) float own[(kMaxPBlocks + 1) * kTileKeys];
  if (!pre) v_tile_scales<T>(vr, dv, own);
  const float* sc = pre ? pre : own;
  Batch bad(0.f);
  for (int64_t b = 0; b < nb; ++b) {
    if (!round_p_block<MR, kSigned>(p, sc + b * kTileKeys, is_row_type(T) ? sc + nb * kTileKeys : nullptr, b, pc, bad))
      return false;
  }
  return !bad_weights(bad);
}

// P's operand for keys 4g .. 4g + 3 of row m over the chunk of columns from c0: the word of each
// lane's block (a 64-column chunk spans two blocks: the second half's word from block b + 1).
template <KvDType T, int MR>
inline i8_detail::IVec p_word(const PCodes<MR>& pc, int m, int g, int64_t c0, bool two) {
  const auto word = [&](int64_t b) {
    int32_t w;
    std::memcpy(&w, pc.code[m][b] + 4 * g, 4);
    return i8_detail::bcast32(w);
  };
  if constexpr (is_row_type(T)) {
    return word(0);
  } else if constexpr (kI8Chunk == 32) {
    return word(c0 / 32);  // a 32-column chunk: one block
  } else {
    return i8_detail::halves(word(c0 / 32), word(two ? c0 / 32 + 1 : c0 / 32));
  }
}

// V's codes for keys 4g .. 4g + 3 and the chunk of columns from c0 as vpdpbusd's signed operand: four
// rows interleaved by two unpack stages (xk[k] lane 4L + c: column 16L + 4k + c, key 4g + c).
template <KvDType T>
inline void v_words(const std::byte* const* vr, int g, int64_t c0, int64_t rem, i8_detail::IVec xk[4]) {
  using namespace i8_detail;
  const IVec r0 = v_codes<T>(vr[4 * g], c0, rem), r1 = v_codes<T>(vr[4 * g + 1], c0, rem);
  const IVec r2 = v_codes<T>(vr[4 * g + 2], c0, rem), r3 = v_codes<T>(vr[4 * g + 3], c0, rem);
  const IVec a = lo8(r0, r1), b = lo8(r2, r3), c = hi8(r0, r1), d = hi8(r2, r3);
  xk[0] = lo16(a, b), xk[1] = hi16(a, b), xk[2] = lo16(c, d), xk[3] = hi16(c, d);
}
// Bytes of a whole V tile's words (prep_v_words): per chunk of columns and 4 keys, 4 vectors.
inline int64_t v_word_bytes(int64_t dv) {
  return (dv + kI8Chunk - 1) / kI8Chunk * kTileKeys * static_cast<int64_t>(sizeof(i8_detail::IVec));
}
// A direct task of 3 panels or more: the whole V tile's words made once (v_words, in
// pv_tile_i8_vector's order) for every panel's P.V, instead of four loads and eight unpacks per 4
// keys in every pass of kPvRows rows.
template <KvDType T>
void prep_v_words(const std::byte* const* vr, int64_t dv, std::byte* out) {
  auto* v = reinterpret_cast<i8_detail::IVec*>(out);
  for (int64_t c0 = 0; c0 < dv; c0 += kI8Chunk)
    for (int g = 0; g < kTileKeys / 4; ++g, v += 4) {
      i8_detail::IVec xk[4];
      v_words<T>(vr, g, c0, dv - c0, xk);
      for (int k = 0; k < 4; ++k) i8_detail::store_ivec(v + k, xk[k]);
    }
}

// o[m] (ldo apart, dv_pad floats) = o[m] alpha[m] (alpha given) + the tile's P.V by the formulas above;
// vr: the tile's kTileKeys V rows; pre: their words (prep_v_words), or nullptr.
template <int MR, KvDType T, class Step>
void pv_tile_i8_vector(const PCodes<MR>& pc, const std::byte* const* vr, int64_t dv, float* o, int64_t ldo,
                       const float* alpha, Step& step, const std::byte* pre) {
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
        IVec xk[4];
        if (pre) {
          const auto* pv = reinterpret_cast<const IVec*>(pre) + (c0 / kI8Chunk * (kTileKeys / 4) + g) * 4;
          for (int k = 0; k < 4; ++k) xk[k] = load_ivec(pv + k);
        } else {
          v_words<T>(vr, g, c0, rem, xk);
        }
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
// Elsewhere: the same sums, column by column (codes as they are; u8's zero point unshifted).
template <int MR, KvDType T, class Step>
void pv_tile_i8_columns(const PCodes<MR>& pc, const std::byte* const* vr, int64_t dv, float* o, int64_t ldo,
                        const float* alpha, Step& step) {
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
template <int MR, KvDType T, class Step>
void pv_tile_i8(const PCodes<MR>& pc, const std::byte* const* vr, int64_t dv, float* o, int64_t ldo, const float* alpha,
                Step& step, const std::byte* pre = nullptr) {
  if constexpr (kI8Vector) {
    pv_tile_i8_vector<MR, T>(pc, vr, dv, o, ldo, alpha, step, pre);
  } else {
    pv_tile_i8_columns<MR, T>(pc, vr, dv, o, ldo, alpha, step);
  }
}

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

// flash_int8's P.V in integers (VNNI targets; src/cpu/kernels/flash_int8.cpp). V is rounded once per
// run per channel (round_v_channels, kv_quant.hpp) into tiles of this layout, per 64-key tile:
//   words[g * dv_pad + c]   the 32-bit word of column c's codes of keys 4g .. 4g + 3 (zero past d_v
//                           and past the sequence's keys)
// so vpdpbusd's signed operand is a plain load and P's four codes of those keys (round_p_block's
// u8 codes against the row's tile max, the quantum q) its broadcast unsigned one:
//   O_c = O_c alpha + q scale_c sum_j P_j code_jc     (an exact int32 sum over the tile's 64 keys)
// Against the float32 P.V per 16 columns and 4 keys: one vpdpbusd for four FMAs, the epilogue (a
// conversion, a multiply and an FMA per 16 columns) once per tile (pv_tile_u8).
struct I8ValueTile {
  int64_t dv_pad = 0;
  size_t bytes = 0;  // of one tile, a 64-byte multiple
  explicit I8ValueTile(int64_t dv_padded = 0)
      : dv_pad(dv_padded), bytes(static_cast<size_t>(kTileKeys / 4 * dv_pad * 4)) {}
};

// Key j (< kTileKeys) of a value tile from its dv codes.
inline void put_i8_value(const I8ValueTile& l, std::byte* tile, int j, const int8_t* codes, int64_t dv) {
  auto* b = reinterpret_cast<int8_t*>(tile);
  for (int64_t c = 0; c < dv; ++c) b[((j / 4) * l.dv_pad + c) * 4 + j % 4] = codes[c];
}

// g consecutive whole tiles (their value tiles l.bytes apart from tile0; pc[i]: tile i's P codes),
// after O *= alpha (when given), O held in registers across them: per NV column vectors MR x NV int32
// accumulators per tile and MR x NV float ones for all g - O loaded and stored once per wide step,
// not per tile (1.05-1.06x at 8/8, 4096, d 64 / 128 over a tile-by-tile form with 4 column vectors).
template <int MR>
void pv_tile_u8(const PCodes<MR>* pc, int g, const I8ValueTile& l, const std::byte* tile0, const float* scale, float* o,
                int64_t ldo, const float* alpha) {
  using namespace i8_detail;
  // MR x NV int32 + MR x NV float accumulators: 24 of AVX-512's 32 registers at MR = 6 (AVX2's 16: 12)
  constexpr int NV = kVectorRegisters == 32 ? 2 : 1;
  for (int64_t c0 = 0; c0 < l.dv_pad; c0 += NV * kLanes) {
    const int nv = static_cast<int>(std::min<int64_t>(NV, (l.dv_pad - c0) / kLanes));
    Batch out[MR][NV], vs[NV];
    for (int x = 0; x < NV; ++x) vs[x] = x < nv ? Batch::load_aligned(scale + c0 + x * kLanes) : Batch(0.f);
    for (int m = 0; m < MR; ++m)
      for (int x = 0; x < NV; ++x) {
        out[m][x] = x < nv ? Batch::load_aligned(o + m * ldo + c0 + x * kLanes) : Batch(0.f);
        if (alpha) out[m][x] = out[m][x] * Batch(alpha[m]);
      }
    for (int i = 0; i < g; ++i) {
      const auto* vw = reinterpret_cast<const int32_t*>(tile0 + static_cast<size_t>(i) * l.bytes);
      IVec acc[MR][NV];
      for (int m = 0; m < MR; ++m)
        for (int x = 0; x < NV; ++x) acc[m][x] = izero();
      for (int k = 0; k < kTileKeys / 4; ++k) {
        IVec v[NV];
        for (int x = 0; x < NV; ++x) v[x] = x < nv ? load_ivec(vw + k * l.dv_pad + c0 + x * kLanes) : izero();
        for (int m = 0; m < MR; ++m) {
          int32_t w;
          std::memcpy(&w, pc[i].code[m][0] + 4 * k, 4);
          const IVec pw = bcast32(w);
          for (int x = 0; x < NV; ++x)
            if (x < nv) acc[m][x] = dot4<true>(acc[m][x], pw, v[x]);
        }
      }
      for (int m = 0; m < MR; ++m) {
        const Batch q(pc[i].quantum[m][0]);
        for (int x = 0; x < NV; ++x) out[m][x] = simd::fma(to_float(acc[m][x]), q * vs[x], out[m][x]);
      }
    }
    for (int m = 0; m < MR; ++m)
      for (int x = 0; x < nv; ++x) out[m][x].store_aligned(o + m * ldo + c0 + x * kLanes);
  }
}

}  // namespace attnlab::ATTN_TARGET_NS::simd
