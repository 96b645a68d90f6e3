// AMX-BF16 blocks of `flash_amx` (src/cpu/flash_bf16.cpp): the two GEMMs of a full key tile for
// 16 query rows at once on the tile unit (TDPBF16PS: a 16 x 16 float32 tile += a 16 x 32 bf16
// tile times a 32 x 16 bf16 tile, 16 K products per instruction, ~16x the float32 FMA rate per
// core). The operands are the layouts of src/cpu/simd/bf16_dot.hpp, which are exactly what
// TDPBF16PS wants: B interleaved by pairs along the reduction axis.
//   S (16 x 64) = Q (16 x d) . K^T:  A = Q rows as bf16 words (16 words = 32 elements of d per
//       step), B = K^T words (pack_k_pairs: 16 word rows x 16 keys), C = 2 tiles of 16 keys per pass;
//   O (16 x d) += P (16 x 64) . V:   A = P rows rounded to bf16 (round_p_rows, two halves of 32
//       keys), B = V pairs (pack_v_pairs: 16 pair rows x 16 columns), C = O, 2 column tiles at
//       a time, loaded from and stored back to the task's accumulators.
// Tile registers: 0-1 accumulators, 2-3 A, 4-7 B; every tile 16 rows x 64 bytes (configure).
// TDPBF16PS rounds and flushes denormals like VDPBF16PS, so flash_amx's arithmetic is
// flash_bf16's (Arithmetic::Bf16Products). Only compiled where the target has AMX-BF16.
#pragma once

// gcc spells the feature macros __AMX_TILE__/__AMX_BF16__, clang __AMXTILE__/__AMXBF16__.
#if (defined(__AMX_BF16__) && defined(__AMX_TILE__)) || (defined(__AMXBF16__) && defined(__AMXTILE__))
#define ATTN_HAVE_AMX 1
#endif

#if defined(ATTN_HAVE_AMX)
#include <immintrin.h>

#include <cstdint>

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
// sb[m * 64 + j] = sum_k Q[m][k] K[j][k] (unscaled) for 16 rows and one 64-key block: qa holds
// the rows as words, ldq words apart, zero past the row's words; kt is pack_k_pairs' block
// (dw = padded_words(d) word rows of 64 keys). Two passes of 32 keys, two accumulators each,
// with the A and B tiles of step k + 1 loaded while step k multiplies (tiles 2/3 and 4-5/6-7
// alternate): the tile registers are not renamed, so a load into a tile a multiply still reads
// waits for it. Measured on a 16 x 64 x 128 block: 346 ns, against 732 ns for four accumulators
// and one A tile (the TDPBF16PS floor is 108 ns).
inline void amx_scores(const uint32_t* qa, int64_t ldq, const uint32_t* kt, int64_t dw, float* sb) {
  const int64_t steps = dw / 16, ldq_b = ldq * 4;
  for (int h = 0; h < 64; h += 32) {
    const uint32_t* kb = kt + h;
    _tile_zero(0);
    _tile_zero(1);
    ATTN_TILE_LOAD(2, qa, ldq_b);
    ATTN_TILE_LOAD(4, kb, 256);
    ATTN_TILE_LOAD(5, kb + 16, 256);
    for (int64_t k = 0; k < steps; k += 2) {
      const bool odd = k + 1 < steps;
      if (odd) {
        ATTN_TILE_LOAD(3, qa + (k + 1) * 16, ldq_b);
        ATTN_TILE_LOAD(6, kb + (k + 1) * 1024, 256);
        ATTN_TILE_LOAD(7, kb + (k + 1) * 1024 + 16, 256);
      }
      _tile_dpbf16ps(0, 2, 4);
      _tile_dpbf16ps(1, 2, 5);
      if (k + 2 < steps) {
        ATTN_TILE_LOAD(2, qa + (k + 2) * 16, ldq_b);
        ATTN_TILE_LOAD(4, kb + (k + 2) * 1024, 256);
        ATTN_TILE_LOAD(5, kb + (k + 2) * 1024 + 16, 256);
      }
      if (odd) {
        _tile_dpbf16ps(0, 3, 6);
        _tile_dpbf16ps(1, 3, 7);
      }
    }
    _tile_stored(0, sb + h, 256);
    _tile_stored(1, sb + h + 16, 256);
  }
}

// o rows (16, ldo floats apart, columns [0, dim_pad), dim_pad a multiple of 16) += P . V over
// the 64 keys of a full tile: pw = 16 rows of 32 words (round_p_rows), vp = 32 pair rows,
// ldw words apart (pack_v_pairs). P's two halves of 32 keys stay in tiles 2 and 3; per pass of
// 32 columns two accumulators are loaded from o, their four B tiles loaded before the four
// multiplies, and stored back (measured: 400 ns per 16 x 64 x 128 block against 448 ns for
// four accumulators sharing two B tiles).
inline void amx_pv(const uint32_t* pw, const uint32_t* vp, int64_t ldw, float* o, int64_t ldo, int64_t dim_pad) {
  const uint32_t* v2 = vp + 16 * ldw;  // key pairs 16..31 (keys 32..63)
  const int64_t ldo_b = ldo * 4, ldw_b = ldw * 4;
  ATTN_TILE_LOAD(2, pw, 128);
  ATTN_TILE_LOAD(3, pw + 16, 128);
  int64_t c0 = 0;
  for (; c0 + 32 <= dim_pad; c0 += 32) {
    ATTN_TILE_LOAD(0, o + c0, ldo_b);
    ATTN_TILE_LOAD(1, o + c0 + 16, ldo_b);
    ATTN_TILE_LOAD(4, vp + c0, ldw_b);
    ATTN_TILE_LOAD(5, vp + c0 + 16, ldw_b);
    ATTN_TILE_LOAD(6, v2 + c0, ldw_b);
    ATTN_TILE_LOAD(7, v2 + c0 + 16, ldw_b);
    _tile_dpbf16ps(0, 2, 4);
    _tile_dpbf16ps(1, 2, 5);
    _tile_dpbf16ps(0, 3, 6);
    _tile_dpbf16ps(1, 3, 7);
    _tile_stored(0, o + c0, ldo_b);
    _tile_stored(1, o + c0 + 16, ldo_b);
  }
  if (c0 < dim_pad) {  // a last 16 columns
    ATTN_TILE_LOAD(0, o + c0, ldo_b);
    ATTN_TILE_LOAD(4, vp + c0, ldw_b);
    ATTN_TILE_LOAD(6, v2 + c0, ldw_b);
    _tile_dpbf16ps(0, 2, 4);
    _tile_dpbf16ps(0, 3, 6);
    _tile_stored(0, o + c0, ldo_b);
  }
}

}  // namespace attnlab::ATTN_TARGET_NS::simd

#endif  // ATTN_HAVE_AMX
