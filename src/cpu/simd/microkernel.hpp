// Register-blocked micro-kernels for the two small GEMMs of a FlashAttention tile, and the
// K-tile packing they need. Used by the tile engine, src/cpu/engine/tiles.cpp.
//
//   score_panel:  S[MR x kTileKeys] = Qpanel[MR x d] * Kt[d x kTileKeys]   (GEMM 1, to L1)
//   pv_panel:     O[MR x NV*kLanes] (+)= P[MR x keys] * V[keys x NV*kLanes] (GEMM 2)
//   pack_k_transposed: K tile (kTileKeys rows of d values, any row stride) -> Kt, [d][kBlockKeys]
//                      per register block of keys (kt_offset)
// K and V may be stored as float32, bf16, f16 or a quantized cache's rows (E; kv_load.hpp): they
// are widened to float32 where they are loaded (K in the packing or the direct scores, V rows in
// GEMM 2: load_at), so the arithmetic is the float32 path's on the stored values, and a 16-bit
// or quantized K/V tile is that many fewer bytes to read.
//
// Register budget (AVX-512: 32 zmm, FMA latency 4 cycles, one zmm FMA per cycle on this
// Zen 4 - two 256-bit pipes - so >= 4 independent accumulators hide the latency):
//   GEMM 1: MR = kPanelRows = 6 rows x kKeyVecs = 4 vectors (64 keys) = 24 accumulators,
//           + 4 Kt vectors loaded per k step + 1 broadcast Q element = 29 registers.
//           Per k step: 4 vector loads (Kt streams, contiguous, 64-byte aligned) and 6
//           broadcasts for 24 FMAs. The 6 x 64 scores are stored to an L1 buffer (24
//           stores per 3072 FMAs at d = 128) where the epilogue reads whole tile rows.
//   GEMM 2: MR = 6 rows x NV <= 4 output vectors (64 columns of d) = 24 accumulators,
//           + NV V vectors per key + 1 broadcast P element. V rows are used as they lie in
//           the input (contiguous along d, any row stride): no packing. The accumulators
//           are loaded once per call (times the softmax rescale factor alpha when a row's
//           max grew - the rescale is fused into the load) and stored once.
// With 16 vector registers (AVX2) the panel keeps its 6 rows and narrows instead: GEMM 1
// is 6 rows x 2 vectors (16 keys) = 12 accumulators + 2 Kt vectors + 1 broadcast, run for
// the 4 register blocks of a 64-key tile (one contiguous Kt panel each), GEMM 2
// 6 rows x 2 output vectors - 8 loads (2 vector + 6 broadcast) per 12 FMAs, so the two load
// ports keep up with the two FMA pipes and 12 chains hide the FMA latency. (4 vectors x 2
// rows, the 32-register shape cut down, needs 6 loads per 8 FMAs and only 8 chains.)
// scalar (one float per "vector", 16 registers): 2 rows x 4 keys. NEON has 32 registers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/simd/kv_load.hpp"
#include "cpu/simd/vec_math.hpp"

namespace attnlab::ATTN_TARGET_NS::simd {

inline constexpr bool kNarrowPanels = kVectorRegisters == 16 && kLanes > 1;  // AVX2
inline constexpr int kKeyVecs = kNarrowPanels ? 2 : 4;  // vectors per score row of a register block
inline constexpr int kBlockKeys = kKeyVecs * kLanes;  // keys per register block: 64 AVX-512, 16 AVX2 and NEON, 4 scalar
inline constexpr int kTileKeys = 64;                  // Bc, every target: whole register blocks
static_assert(kTileKeys % kBlockKeys == 0, "a key tile is whole register blocks");
inline constexpr int kPanelRows =                                      // MR: query rows per register panel
    kNarrowPanels ? 6 : (kVectorRegisters - kKeyVecs - 2) / kKeyVecs;  // 6; scalar 2
inline constexpr int kOutVecs = kNarrowPanels ? 2 : 4;                 // GEMM 2 column block, in vectors

// Number of floats of a row of d floats padded to whole vectors.
inline int64_t padded_dim(int64_t d) { return (d + kLanes - 1) / kLanes * kLanes; }

// The K or V rows of one key tile, key j = row(j): runs of rows `ld` elements apart - one run
// for a contiguous cache (and a gathered tile), one per block for a paged cache (Problem::
// kv_block: a tile crosses into another block of the pool, anywhere in memory). The GEMMs walk
// the runs (each() in pv_rows, row() per key pair in score_rows), so a key is never copied.
template <class E>
struct Rows {
  static constexpr int kMaxRuns = kTileKeys / 16 + 1;  // 16-token blocks, a tile starting mid-block
  const E* at[kMaxRuns] = {};                          // run r's first row
  int first[kMaxRuns + 1] = {};                        // run r is keys [first[r], first[r + 1])
  int runs = 0;
  int64_t ld = 0;
  static Rows strided(const E* base, int64_t ld, int n) {
    Rows r;
    r.at[0] = base, r.first[1] = n, r.runs = 1, r.ld = ld;
    return r;
  }
  const E* row(int j) const {
    int r = 0;
    while (r + 1 < runs && j >= first[r + 1]) ++r;
    return at[r] + (j - first[r]) * ld;
  }
  // f(first row of the run, the run's first key, a, b) for each run's keys [a, b) inside [x, y).
  template <class F>
  void each(int x, int y, const F& f) const {
    for (int r = 0; r < runs; ++r) {
      const int a = x > first[r] ? x : first[r], b = y < first[r + 1] ? y : first[r + 1];
      if (a < b) f(at[r], first[r], a, b);
    }
  }
};

// transpose_block (kLanes x kLanes in registers, where kRegisterTranspose) is the floor's.

// Where Kt element (k, key j) lives: block-major, one [dp][kBlockKeys] panel per register
// block of keys, so GEMM 1 streams each block's panel front to back (contiguous, one
// cache line per k step on AVX2) instead of striding through the whole tile.
inline int64_t kt_offset(int64_t dp, int64_t k, int j) {
  return (j / kBlockKeys) * dp * kBlockKeys + k * kBlockKeys + j % kBlockKeys;
}

// Kt(k, j) = k_rows[j * ldk + k] for keys j < nk and k < d (at kt_offset); keys j in
// [nk, round_up(nk, kBlockKeys)) are zero (later blocks are not written: score_panel never
// reads a block past the keys). kt holds padded_dim(d) x kTileKeys floats, 64-byte
// aligned; rows [d, padded_dim(d)) are written (zero) but never read. Reads only the nk
// rows of d floats it is given.
template <class E>
inline void pack_k_transposed(const Rows<E>& k_rows, int nk, int64_t d, float* kt) {
  const int64_t dp = padded_dim(d);
  const int nb = (nk + kBlockKeys - 1) / kBlockKeys * kBlockKeys;
  if constexpr (kRegisterTranspose) {
    // kLanes x kLanes blocks, key blocks outer: the rows of a block are read front to back
    // (sequential memory in BHSD), partial loads for the d tail, zero rows past nk; transposed
    // in registers (transpose_block) and stored as kLanes aligned Kt rows.
    using Reg = FloatReg;
    for (int j0 = 0; j0 < nb; j0 += kLanes) {
      for (int64_t k0 = 0; k0 < dp; k0 += kLanes) {
        const int n = static_cast<int>(d - k0 < kLanes ? d - k0 : kLanes);
        Reg r[kLanes];
        for (int j = 0; j < kLanes; ++j) {
          r[j] = j0 + j < nk ? Reg(load_partial_at(k_rows.row(j0 + j), k0, n)) : Reg(Batch(0.f));
        }
        transpose_block(r);
        for (int c = 0; c < kLanes; ++c) Batch(r[c]).store_aligned(kt + kt_offset(dp, k0 + c, j0));
      }
    }
  } else {
    for (int64_t k = 0; k < dp; ++k) {
      for (int j = 0; j < nb; ++j) kt[kt_offset(dp, k, j)] = (j < nk && k < d) ? value_at(k_rows.row(j), k) : 0.f;
    }
  }
}

// Software prefetch (into L2) of rows [r0, r1) of d values each: used to bring the next K/V
// tile in while the current one is computed.
template <class E>
inline void prefetch_rows(const Rows<E>& rows, int r0, int r1, int64_t d) {
  const int64_t bytes = row_bytes<E>(d);
  for (int r = r0; r < r1; ++r) {
    const char* row = reinterpret_cast<const char*>(rows.row(r));
    const char* end = row + bytes;
    for (const char* a = row; a < end; a += 64) __builtin_prefetch(a, 0, 2);
    __builtin_prefetch(end - 1, 0, 2);  // the last line when the row is not line-aligned
  }
}

// Plain loads of one element per cache line of rows [0, n) (d elements each), in
// address order (folded into a volatile, so they stay): independent loads in address order
// keep many misses in flight, as a streaming read does. For the first tile of a decode
// task, which nothing prefetched.
template <class E>
inline void touch_rows(const Rows<E>& rows, int n, int64_t d) {
  const int64_t bytes = row_bytes<E>(d);
  unsigned acc = 0;
  for (int j = 0; j < n; ++j) {
    const auto* row = reinterpret_cast<const volatile unsigned char*>(rows.row(j));
    for (int64_t c = 0; c < bytes; c += 64) acc |= row[c];
    acc |= row[bytes - 1];  // the last line of an unaligned row
  }
  volatile unsigned sink = acc;
  (void)sink;
}

// Cache lines a loop step loads when it reads `loads` vectors of kLanes values of E (at least 1).
template <class E, int Loads>
inline constexpr int step_lines() {
  constexpr int bytes = Loads * kLanes * kValueBits<E> / 8;
  return bytes / 64 > 1 ? bytes / 64 : 1;
}

// A GEMM inner loop calls step() once per iteration: NoStep does nothing (compiled away);
// LineStream issues one software prefetch per call for the cache lines of two row ranges
// (the next tile's K rows, then its V rows), so a decode task's prefetches are spread
// through the compute of the current tile instead of arriving as one burst.
struct NoStep {
  void operator()() const {}
  template <int N>
  void lines() const {}
};
struct LineStream {
  // The current run of lines (next, up to end), then the remaining runs: per tensor (K, then V)
  // a run is one row, or all rows of one of its Rows' runs when they are contiguous (BHSD: one
  // region per tensor, or per block of a paged cache), so a step is a compare, a prefetch and
  // an add (the loop keeps `next` in a register; its slow path is inline too: a call in the
  // loop would spill the accumulators).
  static constexpr int kRuns = Rows<float>::kMaxRuns;
  const char* next = nullptr;
  const char* end = nullptr;
  const char* base[2][kRuns];
  int rows_of[2][kRuns];
  int64_t ld_bytes[2], row_b[2];
  int nruns[2];
  bool contiguous[2];
  int which = 0, run = 0, row = 0;
  bool to_l2 = false;  // prefetch into L2 (else L1): the tiling's stream_l2
  // K rows of d values and V rows of dv values, n of each.
  template <class E>
  LineStream(const Rows<E>& a, int64_t d, const Rows<E>& b, int64_t dv, int n, bool l2)
      : ld_bytes{a.ld * int64_t{sizeof(E)}, b.ld * int64_t{sizeof(E)}}, row_b{row_bytes<E>(d), row_bytes<E>(dv)} {
    to_l2 = l2;
    const Rows<E>* rows[2] = {&a, &b};
    for (int x = 0; x < 2; ++x) {
      contiguous[x] = ld_bytes[x] == row_b[x];
      nruns[x] = n > 0 ? rows[x]->runs : 0;
      for (int r = 0; r < nruns[x]; ++r) {
        base[x][r] = reinterpret_cast<const char*>(rows[x]->at[r]);
        rows_of[x][r] = rows[x]->first[r + 1] - rows[x]->first[r];
      }
    }
    if (n <= 0) {
      which = 2;
    } else {
      begin_run();
    }
  }
  __attribute__((always_inline)) void begin_run() {
    const char* start = base[which][run] + row * ld_bytes[which];
    next = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(start) & ~uintptr_t{63});  // its first line
    end = start + (contiguous[which] ? rows_of[which][run] * row_b[which] : row_b[which]);
  }
  // N steps, for a loop step that loads N cache lines of the current tile: the stream keeps pace
  // with the loads, so the next tile is prefetched whole by the end of this one (one line a step
  // covered a quarter of a float32 tile on avx512 - 1.16x decode's time, bf16 1.28x; 32/8, d 128,
  // 32k keys, paired A/B: docs/performance.md).
  template <int N>
  __attribute__((always_inline)) void lines() {
    for (int i = 0; i < N; ++i) (*this)();
  }
  __attribute__((always_inline)) void operator()() {
    if (next < end) {
      if (to_l2)
        __builtin_prefetch(next, 0, 2);
      else
        __builtin_prefetch(next, 0, 3);
      next += 64;
    } else if (which < 2) {
      if (contiguous[which] || ++row == rows_of[which][run]) row = 0, ++run;
      if (run == nruns[which]) run = 0, ++which;
      if (which < 2) begin_run();
    }
  }
};

// Where GEMM 1 reads the panel's query values: row m's value k.
//   Packed: score_panel's layout, k-major (the MR values broadcast at step k adjacent) - the
//           forward packs each query tile once and reuses it for every key tile.
//   Strided: rows as they lie, ld floats apart - the backward's Q and dO tiles, which meet each
//           key tile once: packing them cost a scalar scatter per value (~9% of its time, avx512).
template <int MR>
struct Packed {
  const float* p;
  float at(int64_t k, int m) const { return p[k * MR + m]; }
};
struct Strided {
  const float* p;
  int64_t ld;
  float at(int64_t k, int m) const { return p[m * ld + k]; }
};

// GEMM 1 on NV of a register block's vectors of keys for one panel: kb points at the first
// of them in the block's packed [d][kBlockKeys] K^T, s at their first score of row 0 (rows LdS
// floats apart: kTileKeys, or a wide step's row of several tiles).
template <int MR, int NV, int LdS, class A, class Step>
inline void score_block(const A& q, const float* kb, int64_t d, float* s, Step& step) {
  Batch acc[MR][NV];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v) acc[m][v] = Batch(0.f);
  for (int64_t k = 0; k < d; ++k) {
    step();
    const float* kr = kb + k * kBlockKeys;
    Batch kv[NV];
    for (int v = 0; v < NV; ++v) kv[v] = Batch::load_aligned(kr + v * kLanes);
    for (int m = 0; m < MR; ++m) {
      const Batch qb(q.at(k, m));
      for (int v = 0; v < NV; ++v) acc[m][v] = simd::fma(qb, kv[v], acc[m][v]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v) acc[m][v].store_aligned(s + m * LdS + v * kLanes);
}

// score_block with nv <= NV vectors (a run-time count).
template <int MR, int NV, int LdS, class A, class Step>
inline void score_vectors(int nv, const A& q, const float* kb, int64_t d, float* s, Step& step) {
  if constexpr (NV > 1) {
    if (nv < NV) return score_vectors<MR, NV - 1, LdS>(nv, q, kb, d, s, step);
  }
  score_block<MR, NV, LdS>(q, kb, d, s, step);
}

// GEMM 1 for one register panel: s[m * kTileKeys + j] = sum_k q(k, m) * Kt(k, j) for the
// vectors of keys that overlap [ja, jb) (the others are not written): a partial tile's
// edges (a window's band, the causal diagonal, the 4 keys of a sinks tile) cost the vectors
// they touch, not whole 64-key register blocks. q: the panel's MR query rows, Packed (qp
// k-major) or Strided. kt as written by pack_k_transposed; s 64-byte aligned. The scores go
// through L1 (MR x 64 floats): the epilogue then works on tile rows, whatever the register
// block of the target. LdS: the score rows' stride (kTileKeys; a wide step's, kWideKeys).
template <int MR, int LdS = kTileKeys, class A, class Step>
inline void score_panel_of(const A& q, const float* kt, int64_t d, int ja, int jb, float* s, Step& step) {
  const int64_t dp = padded_dim(d);
  for (int j0 = ja / kBlockKeys * kBlockKeys; j0 < jb; j0 += kBlockKeys) {
    const int va = (std::max(ja, j0) - j0) / kLanes;
    const int vb = (std::min(jb, j0 + kBlockKeys) - j0 + kLanes - 1) / kLanes;
    score_vectors<MR, kKeyVecs, LdS>(vb - va, q, kt + kt_offset(dp, 0, j0) + va * kLanes, d, s + j0 + va * kLanes,
                                     step);
  }
}
// qp: the panel packed k-major (Packed).
template <int MR, int LdS = kTileKeys, class Step = NoStep>
inline void score_panel(const float* qp, const float* kt, int64_t d, int ja, int jb, float* s, Step&& step = {}) {
  score_panel_of<MR, LdS>(Packed<MR>{qp}, kt, d, ja, jb, s, step);
}
// q: the panel's rows as they lie, ldq floats apart (Strided). Not inlined: inlined into the
// backward's dots (all six panel heights in one function), GCC 12 kept two of the four K^T
// vectors on the stack, reloaded by 12 of the 24 FMAs of every step.
template <int MR>
__attribute__((noinline)) void score_panel_strided(const float* q, int64_t ldq, const float* kt, int64_t d, int ja,
                                                   int jb, float* s) {
  NoStep none;
  score_panel_of<MR>(Strided{q, ldq}, kt, d, ja, jb, s, none);
}

// GEMM 1 without packing, for a decode task's few rows (tiles.cpp: rows <= kDirectRows; decode_i8 kStreamRows):
// s[m * kTileKeys + j] = <qr row m, K row j> for m < MR and j in [ja, jb), straight from the
// K rows as stored (E widened where loaded). Register block: kDotRows rows x kDotKeys keys
// of accumulators (AVX2: 4 x 2 = 8, one reduction; 32-register targets 4 x 4), each K vector
// feeding 4 rows and each Q vector kDotKeys keys, reduced kLanes accumulators at a time
// (transpose_sum). Two vectors of d per step, Q held in registers, for float32, f16 and bf16
// K (+9% for f32 in tools/probes/decode_scores, paired rounds: GCC otherwise reloads Q for each
// key); a quantized K one vector per step (its widening needs the registers). AVX2 4 x 3 (16 registers) measured ~13%
// slower for float32 decode and within noise at 16-bit (attn_bench decode group, 3 interleaved A/B rounds); NEON's 4 x
// 4 follows the register budget, not a measurement. Packing K^T costs a load, a transpose and a store per element, as
// much as the GEMM itself when only ~4 rows use the tile. qr rows are ldq floats apart, zero padded to whole vectors
// and 64-byte aligned; `zero` is one such row of zeros (for rows past MR). step() as in score_panel.
inline constexpr int kDotRows = 4;
inline constexpr int kDotKeys = kNarrowPanels ? 2 : 4;

// bf16 K on x86: 2 * kLanes values are one vector load, split into their even-indexed values (a
// 32-bit shift left by 16) and their odd-indexed ones (the high halves, masked) - one ALU op per
// kLanes values instead of a widening shuffle and a shift. So that the dot product pairs them
// with the right Q values, a direct task's Q rows hold each group of 2 * kLanes values as its even
// ones, then its odd ones (qr_slot); the d tail past the last whole group keeps its order.
template <class E>
inline constexpr bool kEvenOdd = kEvenOddBf16&& std::is_same_v<E, bf16>;
inline constexpr int kPairGroup = 2 * kLanes;  // values per even/odd group

// Where Q value k of a row of d values lies in a direct task's Q row (score_rows) for K of type E.
template <class E>
inline int64_t qr_slot(int64_t k, int64_t d) {
  if (!kEvenOdd<E> || k >= d / kPairGroup * kPairGroup) return k;
  const int64_t g = k % kPairGroup;
  return k - g + (g % 2 ? kLanes : 0) + g / 2;
}

// keep_in_register (GCC otherwise folds a Q load into every FMA that uses it: one load per key
// instead of one per vector of Q) and load_even_odd are the floor's.

template <int MR, class E, class Step>
inline void score_rows(const float* qr, int64_t ldq, const float* zero, const Rows<E>& k, int64_t d, int ja, int jb,
                       float* s, Step& step) {
  constexpr int kAcc = kDotRows * kDotKeys;
  static_assert(kAcc % kLanes == 0, "whole reductions");
  const int64_t full = d / kLanes * kLanes;
  const int tail = static_cast<int>(d - full);
  for (int r0 = 0; r0 < MR; r0 += kDotRows) {
    const float* q[kDotRows];
    for (int r = 0; r < kDotRows; ++r) q[r] = r0 + r < MR ? qr + (r0 + r) * ldq : zero;
    for (int j = ja; j < jb; j += kDotKeys) {
      const E* kr[kDotKeys];  // keys past jb repeat the last one (computed, never stored)
      for (int c = 0; c < kDotKeys; ++c) kr[c] = k.row(j + c < jb ? j + c : jb - 1);
      Batch acc[kAcc];
      for (Batch& x : acc) x = Batch(0.f);
      auto step_block = [&](int64_t c, bool partial) {
        Batch kv[kDotKeys];
        for (int i = 0; i < kDotKeys; ++i) kv[i] = partial ? load_partial_at(kr[i], c, tail) : load_at(kr[i], c);
        for (int r = 0; r < kDotRows; ++r) {
          const Batch qv = Batch::load_aligned(q[r] + c);
          for (int i = 0; i < kDotKeys; ++i) acc[r * kDotKeys + i] = simd::fma(qv, kv[i], acc[r * kDotKeys + i]);
        }
      };
      int64_t c = 0;
      // Two vectors of d per step (float32, f16; bf16 as even/odd groups, qr_slot's layout), Q
      // held in registers; a quantized K one vector per step (step_block).
      if constexpr (kEvenOdd<E> || std::is_same_v<E, float> || std::is_same_v<E, f16>) {
        for (; c + 2 * kLanes <= full; c += 2 * kLanes) {
          step.template lines<2 * step_lines<E, kDotKeys>()>();  // the lines this step loads
          Batch k0[kDotKeys], k1[kDotKeys];
          for (int i = 0; i < kDotKeys; ++i) {
            if constexpr (kEvenOdd<E>) {
              load_even_odd(kr[i] + c, k0[i], k1[i]);
            } else {
              k0[i] = load_at(kr[i], c), k1[i] = load_at(kr[i], c + kLanes);
            }
          }
          for (int r = 0; r < kDotRows; ++r) {
            Batch q0 = Batch::load_aligned(q[r] + c), q1 = Batch::load_aligned(q[r] + c + kLanes);
            keep_in_register(q0), keep_in_register(q1);
            for (int i = 0; i < kDotKeys; ++i) {
              acc[r * kDotKeys + i] = simd::fma(q0, k0[i], acc[r * kDotKeys + i]);
              acc[r * kDotKeys + i] = simd::fma(q1, k1[i], acc[r * kDotKeys + i]);
            }
          }
        }
      }
      for (; c < full; c += kLanes) {
        step.template lines<step_lines<E, kDotKeys>()>();
        step_block(c, false);
      }
      if (tail > 0) step_block(full, true);
      alignas(64) float tile[kAcc];
      for (int g = 0; g < kAcc; g += kLanes) transpose_sum(acc + g).store_aligned(tile + g);
      const int rows = MR - r0 < kDotRows ? MR - r0 : kDotRows, keys = jb - j < kDotKeys ? jb - j : kDotKeys;
      for (int r = 0; r < rows; ++r)
        for (int i = 0; i < keys; ++i) s[(r0 + r) * kTileKeys + j + i] = tile[r * kDotKeys + i];
    }
  }
}

// GEMM 2 for one register panel and one column block of NV vectors:
//   o[m] = o[m] * alpha[m] (when alpha is given) + sum_{j in [ja, jb)} p[m * ldp + j] * v[j * ldv]
// o rows (ldo apart) are 64-byte aligned accumulators of NV full vectors. v points at key
// row 0 of the tile, the block starts at its column col. With Tail, the block's last vector holds
// only tail_lanes columns of V: it is loaded with a masked load (never reads past the row)
// and its other lanes stay 0.
template <int MR, int NV, bool Tail, class Step, class E>
inline void pv_panel(const float* p, int64_t ldp, const E* v, int64_t col, int64_t ldv, float* o, int64_t ldo,
                     const float* alpha, int ja, int jb, int tail_lanes, Step& step) {
  Batch acc[MR][NV];
  for (int m = 0; m < MR; ++m) {
    for (int c = 0; c < NV; ++c) acc[m][c] = Batch::load_aligned(o + m * ldo + c * kLanes);
    if (alpha) {
      const Batch a(alpha[m]);
      for (int c = 0; c < NV; ++c) acc[m][c] *= a;
    }
  }
  for (int j = ja; j < jb; ++j) {
    step.template lines<step_lines<E, NV>()>();
    const E* vr = v + j * ldv;
    Batch vv[NV];
    for (int c = 0; c < NV; ++c) {
      vv[c] = (Tail && c == NV - 1) ? load_partial_at(vr, col + c * kLanes, tail_lanes) : load_at(vr, col + c * kLanes);
    }
    for (int m = 0; m < MR; ++m) {
      const Batch pb(p[m * ldp + j]);
      for (int c = 0; c < NV; ++c) acc[m][c] = simd::fma(pb, vv[c], acc[m][c]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int c = 0; c < NV; ++c) acc[m][c].store_aligned(o + m * ldo + c * kLanes);
}

// GEMM 2 over all of d on one run of V rows: the whole vectors in column blocks of up to
// kOutVecs vectors, then a partial last vector (d not a multiple of kLanes) as a block of its
// own. Same arguments as pv_panel, v and o at column 0. Only the block widths a target uses
// are instantiated, and Tail only for one vector: pv_panel's variants are most of the tile
// engine's compile time (measured: 125 of 176 s of clang's optimizer on the avx2 tiles.cpp
// when every width had a Tail variant).
template <int MR, class E, class Step>
inline void pv_run(const float* p, int64_t ldp, const E* v, int64_t ldv, float* o, int64_t ldo, const float* alpha,
                   int ja, int jb, int64_t d, Step& step) {
  const int64_t whole = d / kLanes;
  const int tail = static_cast<int>(d - whole * kLanes);  // lanes of the partial vector, if any
  for (int64_t c0 = 0; c0 < whole; c0 += kOutVecs) {
    const int nv = static_cast<int>(whole - c0 < kOutVecs ? whole - c0 : kOutVecs);
    const int64_t col = c0 * kLanes;
    const auto run = [&]<int NV>() {
      if constexpr (NV <= kOutVecs)
        pv_panel<MR, NV, false>(p, ldp, v, col, ldv, o + col, ldo, alpha, ja, jb, kLanes, step);
    };
    static_assert(kOutVecs <= 4, "dispatch below covers NV = 1..4");
    switch (nv) {
      case 1: run.template operator()<1>(); break;
      case 2: run.template operator()<2>(); break;
      case 3: run.template operator()<3>(); break;
      case 4: run.template operator()<4>(); break;
    }
  }
  if (tail > 0)
    pv_panel<MR, 1, true>(p, ldp, v, whole * kLanes, ldv, o + whole * kLanes, ldo, alpha, ja, jb, tail, step);
}

// GEMM 2 over the tile's keys [ja, jb): run by run of V's rows (one for a contiguous cache),
// alpha applied with the first (alone when no key is in range).
template <int MR, class E, class Step = NoStep>
inline void pv_rows(const float* p, int64_t ldp, const Rows<E>& v, float* o, int64_t ldo, const float* alpha, int ja,
                    int jb, int64_t d, Step&& step = {}) {
  if (v.runs == 1 || ja >= jb) return pv_run<MR>(p, ldp, v.at[0], v.ld, o, ldo, alpha, ja, jb, d, step);
  v.each(ja, jb, [&](const E* rows, int first, int a, int b) {
    pv_run<MR>(p + first, ldp, rows, v.ld, o, ldo, alpha, a - first, b - first, d, step);
    alpha = nullptr;
  });
}

}  // namespace attnlab::ATTN_TARGET_NS::simd
