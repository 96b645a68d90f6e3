// The FlashAttention-2 tile engine (src/cpu/simd/tiles.hpp): packing, the per-panel
// online softmax and the two register-blocked GEMMs of src/cpu/simd/microkernel.hpp.
// What it does and why is in src/cpu/kernels/flash.cpp's header comment.
#include "cpu/simd/tiles.hpp"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "attnlab/isa.hpp"
#include "attnlab/blocks/online_softmax.hpp"
#include "cpu/engine/parallel.hpp"
#include "attnlab/kv_summary.hpp"
#include "cpu/simd/isa/amx.hpp"
#include "cpu/simd/isa/avx512_bf16.hpp"
#include "cpu/simd/int8_dot.hpp"
#include "cpu/simd/kv_load.hpp"
#include "cpu/simd/microkernel.hpp"
#include "cpu/simd/vec_math.hpp"

namespace attnlab::ATTN_TARGET_NS::simd {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr auto kLog2 = online_softmax::Units::Log2;
constexpr int64_t kRowStep = 24;  // Br granularity: R = G * Br is a multiple of 6 rows
// Br cap. Larger query tiles pack each K tile for more rows (pack_k_transposed is 1/R of GEMM 1's
// loads and ~10% of flash's time at R = 120 on Zen 3); 120 -> 240 rows measured 1.05-1.09x at
// d 128 (dense, causal, 32/8), 1.02x at d 64 (build/attn_ab_switch, 2 threads, paired).
constexpr int64_t kMaxRows = 240;
// ... but not at the cost of parallelism: Br shrinks (not below kTaskRows) while the problem has
// fewer than kMinTasks (parallel.hpp) (batch, kv head, query tile) tasks.
constexpr int64_t kTaskRows = 120;
// The AMX kernels' Br: a partial tile they cannot run on the tile unit runs the vector panels for
// all of a task's rows at a tenth of the tile unit's rate, and their tiles are packed once per
// run, not per task, so fewer rows per task cost little: flash_amx at 8/8, d 128, 4096, causal
// 44-50 ms at Br 240 -> 35 ms at 64 (128: 37 ms), dense unchanged (2 threads, the AMX Xeon;
// measured before masked tiles ran on the tile unit). While flash_int8_amx still packed V per
// task and tile, Br 64 made it 1.3x slower.
constexpr int64_t kAmxMaxRows = 64;
constexpr int64_t kAmxRows = 32;  // query rows per AMX block (amx.hpp)
inline int64_t amx_rows(int64_t r) { return (r + kAmxRows - 1) / kAmxRows * kAmxRows; }
// flash_amx's pre-packed whole tiles run kAmxGroup at a time (amx_prepacked_tiles): one softmax over
// their kAmxGroupKeys keys a row, one load and store of the O tiles for all of them.
constexpr int64_t kAmxGroup = 4, kAmxGroupKeys = kAmxGroup * 64;

inline size_t align64(size_t bytes) { return (bytes + 63) / 64 * 64; }

// Whether the int8 paths sum with vpdpbusd: this target has a VNNI unit, the CPU runs it, and
// ATTN_NO_VNNI=1 (tests, comparisons) does not ask for vpmaddubsw + vpmaddwd instead.
inline bool no_vnni_asked() {
  const char* v = std::getenv("ATTN_NO_VNNI");
  return v && std::string_view(v) == "1";
}
inline bool i8_vnni_runs() { return kI8VnniBuilt && cpu_runs_isa(kI8Unit) && !no_vnni_asked(); }
// decode_i8's K.Q unit (kI8ScoreUnit: vpdpbusd as above, or NEON's sdot): ATTN_NO_VNNI=1 keeps
// the rule on NEON too.
inline bool i8_dot_unit_runs() { return kI8ScoreUnit[0] != '\0' && cpu_runs_isa(kI8ScoreUnit) && !no_vnni_asked(); }

// Whether decode_i8 multiplies P.V in integers (pv_tile_i8): vpdpbusd on the vector targets (its
// u8 x s8 products overflow vpmaddubsw's int16 pairs at P's 255 levels: without VNNI P.V stays
// float32), the rule's sums on the scalar and NEON targets; ATTN_I8_PV=0 (comparisons) keeps P.V
// in float32 everywhere.
inline bool i8_pv_runs(bool vnni) {
  const char* v = std::getenv("ATTN_I8_PV");
  return (vnni || !kI8Vector) && !(v && std::string_view(v) == "0");
}

// flash_int8 (Tiling::i8_prefill): a head's shared area, and the running task's header in its
// scratch (byte 0: the task scores in integers; bytes 8..15: its head's area).
inline std::byte* i8_head_area(const Tiling& t, std::byte* shared, int64_t kv_heads, int64_t b, int64_t hk) {
  return shared + static_cast<size_t>(b * kv_heads + hk) * t.i8_head;
}
inline const std::byte* i8_task_head(const Scratch& s) {
  const std::byte* h = nullptr;
  std::memcpy(&h, s.i8 + 8, sizeof h);
  return h;
}
inline const float* i8_head_mean(const std::byte* head) { return reinterpret_cast<const float*>(head + 64); }
inline const std::byte* i8_key_tile(const Tiling& t, const std::byte* head, int64_t j0) {
  const size_t mean = align64(sizeof(float) * static_cast<size_t>(t.dim));
  return head + 64 + mean + static_cast<size_t>(j0 / kTileKeys) * I8KeyTile(t.dim).bytes;
}

// flash_int8's rounded V (Tiling::i8_pv): its channels' scales and the value tile at key j0.
inline const float* i8_value_scale(const Tiling& t, const std::byte* head) {
  return reinterpret_cast<const float*>(head + t.i8_v_off);
}
inline const std::byte* i8_value_tile(const Tiling& t, const std::byte* head, int64_t j0) {
  return head + t.i8_v_off + align64(sizeof(float) * static_cast<size_t>(t.dim_v_pad)) +
         static_cast<size_t>(j0 / kTileKeys) * I8ValueTile(t.dim_v_pad).bytes;
}

// flash_int8's scores of the panel of MR rows at rr0 against the head's rounded key tile at j0,
// keys [ja, jb), into s_out (rows LdS apart).
template <int MR, int LdS = kTileKeys>
void score_i8_tile(const Tiling& t, const Scratch& s, int64_t rr0, int64_t j0, int ja, int jb, float* s_out) {
  const I8KeyTile l(t.dim);
  const auto* qw = reinterpret_cast<const int32_t*>(s.i8 + t.i8_qw_off) + rr0 * l.words;
  const float* qsc = reinterpret_cast<const float*>(s.i8 + t.i8_qsc_off) + rr0;
  const float* qc = reinterpret_cast<const float*>(s.i8 + t.i8_c_off) + rr0;
  const std::byte* tile = i8_key_tile(t, i8_task_head(s), j0);
  if (t.i8_vnni) {
    score_panel_i8<MR, kI8VnniBuilt, LdS>(qw, l, tile, qsc, qc, ja, jb, s_out);
  } else {
    score_panel_i8<MR, false, LdS>(qw, l, tile, qsc, qc, ja, jb, s_out);
  }
}

// Whether flash_int8's P.V in integers runs for this task (Tiling::i8_pv, and its head's V rounded).
inline bool i8_pv_task(const Tiling& t, const Scratch& s) {
  return t.i8_prefill && t.i8_pv && s.i8_on() && i8_task_head(s)[1] == std::byte{1};
}

// flash_int8's integer P.V of g consecutive whole tiles from j0 for the panel of MR rows at rr0
// (i8_pv_task): P (rows LdP apart, tile i at p + 64 i) to u8 codes per row and tile (round_p_tile's
// rule; no V scales: they are per channel, applied after), the head's V codes, vpdpbusd
// (pv_tile_u8), after O *= alpha (when given). false (nothing done): a weight the rule refuses
// (never from finite scores) or no vpdpbusd in this target; the caller multiplies in float32.
template <int MR, int LdP = kTileKeys>
bool pv_i8_tiles(const Tiling& t, const Scratch& s, int64_t rr0, const float* p, int64_t j0, int g,
                 const float* alpha) {
  if constexpr (kI8Vector && kI8VnniBuilt) {
    PCodes<MR> pc[kWideTiles];
    Batch bad(0.f);
    for (int i = 0; i < g; ++i) round_p_block<MR, false, LdP>(p + i * kTileKeys, nullptr, nullptr, 0, pc[i], bad);
    if (bad_weights(bad)) return false;
    const std::byte* head = i8_task_head(s);
    pv_tile_u8<MR>(pc, g, I8ValueTile(t.dim_v_pad), i8_value_tile(t, head, j0), i8_value_scale(t, head),
                   s.o + rr0 * t.dim_v_pad, t.dim_v_pad, alpha);
    return true;
  } else {
    (void)t, (void)s, (void)rr0, (void)p, (void)j0, (void)g, (void)alpha;
    return false;
  }
}

// Tiling::kt_shared: where head bh's packed K^T tile at key j0 (a multiple of 64) lies, in bytes.
// flash_bf16's: the K^T pairs tile (4-byte words, as floats are).
inline int64_t kt_tile_words(const Tiling& t) { return (t.bf16_dot ? padded_words(t.dim) : t.dim_pad) * kTileKeys; }
inline size_t kt_at(const Tiling& t, int64_t bh, int64_t j0) {
  return static_cast<size_t>(bh) * t.kt_head + sizeof(float) * static_cast<size_t>(j0 / kTileKeys * kt_tile_words(t));
}
// flash_bf16's shared V pairs from key j0 (even) of head bh, after its K^T pairs tiles.
inline size_t vp_at(const Tiling& t, int64_t bh, int64_t j0) {
  return static_cast<size_t>(bh) * t.kt_head +
         sizeof(uint32_t) * static_cast<size_t>(t.kt_tiles * kt_tile_words(t) + j0 / 2 * t.dim_v_pad);
}

// One key tile as a task sees it; E is the storage type of K and V (float, bf16, f16, or a
// quantized cache's Quant<T>: kv_load.hpp).
template <class E>
struct KeyTile {
  int64_t j0 = 0;  // first key
  int nk = 0;      // keys in the tile (<= kTileKeys)
  Rows<E> k, v;    // its K and V rows (one run each, or one per block of a paged cache)
};

// Runs of set bits of x, in order: f(first, end).
template <class F>
inline void for_runs(uint64_t x, const F& f) {
  while (x) {
    const int a = std::countr_zero(x);
    const int n = std::countr_one(x >> a);
    f(a, a + n);
    x = a + n >= 64 ? 0 : x & (~uint64_t{0} << (a + n));
  }
}

// GEMM 2 for N rows of the panel at rr0, starting with its row m0: O += P.V over the tile's keys
// [x, y), after O *= alpha (when given). Pairs (flash_bf16): whole key pairs through the bf16
// dot product, an odd key at either end through the float32 kernel on the same rounded P, so
// a pair never includes a key the rows do not see.
template <int N, bool Pairs, class E, class Step>
void pv_keys(const Tiling& t, const Scratch& s, int64_t rr0, int m0, const KeyTile<E>& kt, const float* alpha, int x,
             int y, Step& step) {
  const float* p = s.p + m0 * kTileKeys;
  float* o = s.o + (rr0 + m0) * t.dim_v_pad;
  if constexpr (Pairs) {
    if (x < y && (x & 1)) {
      pv_rows<N>(p, kTileKeys, kt.v, o, t.dim_v_pad, alpha, x, x + 1, t.dim_v);
      alpha = nullptr, ++x;
    }
    if (x < y && (y & 1)) {
      pv_rows<N>(p, kTileKeys, kt.v, o, t.dim_v_pad, alpha, y - 1, y, t.dim_v);
      alpha = nullptr, --y;
    }
    if (x < y || alpha)
      pv_pairs<N>(s.pw + m0 * (kTileKeys / 2), kTileKeys / 2, s.vp, t.dim_v_pad, o, t.dim_v_pad, alpha, x / 2, y / 2,
                  t.dim_v, step);
    return;
  }
  static_assert(!Pairs || kPairsBuilt);
  pv_rows<N>(p, kTileKeys, kt.v, o, t.dim_v_pad, alpha, x, y, t.dim_v, step);
}

// The score modifications (include/attnlab/blocks/score_mod.hpp) of MR rows' scores in vectors
// [va, vb) of a tile (or wide step) whose key 0 is j0, in place, in log2 units: softcap c tanh(s / c),
// then ALiBi's slope x (j - the row's diagonal). Masked keys are modified too and then replaced.
template <int MR, int RowKeys>
void modify_scores(const Scratch& s, float* p, int64_t rr0, int64_t j0, int va, int vb) {
  for (int m = 0; m < MR; ++m) {
    const bool alibi = s.slope2 != nullptr;
    modify_score_row(p + m * RowKeys, va, vb, s.softcap2, alibi ? s.slope2[rr0 + m] : 0.f,
                     alibi ? j0 - s.diag[rr0 + m] : 0);
  }
}

// The online softmax of MR rows (rows rr0.. of the task) on one key tile, their scores in p
// (MR x kTileKeys, log2 units), over the tile's vectors [va, vb) (those score_panel wrote:
// every key some row sees lies in them; P outside them is never read): the masked keys (none
// when full; else the holes of words w, or outside [lo, hi)) become -inf, then the new row
// max, the rescale factors alpha (one vector exp2 for all rows), P = exp2(S - m) in place, l
// and m updated. Returns whether some alpha != 1.
// Amx (flash_amx's tiles: all vectors, whole or masked by intervals): p holds the unscaled
// scores, multiplied by scale as they are read (the same products a scaling pass would store;
// a masked tile's first pass stores them scaled), and P goes, rounded to
// bf16 pairs, to pw (round_p_rows' layout and rounding) instead of back to p: no pass over the
// scores but the two this one makes (a scaling pass and round_p_rows' pass cost 10% of
// flash_amx's time).
// RowKeys: the scores' row length in p (and P's, in pairs, in pw): the AMX blocks' rows span up
// to kAmxGroup tiles.
// j0: the key of the scores' first lane, for the score modifications (modify_scores), which need
// scaled scores (scale 1: the AMX tiles' kernels do not take them).
template <int MR, bool Words, bool Amx = false, int RowKeys = kTileKeys>
bool softmax_rows(const Scratch& s, float* p, int64_t rr0, bool full, const int* lo, const int* hi, const uint64_t* w,
                  float* alpha, int va = 0, int vb = kTileKeys / kLanes, float scale = 1.f, uint32_t* pw = nullptr,
                  int64_t j0 = 0) {
  static_assert(!Amx || !Words,
                "the AMX blocks' tiles are whole or masked by intervals");  // (store_pairs: kPairsBuilt)
  if (s.softcap2 > 0.f || s.slope2) {
    if (scale != 1.f) throw std::logic_error("tile engine: score modifications on unscaled scores");
    modify_scores<MR, RowKeys>(s, p, rr0, j0, va, vb);
  }
  const Batch sc(scale);
  const auto score = [&](const float* at) {
    if constexpr (Amx) {
      // The rounded product, as the max saw it: fused into an FMA with the subtraction below,
      // the max score's exp2 argument would be its rounding error - up to 2^103 for a score near
      // FLT_MAX, and P = inf.
      Batch x = Batch::load_aligned(at) * sc;
      keep_in_register(x);
      return x;
    } else {
      return Batch::load_aligned(at);
    }
  };
  float m_old[MR], m_new[MR];
  for (int m = 0; m < MR; ++m) {
    float* prow = p + m * RowKeys;
    Batch vmax(kNegInf);
    if (full) {
      for (int v = va; v < vb; ++v) vmax = max(vmax, score(prow + v * kLanes));
    } else if constexpr (Words) {
      for (int v = va; v < vb; ++v) {
        const auto bits = static_cast<uint32_t>(w[m] >> (v * kLanes)) & ((uint32_t{1} << kLanes) - 1);
        const Batch x = keep_bits(Batch::load_aligned(prow + v * kLanes), bits, kNegInf);
        x.store_aligned(prow + v * kLanes);
        vmax = max(vmax, x);
      }
    } else {
      const Batch lo_b(static_cast<float>(lo[m])), hi_b(static_cast<float>(hi[m]));
      for (int v = va; v < vb; ++v) {
        const Batch idx = lane_index(v);
        const Batch x = select(mask_and(idx >= lo_b, idx < hi_b), score(prow + v * kLanes), Batch(kNegInf));
        x.store_aligned(prow + v * kLanes);  // (Amx: scaled, so the second pass reads it as it is)
        vmax = max(vmax, x);
      }
    }
    m_old[m] = s.m[rr0 + m];
    m_new[m] = std::max(m_old[m], reduce_max(vmax));
  }
  bool rescale = false;
  // include/attnlab/blocks/online_softmax.hpp: never skipped by its max; a NaN the max drops still
  // makes l NaN. alpha is 1 (no rescale) unless the max grew past a finite one; the factors
  // of all MR rows come from one vector exp2.
  for (int m0 = 0; m0 < MR; m0 += kLanes) {
    const int n = std::min(kLanes, MR - m0);
    const Batch a = rescale_log2(load_partial(m_old + m0, n), load_partial(m_new + m0, n));
    store_partial(alpha + m0, a, n);
  }
  for (int m = 0; m < MR; ++m) {
    rescale = rescale || alpha[m] != 1.f;
    float* prow = p + m * RowKeys;
    const Batch mb(online_softmax::subtrahend(m_new[m]));
    Batch sum(0.f);
    if constexpr (Amx) {
      const auto scaled = [&](int v) {
        return full ? score(prow + v * kLanes) : Batch::load_aligned(prow + v * kLanes);
      };
      for (int v = va; v < vb; v += 2) {
        const Batch p0 = exp2_nonpositive(scaled(v) - mb);
        const Batch p1 = exp2_nonpositive(scaled(v + 1) - mb);
        store_pairs(pw + m * (RowKeys / 2) + v * (kLanes / 2), p0, p1);
        sum += p0;
        sum += p1;
      }
    } else {
      for (int v = va; v < vb; ++v) {
        const Batch pv = exp2_nonpositive(Batch::load_aligned(prow + v * kLanes) - mb);  // s <= m_new
        pv.store_aligned(prow + v * kLanes);
        sum += pv;
      }
    }
    float* lrow = s.l + (rr0 + m) * kLanes;
    (Batch::load_aligned(lrow) * Batch(alpha[m]) + sum).store_aligned(lrow);
    s.m[rr0 + m] = m_new[m];
  }
  return rescale;
}

// decode_i8's task of 2 panels or more (GQA >= 8 at q_len 1): the tile's K words (prep_k_words), and with
// 3 panels or more (v), on a whole tile with integer P.V, its V words (prep_v_words) and V scales
// (v_tile_scales), made once into Scratch::i8_prep for every panel. Paired (build/attn_ab_switch decode
// --kernel decode_i8, 32k keys, d 128, 2 threads, the AMX Xeon avx512):
// - K words against the slices the panels put together (or, before, loaded from a slice prep at 3
//   panels): GQA 16 q4_0 1.23x, q8_0 1.24x, u8 1.12x, u4 1.09x; GQA 8 q4_0 1.12x, q8_0 1.13x, u8
//   1.10x, u4 1.02x. At GQA 4 (one panel) the transpose costs what it saves (u8 0.96x, u4 0.87x).
// - V words and scales at 3 panels: u8 1.04x, u4 1.07x, q8_0 1.04x, q4_0 1.08x (with K slices); at 2
//   panels 0.98-1.05x, so off there.
template <class E>
Scratch prep_i8_tile(const Tiling& t, const Scratch& s, const KeyTile<E>& kt, bool v) {
  Scratch sp = s;
  if constexpr (kIntDot<E> && kI8Vector) {
    if (!s.i8_prep || !s.i8_on()) return sp;
    const I8Layout l(t.dim);
    if (t.i8_vnni) {
      prep_k_words<E::type, true>(l, kt.k, kt.nk, s.i8_prep);
    } else {
      prep_k_words<E::type, false>(l, kt.k, kt.nk, s.i8_prep);
    }
    sp.i8_k_pre = s.i8_prep;
    if (v && t.i8_pv && kt.nk == kTileKeys) {
      const std::byte* vr[kTileKeys];
      for (int j = 0; j < kTileKeys; ++j) vr[j] = reinterpret_cast<const std::byte*>(kt.v.row(j));
      prep_v_words<E::type>(vr, t.dim_v, s.i8_prep + t.i8_prep_v);
      sp.i8_v_pre = s.i8_prep + t.i8_prep_v;
      auto* scales = reinterpret_cast<float*>(s.i8_prep + t.i8_prep_v + v_word_bytes(t.dim_v));
      v_tile_scales<E::type>(vr, t.dim_v, scales);
      sp.i8_v_scales = scales;
    }
  }
  return sp;
}

// The vectors of MR rows of scores (or P) over keys [ja, jb) of a tile, times f.
template <int MR>
inline void scale_scores(float* p, int ja, int jb, float f) {
  const Batch b(f);
  for (int m = 0; m < MR; ++m)
    for (int v = ja / kLanes; v < (jb + kLanes - 1) / kLanes; ++v)
      (Batch::load_aligned(p + m * kTileKeys + v * kLanes) * b).store_aligned(p + m * kTileKeys + v * kLanes);
}

// Step 2 of src/cpu/kernels/flash.cpp's header for the panel of MR rows starting at rr0 and one key tile.
// Words: the rows' visible keys in the tile come as one 64-bit word per row (a sparse pattern's
// block map, pattern.hpp; words == nullptr: every row sees every key of the tile), else from
// the rows' intervals (Scratch::iv). Pairs: flash_bf16's bf16 dot products (Tiling::bf16_dot).
template <int MR, bool Direct, bool Words, bool Pairs, class Step, class E>
void process_panel(const Tiling& t, const Scratch& s, int64_t rr0, const KeyTile<E>& kt, const uint64_t* words,
                   Step& step) {
  static_assert(kTileKeys == BlockMap::kBlockKeys, "one block-map word per row and key tile");
  // Visible keys of each row inside the tile, relative to j0; full = no row needs a mask.
  int lo[MR], hi[MR];
  uint64_t w[MR];
  int ja = kt.nk, jb = 0;  // union of the rows' visible keys: the score blocks to compute
  bool full = true;
  const uint64_t valid = kt.nk == 64 ? ~uint64_t{0} : (uint64_t{1} << kt.nk) - 1;
  for (int m = 0; m < MR && Words; ++m) {
    w[m] = (words ? words[rr0 + m] : ~uint64_t{0}) & valid;
    if (w[m]) ja = std::min(ja, std::countr_zero(w[m])), jb = std::max(jb, 64 - std::countl_zero(w[m]));
    full = full && w[m] == ~uint64_t{0};
  }
  for (int m = 0; m < MR && !Words; ++m) {
    const Interval& iv = s.iv[rr0 + m];
    lo[m] = static_cast<int>(std::clamp<int64_t>(iv.lo - kt.j0, 0, kt.nk));
    hi[m] = static_cast<int>(std::clamp<int64_t>(iv.hi - kt.j0, 0, kt.nk));
    if (hi[m] <= lo[m]) {
      lo[m] = hi[m] = 0;
    } else {
      ja = std::min(ja, lo[m]), jb = std::max(jb, hi[m]);
    }
    full = full && lo[m] == 0 && hi[m] == kTileKeys;  // a short tile is never full
  }
  if (ja >= jb) return;

  // S through L1; masked keys become -inf by a select (never arithmetic, so NaN/Inf in a
  // masked K row never leaks), the blocks outside [ja, jb) are never read unmasked.
  if constexpr (Direct) {
    bool done = false;
    if constexpr (kIntDot<E>) {
      if (s.i8_on()) {
        const std::byte* rows = s.i8 + 64;
        const I8Layout l(t.dim);
        const std::byte* zero = rows + t.rows * t.i8_row;
        if (t.i8_vnni) {
          score_rows_i8<MR, E::type, true>(rows + rr0 * t.i8_row, t.i8_row, zero, l, kt.k, ja, jb, s.p, step,
                                           s.i8_k_pre);
        } else {
          score_rows_i8<MR, E::type, false>(rows + rr0 * t.i8_row, t.i8_row, zero, l, kt.k, ja, jb, s.p, step,
                                            s.i8_k_pre);
        }
        done = true;
      }
    }
    if (!done) {
      score_rows<MR>(s.qr + rr0 * t.dim_pad, t.dim_pad, s.qr + t.rows * t.dim_pad, kt.k, t.dim, ja, jb, s.p, step);
      if constexpr (kReadScale<E> != 1.f) scale_scores<MR>(s.p, ja, jb, 1.f / kReadScale<E>);  // K's values' scale
    }
  } else if constexpr (Pairs) {
    const auto* qw = reinterpret_cast<const uint32_t*>(s.q) + rr0 * pair_words(t.dim);
    score_panel_bf16<MR>(qw, reinterpret_cast<const uint32_t*>(s.kt), t.dim, t.score_scale, ja, jb, s.p, step);
  } else {
    bool done = false;
    if constexpr (std::is_same_v<E, float>) {
      if (t.i8_prefill && s.i8_on()) {  // flash_int8: the head's rounded key tile, Q's panel words
        score_i8_tile<MR>(t, s, rr0, kt.j0, ja, jb, s.p);
        done = true;
      }
    }
    if (!done) score_panel<MR>(s.q + rr0 * t.dim, s.kt, t.dim, ja, jb, s.p, step);
  }
  float alpha[MR];
  const bool rescale = softmax_rows<MR, Words>(s, s.p, rr0, full, lo, hi, w, alpha, ja / kLanes,
                                               (jb + kLanes - 1) / kLanes, 1.f, nullptr, kt.j0);
  if constexpr (Pairs) round_p_rows<MR>(s.p, s.pw);                                        // l keeps the unrounded sum
  if constexpr (kReadScale<E> != 1.f) scale_scores<MR>(s.p, ja, jb, 1.f / kReadScale<E>);  // V's values' scale

  const float* a = rescale ? alpha : nullptr;
  if (full) {
    if constexpr (std::is_same_v<E, float> && !Direct && !Pairs) {
      if (i8_pv_task(t, s) && pv_i8_tiles<MR>(t, s, rr0, s.p, kt.j0, 1, a)) return;  // flash_int8
    }
    if constexpr (kIntDot<E>) {
      if (s.i8_on() && t.i8_pv) {  // decode_i8: P rounded per tile (round_p_tile), P.V in integers
        const std::byte* vr[kTileKeys];
        for (int j = 0; j < kTileKeys; ++j) vr[j] = reinterpret_cast<const std::byte*>(kt.v.row(j));
        PCodes<MR> pc;
        if (round_p_rows<MR, E::type>(s.p, vr, t.dim_v, pc, s.i8_v_scales)) {
          pv_tile_i8<MR, E::type>(pc, vr, t.dim_v, s.o + rr0 * t.dim_v_pad, t.dim_v_pad, a, step, s.i8_v_pre);
          return;
        }
      }
      if constexpr (is_row_type(E::type)) {
        if (s.i8_on()) {  // decode_i8: each key's scale on P, the codes' P.V, the zero points' share off O
          float off[MR];
          fold_row_scales<MR>(s.p, kt.v, off);
          float* o = s.o + rr0 * t.dim_v_pad;
          pv_rows<MR>(s.p, kTileKeys, codes_of(kt.v), o, t.dim_v_pad, a, 0, kt.nk, t.dim_v, step);
          for (int m = 0; m < MR; ++m) {
            const Batch c(off[m]);
            for (int64_t x = 0; x < t.dim_v_pad; x += kLanes) {
              (Batch::load_aligned(o + m * t.dim_v_pad + x) - c).store_aligned(o + m * t.dim_v_pad + x);
            }
          }
          return;
        }
      }
    }
    pv_keys<MR, Pairs>(t, s, rr0, 0, kt, a, 0, kt.nk, step);
    return;
  }
  if constexpr (Words) {
    // The keys every row sees through the MR-row kernel (run by run; the rescale rides on the
    // first call), each row's other keys one row at a time.
    uint64_t common = ~uint64_t{0};
    for (int m = 0; m < MR; ++m) common &= w[m];
    const float* first = a;
    NoStep none;
    for_runs(common, [&](int x, int y) {
      pv_keys<MR, Pairs>(t, s, rr0, 0, kt, first, x, y, none);
      first = nullptr;
    });
    if (first) pv_keys<MR, Pairs>(t, s, rr0, 0, kt, first, 0, 0, none);
    for (int m = 0; m < MR; ++m) {
      for_runs(w[m] & ~common, [&](int x, int y) { pv_keys<1, Pairs>(t, s, rr0, m, kt, nullptr, x, y, none); });
    }
    return;
  }
  // Common visible range through the MR-row kernel, each row's ragged ends one row at a time.
  int ca = 0, cb = kt.nk;
  for (int m = 0; m < MR; ++m) ca = std::max(ca, lo[m]), cb = std::min(cb, hi[m]);
  if (ca >= cb) ca = cb = 0;
  NoStep none;
  if (ca < cb || a) pv_keys<MR, Pairs>(t, s, rr0, 0, kt, a, ca, cb, none);
  for (int m = 0; m < MR; ++m) {
    if (ca < cb) {
      if (lo[m] < ca) pv_keys<1, Pairs>(t, s, rr0, m, kt, nullptr, lo[m], ca, none);
      if (cb < hi[m]) pv_keys<1, Pairs>(t, s, rr0, m, kt, nullptr, cb, hi[m], none);
    } else if (lo[m] < hi[m]) {
      pv_keys<1, Pairs>(t, s, rr0, m, kt, nullptr, lo[m], hi[m], none);
    }
  }
}

// f.template operator()<M>() for a panel of mr rows. Only the panel heights this target has
// (scalar: 1 and 2 rows): each is a whole tile engine, and the tile engine is most of a build's
// compile time.
template <class F>
void with_panel_rows(int mr, const F& f) {
  static_assert(kPanelRows <= 6, "dispatch below covers panels of 1..6 rows");
  const auto run = [&]<int M>() {
    if constexpr (M <= kPanelRows) {
      f.template operator()<M>();
    } else {  // callers cut panels at kPanelRows rows: never silently skip one
      throw std::logic_error("tile engine: a panel of " + std::to_string(M) + " rows; this target's are at most " +
                             std::to_string(kPanelRows));
    }
  };
  switch (mr) {
    case 1: run.template operator()<1>(); break;
    case 2: run.template operator()<2>(); break;
    case 3: run.template operator()<3>(); break;
    case 4: run.template operator()<4>(); break;
    case 5: run.template operator()<5>(); break;
    case 6: run.template operator()<6>(); break;
  }
}

template <bool Direct, bool Words, bool Pairs, class Step, class E>
void process_panel_any(int mr, const Tiling& t, const Scratch& s, int64_t rr0, const KeyTile<E>& kt,
                       const uint64_t* words, Step& step) {
  with_panel_rows(mr, [&]<int M>() { process_panel<M, Direct, Words, Pairs>(t, s, rr0, kt, words, step); });
}

// A wide step for the panel of MR rows at rr0 (tiles.hpp: kWideKeys): the scores of g whole
// tiles every row sees (kt: their K^T side by side, pack_k_transposed's layout - in s.kt, or the
// head's shared tiles) into rows of kWideKeys floats, one online-softmax step over all of them,
// then O += P.V over their V rows with the rescale fused into the accumulators' load: one run v
// of all g * 64 keys (a contiguous cache: O loaded and stored once per column block for all of
// them, where the tile-by-tile panels do it per 64 keys), else tile by tile (a paged cache's
// runs, kts[i].v) - the same FMAs in the same order on the same accumulators, so both give the
// same bits. Pairs (flash_bf16): kt holds the tiles' K^T pairs (pack_k_pairs) and s.vp their V
// pairs side by side (pack_v_pairs); P rounded to bf16 pairs, one pv_pairs over all the keys.
template <int MR, bool Pairs, class E>
void process_wide(const Tiling& t, const Scratch& s, int64_t rr0, const float* kt, const KeyTile<E>* kts, int g,
                  const Rows<E>* v, const uint32_t* vp) {
  const int64_t tile_floats = t.dim_pad * kTileKeys;
  NoStep none;
  constexpr bool kFloat = std::is_same_v<E, float>;
  const bool i8 = kFloat && t.i8_prefill;  // (an int8 task: s.i8_on(), attend_tiles)
  for (int i = 0; i < g; ++i) {
    if constexpr (Pairs) {
      const auto* qw = reinterpret_cast<const uint32_t*>(s.q) + rr0 * pair_words(t.dim);
      const auto* kw = reinterpret_cast<const uint32_t*>(kt) + i * padded_words(t.dim) * kTileKeys;
      score_panel_bf16<MR, kWideKeys>(qw, kw, t.dim, t.score_scale, 0, kTileKeys, s.p + i * kTileKeys, none);
    } else if (i8) {
      score_i8_tile<MR, kWideKeys>(t, s, rr0, kts[i].j0, 0, kTileKeys, s.p + i * kTileKeys);
    } else {
      score_panel<MR, kWideKeys>(s.q + rr0 * t.dim, kt + i * tile_floats, t.dim, 0, kTileKeys, s.p + i * kTileKeys);
    }
  }
  float alpha[MR];
  float* o = s.o + rr0 * t.dim_v_pad;
  if constexpr (Pairs) {
    // P straight to bf16 pairs from the exp pass (the AMX blocks' form, scale 1: the same bits as
    // rounding a stored P afterwards, and l keeps the unrounded sum; 1.036x d 128, 1.024x d 64)
    const bool rescale = softmax_rows<MR, false, true, kWideKeys>(s, s.p, rr0, true, nullptr, nullptr, nullptr, alpha,
                                                                  0, g * kTileKeys / kLanes, 1.f, s.pw, kts[0].j0);
    pv_pairs<MR>(s.pw, kWideKeys / 2, vp, t.dim_v_pad, o, t.dim_v_pad, rescale ? alpha : nullptr, 0, g * kTileKeys / 2,
                 t.dim_v, none);
    return;
  }
  const bool rescale = softmax_rows<MR, false, false, kWideKeys>(s, s.p, rr0, true, nullptr, nullptr, nullptr, alpha, 0,
                                                                 g * kTileKeys / kLanes, 1.f, nullptr, kts[0].j0);
  const float* a = rescale ? alpha : nullptr;
  if constexpr (kFloat && !Pairs) {
    if (i8 && i8_pv_task(t, s) && pv_i8_tiles<MR, kWideKeys>(t, s, rr0, s.p, kts[0].j0, g, a)) return;  // flash_int8
  }
  if (v) return pv_rows<MR>(s.p, kWideKeys, *v, o, t.dim_v_pad, a, 0, g * kTileKeys, t.dim_v);
  for (int i = 0; i < g; ++i, a = nullptr) {
    pv_rows<MR>(s.p + i * kTileKeys, kWideKeys, kts[i].v, o, t.dim_v_pad, a, 0, kTileKeys, t.dim_v);
  }
}

template <class E>
void pack_rows(const Problem& p, const TypedInputs<E>& in, const Tiling& t, const Scratch& s, int64_t b, int64_t hk,
               RowPositions at, int64_t R) {
  // Q scaled so that scores come out in log2 units: row-major, zero padded, then a zero row
  // for a direct task (score_rows); else panels of kPanelRows rows, k-major (score_panel).
  const int64_t G = t.group, d = t.dim;
  const float q_scale = p.effective_scale() * kLog2e;
  if constexpr (std::is_same_v<E, float>) {
    if (t.i8_prefill) {  // flash_int8: Q's panel words if the head's keys and every Q row rounded
      std::byte* head = i8_head_area(t, s.i8_keys, p.kv_heads, b, hk);
      std::memcpy(s.i8 + 8, &head, sizeof head);
      const I8KeyTile l(d);
      auto* qw = reinterpret_cast<int32_t*>(s.i8 + t.i8_qw_off);
      auto* qsc = reinterpret_cast<float*>(s.i8 + t.i8_qsc_off);
      auto* c = reinterpret_cast<float*>(s.i8 + t.i8_c_off);
      const float* mean = i8_head_mean(head);
      bool all = head[0] == std::byte{1};
      int8_t codes[Problem::kMaxHeadDim];
      // flash_int8_amx: the codes row-major too (TDPBSSD's A), R rounded up to 32 rows (kAmxRows), zero padded.
      const int64_t amx_state = s.qa ? amx_rows(R) : 0;
      if (s.qa) std::fill(s.qa, s.qa + amx_state * l.rows, 0u);
      for (int64_t rr = 0; rr < R && all; ++rr) {
        float scale = 0.f;
        all = round_int8_row(in.q.row(b, hk * G + rr % G, at[rr / G]), d, codes, &scale);  // round_q_row's rule
        put_i8_q_row(l, qw, R, rr, codes, d, t.i8_vnni);
        if (s.qa) std::memcpy(s.qa + rr * l.rows, codes, static_cast<size_t>(d));
        qsc[rr] = scale * q_scale;
        float qm = 0.f;  // q.mean: smoothing took it off every score of the row, the epilogue adds it back
        for (int64_t k = 0; k < d; ++k) qm += static_cast<float>(codes[k]) * mean[k];
        c[rr] = qm * scale * q_scale;
      }
      for (int64_t rr = R; rr < amx_state; ++rr) qsc[rr] = c[rr] = 0.f;  // the AMX block's padding rows
      s.i8[0] = std::byte{all ? uint8_t{1} : uint8_t{0}};
      if (all) return;  // its float panels (s.q) are never read
    } else if (s.i8) {  // Q's integer rows; one row that cannot be rounded keeps the whole task in float32
      const I8Layout l(d);
      std::byte* rows = s.i8 + 64;
      bool all = true;
      for (int64_t rr = 0; rr < R && all; ++rr) {
        all = pack_i8_row(p.kv_dtype, in.q.row(b, hk * G + rr % G, at[rr / G]), l, q_scale, rows + rr * t.i8_row);
      }
      std::memset(rows + t.rows * t.i8_row, 0, static_cast<size_t>(t.i8_row));
      s.i8[0] = std::byte{all ? uint8_t{1} : uint8_t{0}};
      if (all) return;  // the task scores in integers: its float rows (qr) are never read
    }
  }
  if (s.qr) std::fill(s.qr, s.qr + (t.rows + 1) * t.dim_pad, 0.f);
  if (s.qa) std::fill(s.qa, s.qa + amx_rows(R) * padded_words(d), 0u);
  for (int64_t rr = 0; rr < R; ++rr) {
    const E* q = in.q.row(b, hk * G + rr % G, at[rr / G]);
    if constexpr (std::is_same_v<E, bf16>) {
      if (t.bf16_dot) {  // unscaled bf16 pairs, word-major in a panel, odd d zero padded
        const int64_t nw = (d + 1) / 2, panel0 = rr / kPanelRows * kPanelRows;
        const int64_t mr = std::min<int64_t>(kPanelRows, R - panel0);
        uint32_t* dst = reinterpret_cast<uint32_t*>(s.q) + panel0 * nw + (rr - panel0);
        uint32_t* row = s.qa ? s.qa + rr * padded_words(d) : nullptr;  // AMX: the same words row-major
        for (int64_t w = 0; w < nw; ++w) {
          dst[w * mr] = q[2 * w].bits | (2 * w + 1 < d ? uint32_t{q[2 * w + 1].bits} << 16 : 0u);
          if (row) row[w] = dst[w * mr];
        }
        continue;
      }
    }
    if (s.qr) {  // a direct task's row (bf16 K: groups of even values, then odd: qr_slot)
      for (int64_t k = 0; k < d; ++k) s.qr[rr * t.dim_pad + qr_slot<E>(k, d)] = to_float(q[k]) * q_scale;
      continue;
    }
    const int64_t panel0 = rr / kPanelRows * kPanelRows;
    const int64_t mr = std::min<int64_t>(kPanelRows, R - panel0);
    float* dst = s.q + panel0 * d + (rr - panel0);
    for (int64_t k = 0; k < d; ++k) dst[k * mr] = to_float(q[k]) * q_scale;
  }
}

// One key tile of a task's sequence: its first key, its keys, and the rows' words (Words only);
// k, v: its K and V rows when they are not rows j0.. of the inputs (the gathered tile: rows
// dim_pad / dim_v_pad elements apart in Scratch::gather).
struct TileRef {
  int64_t j0 = 0;
  int nk = 0;
  const uint64_t* words = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
};

// The K and V rows of tile r of head (b, hk): the inputs' rows, a paged cache's blocks, or the
// gathered rows.
template <class E>
KeyTile<E> key_tile(const TypedInputs<E>& in, const Tiling& t, int64_t b, int64_t hk, const TileRef& r) {
  KeyTile<E> kt{r.j0, r.nk, {}, {}};
  if (r.k) {  // the gathered tile
    kt.k = Rows<E>::strided(static_cast<const E*>(r.k), t.gather_ldk, r.nk);
    kt.v = Rows<E>::strided(static_cast<const E*>(r.v), t.gather_ldv, r.nk);
  } else if (!in.pages.table) {
    kt.k = Rows<E>::strided(in.k.row(b, hk, r.j0), in.k.stride_s, r.nk);
    kt.v = Rows<E>::strided(in.v.row(b, hk, r.j0), in.v.stride_s, r.nk);
  } else {  // a paged cache: one run per block the tile's keys lie in (kv_row's rule)
    const int64_t bs = in.pages.block;
    kt.k.ld = in.k.stride_s, kt.v.ld = in.v.stride_s;
    for (int64_t j = r.j0; j < r.j0 + r.nk; j = (j / bs + 1) * bs) {
      const int run = kt.k.runs++;
      kt.k.at[run] = kv_row(in.k, in.pages, b, hk, j), kt.v.at[run] = kv_row(in.v, in.pages, b, hk, j);
      kt.k.first[run] = kt.v.first[run] = static_cast<int>(j - r.j0);
    }
    kt.v.runs = kt.k.runs;
    kt.k.first[kt.k.runs] = kt.v.first[kt.v.runs] = r.nk;
  }
  return kt;
}

// fp8_e4m3's read spends three of its eight operations per 16 values on the NaN code (S.1111.111):
// a direct task's tile whose K and V rows hold none (e4m3_finite: an or and a max per 64 bytes, once
// per tile) is read without that test (Quant<T, true>, kv_load.hpp). Paired (build/attn_ab_switch
// decode --kv-dtype fp8_e4m3, 32k keys, d 128, 2 threads, the AMX Xeon avx512): decode 32/8 1.10-1.16x,
// 32/32 1.17x, paged (64) 1.14x, flash 32/8 1.14x. A task of more rows (GQA 16) widens K once per tile
// into K^T and there measured 0.99-1.00x, so it reads as before. Such a tile's values also skip E4M3's
// multiply by 2^8 (kReadScale): the scores and P take it, once per tile (scale_scores) - 1.04-1.09x
// more at 32/8 (old and new binaries alternated, 4 rounds), paged 1.06-1.09x.
template <class E>
inline constexpr bool kE4m3Finite = (kKvVector && std::is_same_v<E, Quant<KvDType::Fp8E4M3>>);
template <KvDType T>
bool e4m3_finite(const Rows<Quant<T>>& r, int nk, int64_t d) {
  bool nan = false;
  r.each(0, nk, [&](const Quant<T>* rows, int first, int a, int b) {
    const auto* p = reinterpret_cast<const std::byte*>(rows + (a - first) * r.ld);
    if (r.ld == d) {  // the run's rows back to back: one span
      nan = nan || kv_detail::e4m3_nan_code_in(p, (b - a) * d);
    } else {
      for (int j = a; j < b && !nan; ++j) nan = kv_detail::e4m3_nan_code_in(p + (j - a) * r.ld, d);
    }
  });
  return !nan;
}
template <KvDType T>
Rows<Quant<T, true>> finite_rows(const Rows<Quant<T>>& r) {
  Rows<Quant<T, true>> f;
  for (int i = 0; i < r.runs; ++i) f.at[i] = reinterpret_cast<const Quant<T, true>*>(r.at[i]);
  std::copy(r.first, r.first + Rows<Quant<T>>::kMaxRuns + 1, f.first);
  f.runs = r.runs, f.ld = r.ld;
  return f;
}
template <KvDType T>
KeyTile<Quant<T, true>> finite_rows(const KeyTile<Quant<T>>& kt) {
  return {kt.j0, kt.nk, finite_rows(kt.k), finite_rows(kt.v)};
}

// Panel pi of `panels`'s share of a coming tile's K and V rows, prefetched while the panel computes.
template <class E>
inline void prefetch_slice(const KeyTile<E>& kn, int64_t pi, int64_t panels, int64_t d, int64_t dv) {
  const auto r0 = static_cast<int>(pi * kn.nk / panels), r1 = static_cast<int>((pi + 1) * kn.nk / panels);
  prefetch_rows(kn.k, r0, r1, d);
  prefetch_rows(kn.v, r0, r1, dv);
}

// The keys every row of the task sees (the intersection of the rows' intervals; empty when some
// row sees none), found once per task: a per-tile test over the rows cost 10% of flash_amx's time.
inline Interval common_keys(const Scratch& s, int64_t rows) {
  Interval c{0, std::numeric_limits<int64_t>::max()};
  for (int64_t rr = 0; rr < rows; ++rr) c.lo = std::max(c.lo, s.iv[rr].lo), c.hi = std::min(c.hi, s.iv[rr].hi);
  return c;
}
// Whether every row of the task sees every key of the tile (and the tile has all kTileKeys
// keys): then a wide step or the AMX blocks may run it (no row multiplies a V row it does not
// see). common: common_keys (the interval path).
template <bool Words>
bool whole_tile(const Interval& common, const TileRef& r) {
  if (r.nk != kTileKeys) return false;
  if constexpr (Words) return r.words == nullptr;  // (the gathered tile always has words)
  return common.lo <= r.j0 && common.hi >= r.j0 + kTileKeys;
}

// The whole tiles x, x + 1, ... of a task that one wide step takes (up to `wide`, consecutive
// keys, each seen whole by every row: whole_tile; not the gathered tile): how many (1: none but x).
template <bool Words, class At>
int wide_run(int wide, const Interval& common, int64_t x, int64_t n, const At& at) {
  const TileRef first = at(x);
  if (wide < 2 || first.k || !whole_tile<Words>(common, first)) return 1;
  int g = 1;
  while (g < wide && x + g < n) {
    const TileRef r = at(x + g);
    if (r.k || r.j0 != first.j0 + g * kTileKeys || !whole_tile<Words>(common, r)) break;
    ++g;
  }
  return g;
}

// The AMX tile steps (amx_prepacked_tiles and what it calls): their own file, this unit's code.
#include "cpu/engine/tiles_amx.hpp"  // inside the anonymous namespace: it calls the steps above

// The head's shared packed K^T tile r (Tiling::kt_shared, prepare_kt), or nullptr: none, or r is
// the gathered tile or starts mid-tile (then the task packs it into s.kt).
inline const float* shared_kt(const Tiling& t, const Scratch& s, int64_t b, int64_t hk, const TileRef& r) {
  if (!s.kts || r.k || r.j0 % kTileKeys != 0) return nullptr;
  return s.kts + kt_at(t, b * t.kv_heads + hk, r.j0) / sizeof(float);
}

// Tiles x .. x + g - 1 of a task in one wide step per panel (wide_run's run: consecutive whole
// tiles): their K^T packed side by side, then process_wide on every panel,
// the next g tiles' K and V rows prefetched a slice per panel (as the tile-by-tile loop does
// for its next tile).
template <bool Pairs, class E, class At>
void attend_wide(const TypedInputs<E>& in, const Tiling& t, const Scratch& s, int64_t b, int64_t hk, int64_t rows,
                 int64_t x, int g, int64_t n, const At& at) {
  const int64_t d = t.dim, dv = t.dim_v;
  KeyTile<E> kts[kWideTiles], ahead[kWideTiles];
  bool one_run = true;  // V's rows of all g tiles one run (a contiguous cache)
  const float* kt = shared_kt(t, s, b, hk, at(x));
  // flash_bf16: its V pairs too, from the shared tiles (after the head's K^T pairs) or packed here
  const uint32_t* vp = Pairs && kt ? reinterpret_cast<const uint32_t*>(reinterpret_cast<const std::byte*>(s.kts) +
                                                                       vp_at(t, b * t.kv_heads + hk, at(x).j0))
                                   : s.vp;
  for (int i = 0; i < g; ++i) {
    kts[i] = key_tile(in, t, b, hk, at(x + i));
    if constexpr (Pairs) {
      if (!kt) {
        pack_k_pairs(kts[i].k, kTileKeys, d, reinterpret_cast<uint32_t*>(s.kt) + i * padded_words(d) * kTileKeys);
        pack_v_pairs(kts[i].v, kTileKeys, dv, s.vp + i * (kTileKeys / 2) * t.dim_v_pad, t.dim_v_pad);
      }
    } else if (!kt && !t.i8_prefill) {  // (flash_int8's key tiles are rounded once per run)
      pack_k_transposed(kts[i].k, kTileKeys, d, s.kt + i * t.dim_pad * kTileKeys);
    }
    one_run = one_run && kts[i].v.runs == 1 && kts[i].v.at[0] == kts[0].v.at[0] + i * kTileKeys * kts[0].v.ld;
  }
  const Rows<E> v = Rows<E>::strided(kts[0].v.at[0], kts[0].v.ld, g * kTileKeys);
  int na = 0;
  for (int64_t y = x + g; y < n && na < g; ++y) ahead[na++] = key_tile(in, t, b, hk, at(y));
  const int64_t panels = (rows + kPanelRows - 1) / kPanelRows;
  for (int64_t pi = 0; pi < panels; ++pi) {
    for (int i = 0; i < na; ++i) prefetch_slice(ahead[i], pi, panels, d, dv);
    const int64_t rr0 = pi * kPanelRows;
    with_panel_rows(static_cast<int>(std::min<int64_t>(kPanelRows, rows - rr0)), [&]<int M>() {
      process_wide<M, Pairs>(t, s, rr0, kt ? kt : s.kt, kts, g, one_run ? &v : nullptr, vp);
    });
  }
}

// Tiles at(0) .. at(n - 1) of a task, in that order.
template <bool Words, bool Pairs, class E, class At>
void attend_tiles(const TypedInputs<E>& in, const Tiling& t, const Scratch& s, int64_t b, int64_t hk, int64_t rows,
                  int64_t n, const At& at) {
  const int64_t d = t.dim, dv = t.dim_v;
  const int64_t panels = (rows + kPanelRows - 1) / kPanelRows;
  // Next-tile prefetching. Many rows (prefill): the next tile's K and V rows a slice per
  // panel, so they arrive in L2 while this tile computes. Few rows (decode: R / 2 FLOP per
  // K/V element): too little compute per panel to hide a burst, so the first tile is read
  // in address order (touch_rows) and the next tile's lines are prefetched as many per
  // inner-loop step of the GEMMs as the step loads (LineStream), spread over the whole tile's
  // compute (measured on Zen 3, q_len 1, 32/8, d 128: 0.45-0.55 -> 0.52-0.72 of the read
  // bandwidth), into L1 or L2 by Tiling::stream_l2.
  // Only a direct task (Tiling::direct: rows <= kDirectRows, decode_i8 kStreamRows) streams; it scores straight from
  // the K rows (score_rows: no K^T packing). A flash task's short last query tile prefetches
  // by slices as the others do: one streaming engine per element type, not two (the tile
  // engine's instantiations are most of the build's compile time).
  const bool stream = s.qr != nullptr;
  // Wide steps (process_wide): flash's float32, flash_bf16's and flash_int8's panels (not a direct
  // task, decode_i8's or an int8 task whose Q did not round).
  const int wide = !stream && (!s.i8 || (t.i8_prefill && s.i8_on())) ? t.wide : 1;
  const Interval common = t.amx || wide > 1 ? common_keys(s, rows) : Interval{};
  bool prepacked = false;
  if constexpr (kAmxBuilt) {
    prepacked = t.amx && s.pairs && (Pairs || (t.i8_prefill && s.i8_on()));
    if (prepacked) amx_prepacked_tiles<Words>(t, s, b, hk, rows, n, at);
  }
  for (int64_t x = 0; x < n; ++x) {
    const TileRef tile = at(x);
    if constexpr (kAmxBuilt) {
      if (prepacked && amx_runs<Words>(t, amx_head(t, s, b, hk), common, tile)) continue;  // done above
    }
    if (const int g = wide_run<Words>(wide, common, x, n, at); g > 1) {
      attend_wide<Pairs>(in, t, s, b, hk, rows, x, g, n, at);
      x += g - 1;
      continue;
    }
    const KeyTile<E> kt = key_tile(in, t, b, hk, tile);
    if (stream && x == 0) {
      touch_rows(kt.k, kt.nk, d);
      touch_rows(kt.v, kt.nk, dv);
    }
    if constexpr (Pairs) {
      pack_k_pairs(kt.k, kt.nk, d, reinterpret_cast<uint32_t*>(s.kt));
      pack_v_pairs(kt.v, kt.nk, dv, s.vp, t.dim_v_pad);
    }
    // The tile's K^T: the head's shared one (the panels read it through a copy of s), else packed here.
    Scratch st = s;
    if constexpr (!Pairs) {
      if (const float* shared = shared_kt(t, s, b, hk, tile)) {
        st.kt = const_cast<float*>(shared);                // (read only: score_panel)
      } else if (!s.qr && !(t.i8_prefill && s.i8_on())) {  // flash_int8's key tiles are packed once per run
        pack_k_transposed(kt.k, kt.nk, d, s.kt);
      }
    }
    const TileRef next = x + 1 < n ? at(x + 1) : TileRef{};
    const int nn = next.nk;
    const KeyTile<E> kn = nn > 0 ? key_tile(in, t, b, hk, next) : KeyTile<E>{};
    if constexpr (Pairs && kAmxBuilt) {
      if (t.amx && whole_tile<Words>(common, tile)) {
        prefetch_rows(kn.k, 0, nn, d);
        prefetch_rows(kn.v, 0, nn, dv);
        amx_tile_bf16(t, s, rows, reinterpret_cast<const uint32_t*>(s.kt), s.vp);
        continue;
      }
    }
    if constexpr (!Pairs && kAmxInt8Built &&
                  std::is_same_v<E, float>) {  // flash_int8_amx: whole tiles on the tile unit
      if (t.amx && s.i8_on() && whole_tile<Words>(common, tile)) {
        pack_v_pairs(kt.v, kt.nk, dv, s.vp, t.dim_v_pad);
        prefetch_rows(kn.k, 0, nn, d);
        prefetch_rows(kn.v, 0, nn, dv);
        amx_tile_i8(t, s, rows, i8_key_tile(t, i8_task_head(s), kt.j0));
        continue;
      }
    }
    if constexpr (!Pairs) {
      if (stream) {
        LineStream ahead(kn.k, d, kn.v, dv, nn, t.stream_l2);
        // Panels of kDotRows rows past one panel: score_rows works kDotRows rows at a time, so 6-row
        // panels scored 8 rows of which 2 were zero (16 rows: 24) and read V once per 6 rows, not 4.
        // Measured against 6-row panels (build/attn_ab_switch decode, 32/4 (GQA 8), d 128, 32k keys, 2
        // threads, Zen 4 avx512, paired): decode f32 1.19x, u8 1.18x; decode_i8 u8 1.28x, q4_0 1.17x;
        // at GQA 16 decode_i8 u8 1.23x, q4_0 1.08x.
        const int64_t ph = rows <= kPanelRows ? kPanelRows : std::min(kPanelRows, kDotRows);
        const Scratch sp = rows > ph ? prep_i8_tile(t, s, kt, rows > 2 * ph) : s;  // 2 panels or more
        const auto panels_on = [&](const auto& tile_rows) {
          for (int64_t rr0 = 0; rr0 < rows; rr0 += ph) {
            const int mr = static_cast<int>(std::min<int64_t>(ph, rows - rr0));
            process_panel_any<true, Words, false>(mr, t, sp, rr0, tile_rows, tile.words, ahead);
          }
        };
        if constexpr (kE4m3Finite<E>) {
          if (e4m3_finite(kt.k, kt.nk, d) && e4m3_finite(kt.v, kt.nk, dv)) {
            panels_on(finite_rows(kt));
            continue;
          }
        }
        panels_on(kt);
        continue;
      }
    }
    NoStep none;
    for (int64_t pi = 0; pi < panels; ++pi) {
      prefetch_slice(kn, pi, panels, d, dv);
      const int64_t rr0 = pi * kPanelRows;
      process_panel_any<false, Words, Pairs>(static_cast<int>(std::min<int64_t>(kPanelRows, rows - rr0)), t, st, rr0,
                                             kt, tile.words, none);
    }
  }
}

// attend_tiles with the tiling's arithmetic: bf16 pairs (flash_bf16: bf16 inputs only, and only
// in a target with AVX512_BF16) or float32.
template <bool Words, class E, class At>
void attend_tiles_as(const TypedInputs<E>& in, const Tiling& t, const Scratch& s, int64_t b, int64_t hk, int64_t rows,
                     int64_t n, const At& at) {
  if constexpr (kPairsBuilt && std::is_same_v<E, bf16>) {
    if (t.bf16_dot) return attend_tiles<Words, true>(in, t, s, b, hk, rows, n, at);
  }
  attend_tiles<Words, false>(in, t, s, b, hk, rows, n, at);
}

// f(TypedInputs<E>) with E the stored K/V rows' type: in.dtype's (visit_inputs), or Quant<T>
// for a quantized cache (its rows read in registers, kv_load.hpp; only K and V are set: Q,
// float32, is packed by begin_rows).
template <KvDType T>
TypedInputs<Quant<T>> quant_inputs(const Inputs& in) {
  return {{}, retype<Quant<T>>(in.kq), retype<Quant<T>>(in.vq), in.pages};
}
template <class F>
void visit_kv(const Inputs& in, F&& f) {
  if (in.kv == KvDType::Same) return visit_inputs(in, f);
  if constexpr (kBf16Object) {  // its kernels (flash_bf16, flash_amx) take bf16 inputs only: no Quant<T> engine here
    throw std::logic_error("tile engine: the bf16-product kernels do not read a quantized cache");
  } else {
    if (in.kv_scale != 1.0f) {
      throw std::invalid_argument(
          "kv_scale: the SIMD kernels read an fp8 cache whose per-tensor scale is 1 (the lab "
          "writes 1); got " +
          std::to_string(in.kv_scale) + " - naive reads any scale");
    }
    switch (in.kv) {
      case KvDType::Q8_0: return f(quant_inputs<KvDType::Q8_0>(in));
      case KvDType::Q4_0: return f(quant_inputs<KvDType::Q4_0>(in));
      case KvDType::U8: return f(quant_inputs<KvDType::U8>(in));
      case KvDType::U4: return f(quant_inputs<KvDType::U4>(in));
      case KvDType::Fp8E4M3: return f(quant_inputs<KvDType::Fp8E4M3>(in));
      case KvDType::Fp8E5M2: return f(quant_inputs<KvDType::Fp8E5M2>(in));
      case KvDType::Same: break;
    }
  }
}

}  // namespace

Tiling make_tiling(const Problem& p, int64_t br, bool bf16_dot, bool amx, bool int8_dot, bool int8_prefill) {
  if (bf16_dot && (!kPairsBuilt || p.dtype != DType::BF16)) {
    throw std::logic_error("make_tiling: bf16 dot products need bf16 inputs and a target with AVX512_BF16");
  }
  if (amx && !((bf16_dot && kAmxBuilt) || (int8_prefill && kAmxInt8Built)))
    throw std::logic_error(
        "make_tiling: AMX needs bf16_dot (AMX-BF16) or int8_prefill (AMX-INT8) in a target with them");
  Tiling t;
  t.group = p.group();
  t.dim = p.head_dim;
  t.dim_pad = padded_dim(p.head_dim);
  t.dim_v = p.dim_v();
  t.dim_v_pad = padded_dim(t.dim_v);
  const int64_t fixed = kTileKeys * (t.dim_pad + t.dim_v_pad) * int64_t{sizeof(float)};
  const int64_t per_row = (t.dim_pad + t.dim_v_pad + 2) * int64_t{sizeof(float)};
  // The rows' packed Q and accumulators and one K/V tile in 3/4 of the running machine's L2
  // (isa.hpp); the rest holds the next tile's prefetched rows and the panel buffers.
  const int64_t budget = planning_l2_bytes() * 3 / 4;
  const int64_t fit = budget > fixed ? (budget - fixed) / per_row / t.group : 0;
  if (br > 0) {
    t.br = std::min(br, p.q_len);
  } else {
    // The L2 bound, the task floor, then equal tiles: q_len 512 under a 120-row bound is 5
    // tiles of 108 rows (the last 80), not 4 x 120 + 32 - the short last tile idles a core at
    // the end.
    int64_t cap = std::clamp(fit / kRowStep * kRowStep, kRowStep, amx ? kAmxMaxRows : kMaxRows);
    const auto tasks = [&](int64_t rows) { return p.batch * p.kv_heads * ((p.q_len + rows - 1) / rows); };
    while (cap - kRowStep >= kTaskRows && tasks(cap) < kMinTasks) cap -= kRowStep;
    const int64_t tiles = (p.q_len + cap - 1) / cap;
    const int64_t even = (p.q_len + tiles - 1) / tiles;
    t.br = std::min({cap, (even + kPanelRows - 1) / kPanelRows * kPanelRows, p.q_len});
  }
  t.rows = t.group * t.br;
  size_t off = 0;
  auto take = [&off](size_t bytes) {
    const size_t at = off;
    off += align64(bytes);
    return at;
  };
  // AMX blocks run whole 16-row blocks: the rows past R are zero Q rows whose state is never read.
  const int64_t state_rows = amx ? amx_rows(t.rows) : t.rows, panel_rows = amx ? kAmxRows : kPanelRows;
  t.direct = !bf16_dot && !int8_prefill && t.rows <= (int8_dot ? kStreamRows : kDirectRows);
  t.wide = !amx && !int8_dot && !t.direct ? kWideTiles : 1;  // flash's, flash_bf16's and flash_int8's panels
  t.q_off = take(sizeof(float) * t.rows * t.dim);
  t.o_off = take(sizeof(float) * state_rows * t.dim_v_pad);
  t.kt_off = take(sizeof(float) * t.dim_pad * kTileKeys * (int8_prefill ? 1 : t.wide));  // (flash_int8's are shared)
  t.p_off = take(sizeof(float) * panel_rows * (amx ? kAmxGroupKeys : t.wide > 1 ? kWideKeys : kTileKeys));
  t.m_off = take(sizeof(float) * state_rows);
  t.l_off = take(sizeof(float) * state_rows * kLanes);
  t.iv_off = take(sizeof(Interval) * t.rows);
  // A direct task's next tile goes to L1 when it fits there beside the one being read, else to L2
  // (where L1 would evict the current tile's lines before they are used): paired A/B at 32/8,
  // d 128, 32k keys - float32 1.15x (avx512) and 1.17x (avx2) from L2, bf16 1.05x / 1.11x; a u8
  // cache through decode_i8 (17 KiB tiles) 1.07x from L1 (results/2026-12-04-kv_cache).
  const int64_t l1 = cache().l1d > 0 ? cache().l1d : int64_t{32} << 10;
  t.stream_l2 = 2 * kTileKeys * (p.kv_row_bytes(t.dim) + p.kv_row_bytes(t.dim_v)) > l1;
  t.bf16_dot = bf16_dot;
  t.score_scale = p.effective_scale() * kLog2e;
  if (bf16_dot || amx) {  // (flash_int8_amx's P.V is on bf16 pairs too)
    t.vp_off = take(sizeof(uint32_t) * (kTileKeys / 2) * t.dim_v_pad * t.wide);
    t.pw_off = take(sizeof(uint32_t) * panel_rows * (amx ? kAmxGroupKeys : t.wide > 1 ? kWideKeys : kTileKeys) / 2);
  }
  t.amx = amx;
  if (amx) t.qa_off = take(sizeof(uint32_t) * state_rows * padded_words(t.dim));
  if (amx) {  // the tiles packed once per run (amx_prepacked_tiles): K^T pairs (flash_amx), V pairs
    t.pairs_v_off = bf16_dot ? align64(sizeof(uint32_t) * padded_words(t.dim) * kTileKeys) : 0;
    t.pairs_flag_off = t.pairs_v_off + align64(sizeof(uint32_t) * (kTileKeys / 2) * t.dim_v_pad);
    t.pairs_tile = t.pairs_flag_off + 64;
    t.pairs_head = t.pairs_tile * static_cast<size_t>(p.kv_len / kTileKeys);
    t.pairs_shared = t.pairs_head * static_cast<size_t>(p.batch * p.kv_heads);
    t.kv_heads = p.kv_heads;
  }
  if (t.direct) t.qr_off = take(sizeof(float) * (t.rows + 1) * t.dim_pad);
  if (int8_dot) {
    if (!t.direct || !p.kv_quantized() || !kv_int_dot(p.kv_dtype) || p.dtype != DType::F32) {
      throw std::logic_error(
          "make_tiling: int8 dot products need a direct task, a float32 Q and a q8_0, q4_0, u8 or u4 cache");
    }
    t.int8_dot = true;
    t.i8_vnni = i8_dot_unit_runs();
    t.i8_pv = i8_pv_runs(t.i8_vnni);
    t.i8_row = I8Layout(t.dim).row;
    t.i8_off = take(64 + static_cast<size_t>((t.rows + 1) * t.i8_row));
    if (kI8Vector && t.rows > kPanelRows) {  // 2 panels or more (attend_tiles)
      t.i8_prep_v = align64(key_words_bytes(p.kv_dtype, t.dim));
      t.i8_prep_off = take(t.i8_prep_v + static_cast<size_t>(v_word_bytes(t.dim_v)) +
                           sizeof(float) * static_cast<size_t>(v_scale_floats(p.kv_dtype, t.dim_v)));
    }
  }
  if (int8_prefill) {
    if (p.kv_quantized() || p.dtype != DType::F32 || bf16_dot || int8_dot) {
      throw std::logic_error("make_tiling: int8 prefill needs a dense float32 problem");
    }
    t.i8_prefill = true;
    t.i8_vnni = i8_vnni_runs();
    const I8KeyTile l(t.dim);
    t.i8_off = take(64);
    t.i8_qw_off = take(sizeof(int32_t) * static_cast<size_t>(t.rows * l.words)) - t.i8_off;
    t.i8_qsc_off = take(sizeof(float) * static_cast<size_t>(state_rows)) - t.i8_off;
    t.i8_c_off = take(sizeof(float) * static_cast<size_t>(state_rows)) - t.i8_off;
    const int64_t tiles = (p.kv_len + kTileKeys - 1) / kTileKeys;
    t.i8_head = 64 + align64(sizeof(float) * static_cast<size_t>(t.dim)) + static_cast<size_t>(tiles) * l.bytes;
    // P.V in integers: vpdpbusd only (vpmaddubsw's int16 pairs overflow at P's 255 levels); the
    // AMX kernel's whole tiles take bf16 pairs instead.
    t.i8_pv = !amx && kI8Vector && t.i8_vnni && i8_pv_runs(true);
    if (t.i8_pv) {
      t.i8_v_off = t.i8_head;
      t.i8_head += align64(sizeof(float) * static_cast<size_t>(t.dim_v_pad)) +
                   static_cast<size_t>(tiles) * I8ValueTile(t.dim_v_pad).bytes;
    }
    t.i8_shared = t.i8_head * static_cast<size_t>(p.batch * p.kv_heads);
  }
  if (gathered_columns(p) > 0) {  // rows of the stored type: dim_pad values, or a quantized row's bytes
    const int64_t elem = p.kv_quantized() ? 1 : dtype_bytes(p.dtype);
    t.gather_ldk = p.kv_quantized() ? p.kv_row_bytes(t.dim) : t.dim_pad;
    t.gather_ldv = p.kv_quantized() ? p.kv_row_bytes(t.dim_v) : t.dim_v_pad;
    t.gather_v_off = align64(static_cast<size_t>(kTileKeys * t.gather_ldk * elem));
    t.gather_off = take(t.gather_v_off + static_cast<size_t>(kTileKeys * t.gather_ldv * elem));
  }
  const int64_t tiles = (p.kv_len + kTileKeys - 1) / kTileKeys, query_tiles = (p.q_len + t.br - 1) / t.br;
  const size_t kt_head = sizeof(float) * static_cast<size_t>(tiles * kt_tile_words(t) +
                                                             (bf16_dot ? tiles * kTileKeys / 2 * t.dim_v_pad : 0));
  if (br == 0 && t.wide > 1 && !int8_prefill && !p.sparse() && query_tiles > 1 &&
      kt_head * static_cast<size_t>(p.batch * p.kv_heads) <= Tiling::kMaxSharedKt) {
    t.kv_heads = p.kv_heads;
    t.kt_head = kt_head;
    t.kt_tiles = tiles;
    t.kt_shared = kt_head * static_cast<size_t>(p.batch * p.kv_heads);
  }
  t.softcap2 = p.softcap * kLog2e;
  t.alibi = p.has_alibi();
  if (t.alibi) t.mod_off = take(align64(sizeof(float) * t.rows) + sizeof(int64_t) * static_cast<size_t>(t.rows));
  t.bytes = off;
  return t;
}

Support alibi_support(const Problem& p, std::string_view kernel) {
  if (!p.has_alibi()) return Support::yes();
  if (gathered_columns(p) > 0) {
    return Support::no("alibi with global positions: " + std::string(kernel) +
                       " scores their columns as one gathered tile, whose keys are not consecutive; naive runs it");
  }
  if (p.dilation > 1 && kernel == "flash") {
    return Support::no("alibi with dilation " + std::to_string(p.dilation) +
                       ": flash runs a dilated window as strided phases; naive and decode run it");
  }
  return Support::yes();
}

Scratch::Scratch(std::byte* base, const Tiling& t, std::byte* shared)
    : q(reinterpret_cast<float*>(base + t.q_off)),
      o(reinterpret_cast<float*>(base + t.o_off)),
      kt(reinterpret_cast<float*>(base + t.kt_off)),
      p(reinterpret_cast<float*>(base + t.p_off)),
      m(reinterpret_cast<float*>(base + t.m_off)),
      l(reinterpret_cast<float*>(base + t.l_off)),
      iv(reinterpret_cast<Interval*>(base + t.iv_off)),
      qr(t.direct ? reinterpret_cast<float*>(base + t.qr_off) : nullptr),
      gather(t.gather_off ? reinterpret_cast<float*>(base + t.gather_off) : nullptr),
      vp(t.bf16_dot || t.amx ? reinterpret_cast<uint32_t*>(base + t.vp_off) : nullptr),
      pw(t.bf16_dot || t.amx ? reinterpret_cast<uint32_t*>(base + t.pw_off) : nullptr),
      qa(t.amx ? reinterpret_cast<uint32_t*>(base + t.qa_off) : nullptr),
      i8(t.int8_dot || t.i8_prefill ? base + t.i8_off : nullptr),
      i8_keys(t.i8_prefill ? shared : nullptr),
      i8_prep(t.i8_prep_off ? base + t.i8_prep_off : nullptr),
      pairs(t.pairs_shared && shared ? shared + t.i8_shared : nullptr),
      kts(t.kt_shared && shared ? reinterpret_cast<const float*>(shared + t.i8_shared + t.pairs_shared) : nullptr),
      slope2(t.alibi ? reinterpret_cast<float*>(base + t.mod_off) : nullptr),
      diag(t.alibi ? reinterpret_cast<int64_t*>(base + t.mod_off + align64(sizeof(float) * t.rows)) : nullptr),
      softcap2(t.softcap2) {
  if (t.i8_prefill && !shared) throw std::logic_error("tile engine: int8 prefill without its shared key tiles");
}

AmxScope::AmxScope(const Tiling& t) : on(t.amx) {
  if constexpr (kAmxBuilt) {
    if (on) amx_configure();
  }
}

AmxScope::~AmxScope() {
  if constexpr (kAmxBuilt) {
    if (on) amx_release();
  }
}

int64_t begin_rows(const Problem& p, const Inputs& in, const Tiling& t, const Scratch& s, int64_t b, int64_t hk,
                   RowPositions at, int64_t nr) {
  const int64_t G = t.group, dp = t.dim_v_pad;
  const int64_t R = nr * G;
  const MaskSpec mask = p.mask_for_batch(b);
  for (int64_t r = 0; r < nr; ++r) std::fill_n(s.iv + r * G, G, mask.row(at[r]));
  if (s.slope2) {  // ALiBi: row rr = r * G + g is head hk * G + g at position at[r]
    for (int64_t rr = 0; rr < R; ++rr) {
      s.slope2[rr] = p.alibi_slope(hk * G + rr % G) * kLog2e;
      s.diag[rr] = mask.pos(at[rr / G]);
    }
  }

  visit_inputs(in, [&](const auto& typed) { pack_rows(p, typed, t, s, b, hk, at, R); });
  const int64_t state = t.amx ? amx_rows(R) : R;  // an AMX block's padding rows too
  std::fill(s.o, s.o + state * dp, 0.f);
  std::fill(s.m, s.m + state, kNegInf);
  std::fill(s.l, s.l + state * kLanes, 0.f);
  return R;
}

namespace {
// attend_keys' and attend_pages' tile x: the span's x-th 64 keys, or page pages[x] (keys up to span.hi) -
// one type, so the tile engine is instantiated once for both (a second type doubled attend_tiles' code
// for every element type and target: the GPU bundle grew past its 60 MiB).
struct TilesAt {
  Interval span;
  const int64_t* pages;
  TileRef operator()(int64_t x) const {
    const int64_t j0 = pages ? pages[x] * kTileKeys : span.lo + x * kTileKeys;
    return TileRef{j0, static_cast<int>(std::min<int64_t>(kTileKeys, span.hi - j0)), nullptr};
  }
};
}  // namespace

void attend_keys(const Problem& p, const Inputs& in, const Tiling& t, const Scratch& s, int64_t b, int64_t hk,
                 int64_t rows, Interval keys) {
  // Key tiles inside keys and the union of the rows' visible intervals.
  Interval span{keys.hi, keys.lo};
  for (int64_t rr = 0; rr < rows; rr += t.group) {
    if (s.iv[rr].empty()) continue;
    span.lo = std::min(span.lo, s.iv[rr].lo), span.hi = std::max(span.hi, s.iv[rr].hi);
  }
  span.lo = std::max(span.lo, keys.lo), span.hi = std::min(span.hi, keys.hi);
  if (span.empty()) return;
  // flash_int8's key tiles are the sequence's 64-key tiles: the task's start at one's start
  // (the rows' intervals still mask the keys before theirs).
  // So are flash_amx's packed tiles, and flash's shared K^T tiles.
  if (t.i8_prefill || s.pairs || s.kts) span.lo = std::max(keys.lo, span.lo / kTileKeys * kTileKeys);
  const int64_t n = (span.size() + kTileKeys - 1) / kTileKeys;
  visit_kv(in, [&](const auto& typed) { attend_tiles_as<false>(typed, t, s, b, hk, rows, n, TilesAt{span, nullptr}); });
}

void attend_pages(const Problem& p, const Inputs& in, const Tiling& t, const Scratch& s, int64_t b, int64_t hk,
                  int64_t rows, const int64_t* pages, int64_t n) {
  static_assert(kTileKeys == kSummaryPageKeys, "a summary's page is one key tile");
  const TilesAt at{{0, p.kv_len_of(b)}, pages};
  if (n > 0) visit_kv(in, [&](const auto& typed) { attend_tiles_as<false>(typed, t, s, b, hk, rows, n, at); });
}

void attend_blocks(const Problem& p, const Inputs& in, const Tiling& t, const Scratch& s, const BlockMap& map,
                   int64_t b, int64_t hk, int64_t qt, RowPositions pos, int64_t rows, Interval keys) {
  // The block map decides which rows are fully masked (begin_rows set the interval part only).
  const int64_t v = map.variant(b, hk), lk = p.kv_len_of(b), G = t.group;
  const uint8_t* empty = map.row_empty.data() + v * p.q_len * G;
  const bool tile = qt < map.query_tiles;
  for (int64_t rr = 0; rr < rows; ++rr) {
    const int64_t i = pos[rr / G];
    s.iv[rr] = tile && map.skip(i) ? kNotThisTask : empty[i * G + rr % G] ? Interval{0, 0} : Interval{0, lk};
  }
  // Not a structured binding: clang 14 cannot capture one in the lambda below.
  const std::pair<const BlockMap::Entry*, const BlockMap::Entry*> range = map.entries_in(v, qt, keys.lo, keys.hi);
  const BlockMap::Entry* e = range.first;
  const int64_t n = range.second - e;
  // Then the gathered tile (BlockMap::gathered), when some row of this tile sees one of its keys.
  const int64_t gw = map.gathered.empty() ? -1 : map.gathered_words[v * map.tiles() + qt];
  const int64_t ng = gw >= 0 && keys.lo == 0 && lk > 0 ? 1 : 0;  // (an empty sequence has no key to gather)
  const auto ngk = static_cast<int64_t>(map.gathered.size());
  std::byte* const gk = reinterpret_cast<std::byte*>(s.gather);
  std::byte* const gv = s.gather ? gk + t.gather_v_off : nullptr;
  const auto at = [&](int64_t x) {
    if (x == n) return TileRef{0, static_cast<int>(ngk), map.bits.data() + gw, gk, gv};
    const int64_t j0 = e[x].key_tile * kTileKeys;
    int nk = static_cast<int>(std::min<int64_t>(kTileKeys, lk - j0));
    const uint64_t* words = e[x].words < 0 ? nullptr : map.bits.data() + e[x].words;
    if (words) {  // a partial tile ends at the last key some row sees (sinks: 4 of 64 keys)
      uint64_t seen = 0;
      for (int64_t rr = 0; rr < rows; ++rr) seen |= words[rr];
      nk = std::min(nk, std::max(1, 64 - std::countl_zero(seen)));
    }
    return TileRef{j0, nk, words};
  };
  visit_kv(in, [&](const auto& typed) {
    if (ng) {  // the gathered K and V rows as stored, gather_ldk / gather_ldv elements apart (padding zero)
      using E = std::remove_const_t<std::remove_pointer_t<decltype(typed.k.data)>>;
      E* const k = reinterpret_cast<E*>(gk);
      E* const vv = reinterpret_cast<E*>(gv);
      const int64_t kb = row_bytes<E>(t.dim), vb = row_bytes<E>(t.dim_v);
      for (int64_t x = 0; x < ngk; ++x) {
        const int64_t j = std::min(map.gathered[x], lk - 1);  // a key past lk: no row sees it
        auto* kr = reinterpret_cast<std::byte*>(k + x * t.gather_ldk);
        auto* vr = reinterpret_cast<std::byte*>(vv + x * t.gather_ldv);
        std::memcpy(kr, kv_row(typed.k, typed.pages, b, hk, j), static_cast<size_t>(kb));
        std::memcpy(vr, kv_row(typed.v, typed.pages, b, hk, j), static_cast<size_t>(vb));
        std::fill(kr + kb, kr + t.gather_ldk * int64_t{sizeof(E)}, std::byte{0});
        std::fill(vr + vb, vr + t.gather_ldv * int64_t{sizeof(E)}, std::byte{0});
      }
    }
    attend_tiles_as<true>(typed, t, s, b, hk, rows, n + ng, at);
  });
}

float row_sum(const Scratch& s, int64_t rr) { return reduce_sum(Batch::load_aligned(s.l + rr * kLanes)); }

void finish_rows(const Problem& p, const Outputs& out, const Tiling& t, const Scratch& s, int64_t b, int64_t hk,
                 RowPositions at, int64_t rows, const LseRows* lse_rows) {
  // A row whose interval is empty gets O = 0, LSE = -inf (a sink logit's: b); the others acc / l and
  // m + log l (NaN when l is 0 or NaN, as in the reference).
  for (int64_t rr = 0; rr < rows; ++rr) {
    if (s.iv[rr].lo == kNotThisTask.lo) continue;  // a solo position's row: its own task writes it
    const int64_t h = hk * t.group + rr % t.group, i = at[rr / t.group];
    const float l = row_sum(s, rr);
    // (a sink logit: one more term of l, online_softmax.hpp's rule 6)
    const online_softmax::Finish f =
        online_softmax::finish<kLog2>(s.iv[rr].empty(), s.m[rr], l, p.sink_logit(h) * kLog2e);
    scale_row(s.o + rr * t.dim_v_pad, f.out_scale, t.dim_v, out.o.row(b, h, i));
    float* lse = lse_rows ? (lse_rows->base ? lse_rows->base + h * lse_rows->head_stride + i * lse_rows->step : nullptr)
                 : out.lse ? out.lse + (b * p.q_heads + h) * p.q_len + i
                           : nullptr;
    if (lse) *lse = f.lse;
  }
}

void prepare_i8_keys(const Problem& p, const Inputs& in, const Tiling& t, std::byte* shared) {
  const I8KeyTile l(t.dim);
  attnlab::parallel_tasks(
      TaskRange(0, p.batch * p.kv_heads, 1),
      [&](const TaskRange& range) {
        int8_t codes[Problem::kMaxHeadDim];
        std::vector<int8_t> vcodes;
        for (int64_t bh = range.begin(); bh != range.end(); ++bh) {
          const int64_t b = bh / p.kv_heads, hk = bh % p.kv_heads, n = p.kv_len_of(b);
          std::byte* head = i8_head_area(t, shared, p.kv_heads, b, hk);
          std::memset(head, 0, t.i8_head);  // keys past n: zero codes (masked, never read unmasked)
          auto* mean = reinterpret_cast<float*>(head + 64);
          bool ok = key_mean(in.k.row(b, hk, 0), in.k.stride_s, n, t.dim, mean);
          for (int64_t j = 0; j < n && ok; ++j) {
            float scale = 0.f;
            ok = round_smoothed_row(in.k.row(b, hk, j), mean, t.dim, codes, &scale);  // round_smoothed_key's rule
            auto* tile = const_cast<std::byte*>(i8_key_tile(t, head, j / kTileKeys * kTileKeys));
            put_i8_key(l, tile, static_cast<int>(j % kTileKeys), codes, t.dim, scale);
          }
          head[0] = std::byte{ok ? uint8_t{1} : uint8_t{0}};  // else its tasks multiply in float32
          if (t.i8_pv) {  // V per channel (round_v_channels' rule), else its whole tiles' P.V in float32
            auto* vs = reinterpret_cast<float*>(head + t.i8_v_off);
            vcodes.resize(static_cast<size_t>(n * t.dim_v));
            const bool v_ok = round_v_rows(in.v.row(b, hk, 0), in.v.stride_s, n, t.dim_v, vcodes.data(), vs);
            const I8ValueTile vl(t.dim_v_pad);
            for (int64_t j = 0; j < n && v_ok; ++j) {
              auto* tile = const_cast<std::byte*>(i8_value_tile(t, head, j / kTileKeys * kTileKeys));
              put_i8_value(vl, tile, static_cast<int>(j % kTileKeys), vcodes.data() + j * t.dim_v, t.dim_v);
            }
            head[1] = std::byte{v_ok ? uint8_t{1} : uint8_t{0}};
          }
        }
      },
      tbb::simple_partitioner());
}

// flash_amx and flash_int8_amx's packed tiles (kAmxBuilt; elsewhere never asked for).
void prepare_pairs(const Problem& p, const Inputs& in, const Tiling& t, std::byte* area) {
  if constexpr (!kAmxBuilt) {
    (void)p, (void)in, (void)t, (void)area;
  } else {
    visit_inputs(in, [&](const auto& typed) {
      using E = std::remove_const_t<std::remove_pointer_t<decltype(typed.k.data)>>;
      if constexpr (std::is_same_v<E, bf16> || std::is_same_v<E, float>) {
        const int64_t tiles = p.kv_len / kTileKeys;  // whole tiles only (a short one is never run there)
        attnlab::parallel_tasks(
            TaskRange(0, p.batch * p.kv_heads * tiles, 8),
            [&](const TaskRange& range) {
              for (int64_t x = range.begin(); x != range.end(); ++x) {
                const int64_t bh = x / tiles, b = bh / p.kv_heads, hk = bh % p.kv_heads, j0 = x % tiles * kTileKeys;
                if (j0 + kTileKeys > p.kv_len_of(b)) continue;  // past this sequence's keys: never read
                const KeyTile<E> kt = key_tile(typed, t, b, hk, TileRef{j0, static_cast<int>(kTileKeys)});
                std::byte* tile =
                    area + static_cast<size_t>(bh) * t.pairs_head + static_cast<size_t>(x % tiles) * t.pairs_tile;
                if constexpr (std::is_same_v<E, bf16>)
                  pack_k_pairs(kt.k, kt.nk, t.dim, reinterpret_cast<uint32_t*>(tile));
                auto* vp = reinterpret_cast<uint32_t*>(tile + t.pairs_v_off);
                pack_v_pairs(kt.v, kt.nk, t.dim_v, vp, t.dim_v_pad);  // (float32 V: rounded to bf16 here)
                // The values P.V multiplies: a float32 V near FLT_MAX rounds to an Inf.
                const bool finite = words_finite(vp, (kTileKeys / 2) * t.dim_v_pad);
                tile[t.pairs_flag_off] = std::byte{finite ? uint8_t{1} : uint8_t{0}};
              }
            },
            tbb::simple_partitioner());
      }
    });
  }
}

void prepare_kt(const Problem& p, const Inputs& in, const Tiling& t, std::byte* area) {
  visit_kv(in, [&](const auto& typed) {
    using E = std::remove_const_t<std::remove_pointer_t<decltype(typed.k.data)>>;
    const int64_t tiles = t.kt_tiles;
    attnlab::parallel_tasks(
        TaskRange(0, p.batch * p.kv_heads * tiles, 8),
        [&](const TaskRange& range) {
          for (int64_t x = range.begin(); x != range.end(); ++x) {
            const int64_t bh = x / tiles, b = bh / p.kv_heads, hk = bh % p.kv_heads, j0 = x % tiles * kTileKeys;
            const int64_t n = p.kv_len_of(b);
            if (j0 >= n) continue;  // past this sequence's keys: never read
            const KeyTile<E> kt =
                key_tile(typed, t, b, hk, TileRef{j0, static_cast<int>(std::min(kTileKeys * int64_t{1}, n - j0))});
            if constexpr (kPairsBuilt && std::is_same_v<E, bf16>) {
              if (t.bf16_dot) {  // flash_bf16: K^T pairs and V pairs
                pack_k_pairs(kt.k, kt.nk, t.dim, reinterpret_cast<uint32_t*>(area + kt_at(t, bh, j0)));
                pack_v_pairs(kt.v, kt.nk, t.dim_v, reinterpret_cast<uint32_t*>(area + vp_at(t, bh, j0)), t.dim_v_pad);
                continue;
              }
            }
            pack_k_transposed(kt.k, kt.nk, t.dim, reinterpret_cast<float*>(area + kt_at(t, bh, j0)));
          }
        },
        tbb::simple_partitioner());
  });
}

}  // namespace attnlab::ATTN_TARGET_NS::simd
