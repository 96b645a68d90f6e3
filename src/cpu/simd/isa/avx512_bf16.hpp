// The bf16 dot-product building blocks of `flash_bf16` (src/cpu/kernels/flash_bf16.cpp): the two GEMMs
// of a FlashAttention tile on AVX512_BF16's vdpbf16ps, which multiplies PAIRS of bf16 values
// and adds both products to a float32 lane: acc[i] += a[2i] b[2i] + a[2i+1] b[2i+1] (32
// products per instruction, twice the float32 FMA's 16; how often it issues is the CPU's:
// ~1.9x the FMA's FLOP rate on Zen 5, 0.5x on the AMX Xeon of results/2026-12-01-precision).
// Both operands must therefore be interleaved by pairs along the reduction axis:
//   GEMM 1 (S = Q.K^T, reduction over d): a Q row as 32-bit words (Q[2k], Q[2k+1]) broadcast,
//          K^T packed as words (K[j][2k], K[j][2k+1]) per key j - that is K's rows read as
//          32-bit words and transposed, so the packing is the float32 16 x 16 transpose;
//   GEMM 2 (O += P.V, reduction over keys): P rounded to bf16 as words (P[2j], P[2j+1])
//          broadcast, V packed per tile as words (V[2j][c], V[2j+1][c]) per column c.
// Products of two bf16 values are exact in float32; vdpbf16ps adds them with round to nearest
// even and treats denormal inputs and results as zero. The register blocks are the float32
// ones (6 rows x 64 keys in GEMM 1, 6 rows x 4 vectors of d in GEMM 2), over half as many
// steps. A pair never straddles a boundary of the keys a row sees: the tile engine splits an
// odd boundary key off to the float32 kernel (pv_rows), so no row multiplies a V row it does
// not see (0 * NaN), exactly as in flash.
// Only compiled where the target has AVX512_BF16 (the avx512_bf16 object, CMakeLists.txt).
#pragma once

#include <cstdint>

namespace attnlab::ATTN_TARGET_NS::simd {
// Words (bf16 pairs) per row of d elements: the last one zero padded when d is odd.
inline int64_t pair_words(int64_t d) { return (d + 1) / 2; }
// pair_words rounded up to whole vectors (AMX tile rows) of 16 words.
inline int64_t padded_words(int64_t d) { return (pair_words(d) + 15) / 16 * 16; }
// Whether this object has the bf16 dot-product engine (flash_bf16): the avx512_bf16 object only.
#if defined(__AVX512BF16__)
inline constexpr bool kPairsBuilt = true;
#else
inline constexpr bool kPairsBuilt = false;
#endif
}  // namespace attnlab::ATTN_TARGET_NS::simd

#if defined(__AVX512BF16__)
#include <immintrin.h>

#include <type_traits>

#include "attnlab/dtype.hpp"
#include "cpu/simd/microkernel.hpp"

namespace attnlab::ATTN_TARGET_NS::simd {

static_assert(kLanes == 16 && kBlockKeys == 64, "the bf16 blocks are the AVX-512 float32 blocks");

// The first n (<= 32) bf16 elements at p as 16 words, the rest zero (never read past p + n).
inline __m512i load_pairs(const bf16* p, int n) {
  const __mmask32 m = n >= 32 ? ~__mmask32{0} : (__mmask32{1} << n) - 1;
  return _mm512_maskz_loadu_epi16(m, p);
}

// Where K^T word (word k, key j) lives: block-major like kt_offset, [dw][kBlockKeys] per block.
inline int64_t kt_pair_offset(int64_t dw, int64_t k, int j) {
  return (j / kBlockKeys) * dw * kBlockKeys + k * kBlockKeys + j % kBlockKeys;
}

// K tile (nk rows of d bf16) -> K^T words at kt_pair_offset (dw = padded_words(d));
// keys [nk, round_up(nk, kBlockKeys)) are zero. The float32 packing's 16 x 16 transpose, on words.
inline void pack_k_pairs(const Rows<bf16>& k_rows, int nk, int64_t d, uint32_t* kt) {
  const int64_t dw = padded_words(d);
  const int nb = (nk + kBlockKeys - 1) / kBlockKeys * kBlockKeys;
  for (int j0 = 0; j0 < nb; j0 += 16) {
    for (int64_t w0 = 0; w0 < dw; w0 += 16) {
      const int n = static_cast<int>(d - 2 * w0 < 32 ? d - 2 * w0 : 32);  // elements left in the row
      __m512 r[16];
      for (int j = 0; j < 16; ++j) {
        r[j] = j0 + j < nk && n > 0 ? _mm512_castsi512_ps(load_pairs(k_rows.row(j0 + j) + 2 * w0, n))
                                    : _mm512_setzero_ps();
      }
      transpose_block(r);
      for (int c = 0; c < 16; ++c) _mm512_store_ps(reinterpret_cast<float*>(kt + kt_pair_offset(dw, w0 + c, j0)), r[c]);
    }
  }
}

// V tile (nk rows of d values) -> words vp[(j / 2) * ldw + c] = (V[j][c], V[j + 1][c])
// for c < d, zero up to the next whole vector (ldw = padded_dim(d) words); V[nk] reads as zero.
// bf16 rows as stored; float32 rows (flash_int8_amx) each value rounded to bf16 (nearest even:
// vcvtneps2bf16).
template <class E>
inline void pack_v_pairs(const Rows<E>& v_rows, int nk, int64_t d, uint32_t* vp, int64_t ldw) {
  static_assert(std::is_same_v<E, bf16> || std::is_same_v<E, float>, "bf16 or float32 V rows");
  // 16 values of a row as the low halves of 16 words.
  const auto lanes = [](const E* r, __mmask16 m) {
    if constexpr (std::is_same_v<E, bf16>) {
      return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r));
    } else {
      return _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, r))));
    }
  };
  for (int j = 0; j < nk; j += 2) {
    const E* a = v_rows.row(j);
    const E* b = j + 1 < nk ? v_rows.row(j + 1) : nullptr;
    uint32_t* out = vp + (j / 2) * ldw;
    for (int64_t c = 0; c < d; c += 16) {
      const __mmask16 m = d - c >= 16 ? __mmask16(0xffff) : __mmask16((1u << (d - c)) - 1);
      const __m512i hi = b ? lanes(b + c, m) : _mm512_setzero_si512();
      _mm512_store_si512(out + c, _mm512_or_si512(lanes(a + c, m), _mm512_slli_epi32(hi, 16)));
    }
  }
}

inline __m512bh as_bh(__m512i x) { return reinterpret_cast<__m512bh>(x); }

// GEMM 1 for one register panel: s[m * LdS + j] = scale * sum_k Q[m][k] K[j][k] for the
// register blocks overlapping [ja, jb). qp: the panel's Q words, word-major (qp[w * MR + m]).
// LdS: the score rows' stride (kTileKeys; a wide step's, kWideKeys).
template <int MR, int LdS = kTileKeys, class Step>
inline void score_panel_bf16(const uint32_t* qp, const uint32_t* kt, int64_t d, float scale, int ja, int jb, float* s,
                             Step& step) {
  const int64_t dw = padded_words(d), nw = pair_words(d);
  for (int j0 = ja / kBlockKeys * kBlockKeys; j0 < jb; j0 += kBlockKeys) {
    const uint32_t* kb = kt + kt_pair_offset(dw, 0, j0);
    __m512 acc[MR][4];
    for (int m = 0; m < MR; ++m)
      for (int v = 0; v < 4; ++v) acc[m][v] = _mm512_setzero_ps();
    for (int64_t w = 0; w < nw; ++w) {
      step();
      const uint32_t* kr = kb + w * kBlockKeys;
      __m512bh kv[4];
      for (int v = 0; v < 4; ++v) kv[v] = as_bh(_mm512_load_si512(kr + v * 16));
      for (int m = 0; m < MR; ++m) {
        const __m512bh q = as_bh(_mm512_set1_epi32(static_cast<int>(qp[w * MR + m])));
        for (int v = 0; v < 4; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], q, kv[v]);
      }
    }
    const __m512 sc = _mm512_set1_ps(scale);
    for (int m = 0; m < MR; ++m)
      for (int v = 0; v < 4; ++v) _mm512_store_ps(s + m * LdS + j0 + v * 16, _mm512_mul_ps(acc[m][v], sc));
  }
}

// P rows of the panel rounded to bf16 (nearest even): pw[m * RowKeys / 2 + j / 2] = words (P[j],
// P[j+1]) for GEMM 2, and p itself overwritten with the rounded values (the float32 kernel for the
// odd boundary keys then multiplies the same P). Rows of RowKeys floats (a wide step's: kWideKeys),
// their first `keys` (a multiple of 32).
template <int MR, int RowKeys = kTileKeys>
inline void round_p_rows(float* p, uint32_t* pw, int keys = RowKeys) {
  for (int m = 0; m < MR; ++m) {
    float* row = p + m * RowKeys;
    for (int h = 0; h < keys; h += 32) {
      const __m512i w =
          reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_load_ps(row + h + 16), _mm512_load_ps(row + h)));
      _mm512_store_si512(pw + m * (RowKeys / 2) + h / 2, w);
      const __m512i lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(w));
      const __m512i hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(w, 1));
      _mm512_store_ps(row + h, _mm512_castsi512_ps(_mm512_slli_epi32(lo, 16)));
      _mm512_store_ps(row + h + 16, _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16)));
    }
  }
}

// GEMM 2 for one register panel and one column block of NV vectors, over key pairs [ka, kb):
//   o[m] = o[m] * alpha[m] (when alpha is given) + sum_{x in [ka, kb)} pw[m * ldp + x] . vp[x * ldw]
// o rows (ldo apart) and vp: 64-byte aligned, whole vectors (pack_v_pairs zero pads past d).
template <int MR, int NV, class Step>
inline void pv_pairs_panel(const uint32_t* pw, int64_t ldp, const uint32_t* vp, int64_t ldw, float* o, int64_t ldo,
                           const float* alpha, int ka, int kb, Step& step) {
  __m512 acc[MR][NV];
  for (int m = 0; m < MR; ++m) {
    for (int c = 0; c < NV; ++c) acc[m][c] = _mm512_load_ps(o + m * ldo + c * 16);
    if (alpha) {
      const __m512 a = _mm512_set1_ps(alpha[m]);
      for (int c = 0; c < NV; ++c) acc[m][c] = _mm512_mul_ps(acc[m][c], a);
    }
  }
  for (int x = ka; x < kb; ++x) {
    step();
    __m512bh vv[NV];
    for (int c = 0; c < NV; ++c) vv[c] = as_bh(_mm512_load_si512(vp + x * ldw + c * 16));
    for (int m = 0; m < MR; ++m) {
      const __m512bh pb = as_bh(_mm512_set1_epi32(static_cast<int>(pw[m * ldp + x])));
      for (int c = 0; c < NV; ++c) acc[m][c] = _mm512_dpbf16_ps(acc[m][c], pb, vv[c]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int c = 0; c < NV; ++c) _mm512_store_ps(o + m * ldo + c * 16, acc[m][c]);
}

// GEMM 2 over all of d (column blocks of kOutVecs vectors), pairs [ka, kb).
template <int MR, class Step>
inline void pv_pairs(const uint32_t* pw, int64_t ldp, const uint32_t* vp, int64_t ldw, float* o, int64_t ldo,
                     const float* alpha, int ka, int kb, int64_t d, Step& step) {
  const int64_t nvec = (d + 15) / 16;
  for (int64_t c0 = 0; c0 < nvec; c0 += kOutVecs) {
    const int nv = static_cast<int>(nvec - c0 < kOutVecs ? nvec - c0 : kOutVecs);
    const uint32_t* vc = vp + c0 * 16;
    float* oc = o + c0 * 16;
    switch (nv) {
      case 1: pv_pairs_panel<MR, 1>(pw, ldp, vc, ldw, oc, ldo, alpha, ka, kb, step); break;
      case 2: pv_pairs_panel<MR, 2>(pw, ldp, vc, ldw, oc, ldo, alpha, ka, kb, step); break;
      case 3: pv_pairs_panel<MR, 3>(pw, ldp, vc, ldw, oc, ldo, alpha, ka, kb, step); break;
      case 4: pv_pairs_panel<MR, 4>(pw, ldp, vc, ldw, oc, ldo, alpha, ka, kb, step); break;
    }
  }
}

// 32 consecutive values of P (p0, then p1) rounded to bf16 (nearest even, vcvtne2ps2bf16) as 16 words
// of pairs at pw (64-byte aligned): p0's in words 0-7, p1's in words 8-15 (flash_amx's P).
inline void store_pairs(uint32_t* pw, Batch p0, Batch p1) {
  _mm512_store_si512(pw, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(p1, p0)));
}

// `attnlab peak`'s vdpbf16ps loop (target_bf16.cpp): Chains independent accumulators (vdpbf16ps
// has the FMA's latency class, ~5-6 cycles, and up to 2 per cycle: 16 chains with 32 registers keep
// both pipes busy without spills), each step acc += a.a with a = x's bf16 pairs; returns their sum.
template <int Chains>
__attribute__((noinline)) float bf16_dot_chains(int64_t iters, float start, float x) {
  __m512 acc[Chains];
  for (int j = 0; j < Chains; ++j) acc[j] = _mm512_set1_ps(start + 0.001f * static_cast<float>(j));
  const __m512 xs = _mm512_set1_ps(x);
  const __m512bh a = _mm512_cvtne2ps_pbh(xs, xs);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int j = 0; j < Chains; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, a);
  }
  __m512 s = acc[0];
  for (int j = 1; j < Chains; ++j) s = _mm512_add_ps(s, acc[j]);
  alignas(64) float lanes[16];  // not _mm512_reduce_add_ps: gcc 12 warns inside it (-Wuninitialized)
  _mm512_store_ps(lanes, s);
  float sum = 0;
  for (float v : lanes) sum += v;
  return sum;
}

}  // namespace attnlab::ATTN_TARGET_NS::simd

#else
#include "cpu/simd/microkernel.hpp"

// The bf16 pair vocabulary on an object without AVX512_BF16 (kPairsBuilt false): declared so the tile
// engine reads the same in every object, defined nowhere (absent.hpp's rule: its uses sit behind
// `if constexpr (Pairs)` / kPairsBuilt, so a call that is not selected out fails to link).
namespace attnlab::ATTN_TARGET_NS::simd {
void pack_k_pairs(const Rows<bf16>& k_rows, int nk, int64_t d, uint32_t* kt);
template <class E>
void pack_v_pairs(const Rows<E>& v_rows, int nk, int64_t d, uint32_t* vp, int64_t ldw);
template <int MR, int LdS = kTileKeys, class Step>
void score_panel_bf16(const uint32_t* qp, const uint32_t* kt, int64_t d, float scale, int ja, int jb, float* s,
                      Step& step);
template <int MR, int RowKeys = kTileKeys>
void round_p_rows(float* p, uint32_t* pw, int keys = RowKeys);
template <int MR, class Step>
void pv_pairs(const uint32_t* pw, int64_t ldp, const uint32_t* vp, int64_t ldw, float* o, int64_t ldo,
              const float* alpha, int ka, int kb, int64_t d, Step& step);
void store_pairs(uint32_t* pw, Batch p0, Batch p1);
}  // namespace attnlab::ATTN_TARGET_NS::simd
#endif  // __AVX512BF16__
