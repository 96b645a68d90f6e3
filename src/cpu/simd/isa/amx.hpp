// AMX-BF16 blocks of `flash_amx` (src/cpu/kernels/flash_bf16.cpp): the two GEMMs of a full key tile for
// 32 query rows at once on the tile unit (TDPBF16PS: a 16 x 16 float32 tile += a 16 x 32 bf16
// tile times a 32 x 16 bf16 tile, 8192 products per instruction; `attnlab peak` measured 6-14x
// the float32 FMA peak on the AMX Xeon of results/2026-12-01-precision). The operands are the layouts of
// src/cpu/simd/isa/avx512_bf16.hpp, which are exactly what TDPBF16PS wants: B interleaved by pairs along the reduction
// axis.
//   S (32 x 64) = Q (32 x d) . K^T:  A = Q rows as bf16 words (16 words = 32 elements of d per
//       step), B = K^T words (pack_k_pairs: 16 word rows x 16 keys), C = 4 tiles of 16 keys;
//   O (32 x d) += P (32 x 64) . V:   A = P rows rounded to bf16 (round_p_rows, two halves of 32
//       keys), B = V pairs (pack_v_pairs: 16 pair rows x 16 columns), C = O, 4 column tiles at
//       a time, loaded from and stored back to the task's accumulators.
// Both on 32 query rows at a time. Tile registers: 0-3 accumulators, 4-5 A, 6-7 B; every tile 16
// rows x 64 bytes (amx_configure).
// TDPBF16PS rounds and flushes denormals like VDPBF16PS, so flash_amx's arithmetic is
// flash_bf16's (Arithmetic::Bf16Products). Only compiled where the target has AMX-BF16.
#pragma once

// gcc spells the feature macros __AMX_TILE__/__AMX_BF16__, clang __AMXTILE__/__AMXBF16__.
#if (defined(__AMX_BF16__) && defined(__AMX_TILE__)) || (defined(__AMXBF16__) && defined(__AMXTILE__))
#define ATTN_HAVE_AMX 1
#endif
// ... and AMX-INT8 (flash_int8_amx's scores: TDPBSSD, signed bytes x signed bytes into int32).
#if defined(ATTN_HAVE_AMX) && (defined(__AMX_INT8__) || defined(__AMXINT8__))
#define ATTN_HAVE_AMX_INT8 1
#endif

namespace attnlab::ATTN_TARGET_NS::simd {
// Whether this object has the AMX blocks (flash_amx) and the int8 ones (flash_int8_amx).
#if defined(ATTN_HAVE_AMX)
inline constexpr bool kAmxBuilt = true;
#else
inline constexpr bool kAmxBuilt = false;
#endif
#if defined(ATTN_HAVE_AMX_INT8)
inline constexpr bool kAmxInt8Built = true;
#else
inline constexpr bool kAmxInt8Built = false;
#endif
}  // namespace attnlab::ATTN_TARGET_NS::simd

#if defined(ATTN_HAVE_AMX)
#include <immintrin.h>

#include <bit>
#include <cstdint>
#include <type_traits>

namespace attnlab::ATTN_TARGET_NS::simd {

// Loads the tile configuration of this thread (palette 1, eight 16 x 64-byte tiles). Tile
// state is per thread: every task range configures before its first tile instruction.
inline void amx_configure() {
  struct alignas(64) Config {
    uint8_t palette = 1, start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  } c;
  for (int i = 0; i < 8; ++i) c.colsb[i] = 64, c.rows[i] = 16;
  // Not _tile_loadconfig: gcc 12's declares only the first 8 bytes as read, so the stores of
  // the row and column counts above were dropped as dead (and every tile instruction trapped).
  __asm__ volatile("ldtilecfg %0" ::"m"(c));
}
inline void amx_release() { _tile_release(); }

// tileloadd with a "memory" clobber: gcc 12's _tile_loadd declares no memory read, so stores
// to the buffer just before it (P rounded to bf16, the packed tiles) could be moved after it.
#define ATTN_TILE_LOAD(dst, base, stride) \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #dst ::"r"((const void*)(base)), "r"((long)(stride)) : "memory")
// The blocks below work on 32 query rows (two 16-row A tiles) in 2 x 2 blocks of accumulators:
// per step, two A and two B tile loads feed four products, and an accumulator's next product
// comes three products after its last (TDPBF16PS: 16-cycle throughput, ~52-cycle latency on
// Sapphire Rapids). In a loop over L1-resident operands (a scratch probe, one core) the scores
// ran at ~1.9 and P.V at ~1.6-1.7 TFLOP/s, about half of `attnlab peak`'s tile rate (which
// multiplies tiles already in registers).

// One TDPBF16PS / TDPBSSD: immediate tile operands, so a macro.
#if defined(ATTN_HAVE_AMX_INT8)
#define ATTN_AMX_DOT(C, A, B) \
  if constexpr (Int8) {       \
    _tile_dpbssd(C, A, B);    \
  } else {                    \
    _tile_dpbf16ps(C, A, B);  \
  }
#else
#define ATTN_AMX_DOT(C, A, B) _tile_dpbf16ps(C, A, B);
#endif

// sb[m * lds + j] = sum_k Q[m][k] K[j][k] (unscaled) for 32 rows and one 64-key block, on 32-bit
// words of the reduction axis: bf16 pairs (TDPBF16PS, float32 out) or, Int8, four int8 codes
// (TDPBSSD, int32 out: flash_int8_amx). qa holds the rows as words, ldq words apart, zero past the
// row's words; kt is the key block as word rows of 64 keys (pack_k_pairs' block, or an int8 key
// tile: int8_dot.hpp's I8KeyTile), dw word rows, a multiple of 16. Per 32-key half: C0/C1 rows
// 0-15 x keys 0-15 / 16-31 of the half, C2/C3 rows 16-31; A 4 and 5, B 6 and 7.
template <bool Int8 = false>
inline void amx_scores(const uint32_t* qa, int64_t ldq, const uint32_t* kt, int64_t dw, void* sb, int64_t lds = 64) {
#if !defined(ATTN_HAVE_AMX_INT8)
  static_assert(!Int8, "int8 tiles need AMX-INT8 (-mamx-int8)");
#endif
  const uint32_t* qb = qa + 16 * ldq;
  const int64_t ldq_b = ldq * 4, lds_b = lds * 4;
  for (int h = 0; h < 64; h += 32) {
    uint32_t* out = static_cast<uint32_t*>(sb) + h;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t w0 = 0; w0 < dw; w0 += 16) {
      const uint32_t* kb = kt + w0 * 64 + h;
      ATTN_TILE_LOAD(4, qa + w0, ldq_b);
      ATTN_TILE_LOAD(6, kb, 256);
      ATTN_AMX_DOT(0, 4, 6)
      ATTN_TILE_LOAD(7, kb + 16, 256);
      ATTN_AMX_DOT(1, 4, 7)
      ATTN_TILE_LOAD(5, qb + w0, ldq_b);
      ATTN_AMX_DOT(2, 5, 6)
      ATTN_AMX_DOT(3, 5, 7)
    }
    _tile_stored(0, out, lds_b);
    _tile_stored(1, out + 16, lds_b);
    _tile_stored(2, out + 16 * lds, lds_b);
    _tile_stored(3, out + 16 * lds + 16, lds_b);
  }
}

// o rows (32, ldo floats apart, columns [0, dim_pad), dim_pad a multiple of 16) += P . V over nt
// whole tiles of 64 keys: pw = 32 rows of P rounded to bf16 pairs, ldp words apart (tile q's 32
// words at 32 q), vp[q] = tile q's 32 pair rows, ldw words apart (pack_v_pairs). Per 32 columns:
// C0/C1 rows 0-15 x columns 0-15 / 16-31, C2/C3 rows 16-31, loaded and stored once for all nt
// tiles; A 4 and 5 (P), B 6 and 7 (V); a last 16 columns with C0 and C2.
inline void amx_pv(const uint32_t* pw, int64_t ldp, const uint32_t* const* vp, int nt, int64_t ldw, float* o,
                   int64_t ldo, int64_t dim_pad) {
  const uint32_t* pb = pw + 16 * ldp;
  float* o2 = o + 16 * ldo;
  const int64_t ldo_b = ldo * 4, ldw_b = ldw * 4, ldp_b = ldp * 4;
  int64_t c0 = 0;
  for (; c0 + 32 <= dim_pad; c0 += 32) {
    ATTN_TILE_LOAD(0, o + c0, ldo_b);
    ATTN_TILE_LOAD(1, o + c0 + 16, ldo_b);
    ATTN_TILE_LOAD(2, o2 + c0, ldo_b);
    ATTN_TILE_LOAD(3, o2 + c0 + 16, ldo_b);
    for (int q = 0; q < nt; ++q) {
      for (int kh = 0; kh < 2; ++kh) {  // keys 0..31, 32..63 of tile q
        const uint32_t* vk = vp[q] + kh * 16 * ldw + c0;
        ATTN_TILE_LOAD(4, pw + q * 32 + kh * 16, ldp_b);
        ATTN_TILE_LOAD(6, vk, ldw_b);
        _tile_dpbf16ps(0, 4, 6);
        ATTN_TILE_LOAD(7, vk + 16, ldw_b);
        _tile_dpbf16ps(1, 4, 7);
        ATTN_TILE_LOAD(5, pb + q * 32 + kh * 16, ldp_b);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    _tile_stored(0, o + c0, ldo_b);
    _tile_stored(1, o + c0 + 16, ldo_b);
    _tile_stored(2, o2 + c0, ldo_b);
    _tile_stored(3, o2 + c0 + 16, ldo_b);
  }
  if (c0 == dim_pad) return;
  ATTN_TILE_LOAD(0, o + c0, ldo_b);
  ATTN_TILE_LOAD(2, o2 + c0, ldo_b);
  for (int q = 0; q < nt; ++q) {
    for (int kh = 0; kh < 2; ++kh) {
      ATTN_TILE_LOAD(4, pw + q * 32 + kh * 16, ldp_b);
      ATTN_TILE_LOAD(6, vp[q] + kh * 16 * ldw + c0, ldw_b);
      _tile_dpbf16ps(0, 4, 6);
      ATTN_TILE_LOAD(5, pb + q * 32 + kh * 16, ldp_b);
      _tile_dpbf16ps(2, 5, 6);
    }
  }
  _tile_stored(0, o + c0, ldo_b);
  _tile_stored(2, o2 + c0, ldo_b);
}
#undef ATTN_AMX_DOT

// Whether all n packed words (bf16 pairs, n a multiple of 16) are finite: no exponent field all ones.
inline bool words_finite(const uint32_t* w, int64_t n) {
  const __m512i exp = _mm512_set1_epi16(0x7f80);
  __mmask32 bad = 0;
  for (int64_t i = 0; i < n; i += 16)
    bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(_mm512_load_si512(w + i), exp), exp);
  return bad == 0;
}

// `attnlab peak`'s tile loop (target_bf16.cpp): four accumulator tiles, each TDPBF16PS (Int8:
// TDPBSSD on bytes of 1, flash_int8_amx's scores) independent of the last three, so the loop
// measures the tile unit's throughput, not its latency (~1-1.6 TFLOP/s per core,
// results/2026-12-01-precision). One 16 x 64-byte operand tile: bf16 pairs of x, or int8 ones.
inline constexpr int kAmxPeakTiles = 4;
template <bool Int8>
__attribute__((noinline)) float amx_tile_rounds(int64_t iters, float x) {
  static_assert(!Int8 || kAmxInt8Built, "int8 tiles need AMX-INT8 (-mamx-int8)");
  using Elem = std::conditional_t<Int8, int8_t, uint16_t>;
  alignas(64) Elem a[64 / sizeof(Elem) * 16];
  alignas(64) uint32_t out[16 * 16];
  const auto e = Int8 ? Elem{1} : static_cast<Elem>(std::bit_cast<uint32_t>(x) >> 16);
  for (Elem& v : a) v = e;
  amx_configure();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  ATTN_TILE_LOAD(4, a, 64);
  ATTN_TILE_LOAD(5, a, 64);
  ATTN_TILE_LOAD(6, a, 64);
  ATTN_TILE_LOAD(7, a, 64);
  for (int64_t it = 0; it < iters; ++it) {
    if constexpr (Int8) {
#if defined(ATTN_HAVE_AMX_INT8)
      _tile_dpbssd(0, 4, 5);
      _tile_dpbssd(1, 4, 6);
      _tile_dpbssd(2, 4, 7);
      _tile_dpbssd(3, 5, 6);
#endif
    } else {
      _tile_dpbf16ps(0, 4, 5);
      _tile_dpbf16ps(1, 4, 6);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 5, 6);
    }
  }
  _tile_stored(0, out, 64);
  amx_release();
  return static_cast<float>(out[0]);  // (a value the compiler must compute; its type does not matter)
}

}  // namespace attnlab::ATTN_TARGET_NS::simd

#endif  // ATTN_HAVE_AMX

#if !defined(ATTN_HAVE_AMX)
#include <cstdint>

// The AMX vocabulary on an object without the tile unit (kAmxBuilt false): declared so the tile engine
// reads the same in every object, defined nowhere (absent.hpp's rule: its uses sit behind kAmxBuilt).
namespace attnlab::ATTN_TARGET_NS::simd {
void amx_configure();
void amx_release();
template <bool Int8 = false>
void amx_scores(const uint32_t* qa, int64_t ldq, const uint32_t* kt, int64_t dw, void* sb, int64_t lds = 64);
void amx_pv(const uint32_t* pw, int64_t ldp, const uint32_t* const* vp, int nt, int64_t ldw, float* o, int64_t ldo,
            int64_t dim_pad);
bool words_finite(const uint32_t* w, int64_t n);
}  // namespace attnlab::ATTN_TARGET_NS::simd
#endif
