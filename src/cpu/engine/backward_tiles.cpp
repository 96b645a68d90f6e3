// flash's backward pass: FlashAttention-2's algorithm on the forward's micro-kernels.
//
// Idea: never store the n^2 matrices. The forward left LSE per row, so a tile of P is
// recomputed from Q, K and LSE: P = exp(scale Q K^T - LSE) on the visible pairs, 0 elsewhere.
//   pass 0  D_i = dO_i . O_i for every row (one dot product each); with sink logits their gradient
//           dsink_h = - sum e^(b_h - LSE_i) D_i (backward.hpp), in a fixed order;
//   pass 1  one task per (batch, kv head, 64-key tile) owns that tile's dK and dV: for every
//           query head of the GQA group and every 64-row query tile that sees a key of the tile,
//           S = Q K^T and dP = dO V^T (score_panel_strided: the Q and dO rows as they lie, K^T
//           and V^T packed once per task), P, dS = P (dP - D), dV += P^T dO, dK += scale dS^T Q
//           (pv_rows on the transposed tiles); written once at the end;
//   pass 2  one task per (batch, query head, 64-row query tile) owns its dQ: the same S, P, dP
//           and dS recomputed per visible key tile (its K^T, V^T packed), dQ += scale dS K.
// Score modifications (score_mod.hpp): P from the modified score (softcap, then ALiBi) and dS times
// softcap's slope 1 - tanh^2, per tile element.
// dQ gets its own pass instead of atomics or per-task partials: every output element has one
// owner that sums in a fixed order, so the result is bitwise identical for any thread count, at
// the price of recomputing two of the five GEMMs (7 GEMMs of (d or d_v) x 64 x 64 per tile pair
// against the 5 the 2.5x FLOP convention counts). When there are enough (batch, kv head) pairs to
// keep the threads busy (fused()), one task per pair runs pass 1 over all its key tiles and also
// adds dS K into its own dQ accumulators (group x q_len x d floats): 5 GEMMs, the same sums in the
// same order (add_dq), so the same bits - 1.3-1.4x faster (8/8 heads, d 64 and 128, 2 threads). Masks: a pair outside
// its row's interval contributes nothing (P and dS set to 0 there, never computed as exp(-inf)); tiles no row of the
// query tile sees are skipped. A sparse pattern's tile pairs are classified as the forward's block map does (meet():
// empty skipped, full run as intervals, partial per element by masked_axpys).
// Memory: D (batch * q_heads * q_len floats) plus per thread 4 tiles of 64 x 64 floats and 5 of
// 64 x d(_v): 224 KiB at d 128, and in the fused pass the dQ accumulators (the whole workspace at
// most 64 MiB) - O(n), nothing of n^2.
// Precision: Q, K, V stored as f32, bf16 or f16 are widened exactly where loaded; float32
// compute and accumulation (K, V, dO and float32 Q rows read in place, a bf16 or f16 Q widened into the tile).
#include "cpu/engine/backward_tiles.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <optional>

#include <tbb/blocked_range.h>

#include "attnlab/pattern.hpp"
#include "cpu/engine/parallel.hpp"
#include "cpu/simd/microkernel.hpp"
#include "cpu/simd/vec_math.hpp"

namespace attnlab::ATTN_TARGET_NS::cpu {
namespace {

using simd::Batch;
using simd::kLanes;
using simd::kTileKeys;
using simd::Rows;
constexpr int kBr = 64;  // query rows per tile

struct Layout {
  int64_t dp, dvp;  // head_dim and head_dim_v padded to whole vectors
  size_t q, kt, vt, s, dpm, pt, dst, dk, dv, lse, dd, words, colw, bytes;
  explicit Layout(const Problem& p) : dp(simd::padded_dim(p.head_dim)), dvp(simd::padded_dim(p.dim_v())) {
    size_t off = 0;
    const auto take = [&off](size_t floats) {
      const size_t at = off;
      off += (floats * sizeof(float) + 63) / 64 * 64;
      return at;
    };
    q = take(kBr * dp);
    kt = take(dp * kTileKeys), vt = take(dvp * kTileKeys);
    s = take(kBr * kTileKeys), dpm = take(kBr * kTileKeys), pt = take(kTileKeys * kBr), dst = take(kTileKeys * kBr);
    dk = take(std::max<int64_t>(kTileKeys, kBr) * dp), dv = take(kTileKeys * dvp), lse = take(kBr), dd = take(kBr);
    words = take(2 * kBr), colw = take(2 * kTileKeys);  // uint64_t each
    bytes = off;
  }
};

// One thread's tiles: Q rows widened from bf16 or f16 (float32 Q and dO are read in place), the key
// tile's K^T and V^T (pack_k_transposed), S/P, dP/dS and their transposes, the accumulators;
// a sparse pattern's partial tile pair as words: bit c of words[r] (row r sees key c) and its
// transpose colw (bit r of colw[c]).
struct Tile {
  float *q, *kt, *vt, *s, *dpm, *pt, *dst, *dk, *dv, *lse, *dd;
  uint64_t *words, *colw;
  Tile(std::byte* base, const Layout& l) {
    const auto at = [base](size_t off) { return reinterpret_cast<float*>(base + off); };
    q = at(l.q), kt = at(l.kt), vt = at(l.vt);
    s = at(l.s), dpm = at(l.dpm), pt = at(l.pt), dst = at(l.dst);
    dk = at(l.dk), dv = at(l.dv), lse = at(l.lse), dd = at(l.dd);
    words = reinterpret_cast<uint64_t*>(base + l.words), colw = reinterpret_cast<uint64_t*>(base + l.colw);
  }
};

// How query rows of a tile meet a key tile: not at all (skipped), each row an interval of it
// (iv: the interval masks, or every key - a sparse pattern's full tile), or per element (a
// sparse pattern's partial tile: Tile::words).
enum class Meet { None, Intervals, Elements };

size_t d_bytes(const Problem& p) { return (static_cast<size_t>(p.lse_elems()) * sizeof(float) + 63) / 64 * 64; }

// out[r * kTileKeys + c] = a_r . b_c for the `rows` rows a (ld floats apart; register panels of
// kPanelRows rows read them in place: score_panel_strided) and the tile's keys b (bt: their
// pack_k_transposed), for each panel only on the keys [lo, hi) its rows see (iv, key j0 + c
// is column c); the other columns are left as they were (the epilogue masks them).
void dots(int rows, const float* a, int64_t ld, const float* bt, int64_t dim, const Interval* iv, int64_t j0, int nk,
          float* out) {
  for (int m0 = 0; m0 < rows; m0 += simd::kPanelRows) {
    const int mr = std::min(simd::kPanelRows, rows - m0);
    int ja = nk, jb = 0;
    for (int r = m0; r < m0 + mr; ++r) {
      const int lo = static_cast<int>(std::clamp<int64_t>(iv[r].lo - j0, 0, nk));
      const int hi = static_cast<int>(std::clamp<int64_t>(iv[r].hi - j0, lo, nk));
      if (lo < hi) ja = std::min(ja, lo), jb = std::max(jb, hi);
    }
    if (ja >= jb) continue;
    const float* am = a + m0 * ld;
    float* o = out + m0 * kTileKeys;
    switch (mr) {
      case 1: simd::score_panel_strided<1>(am, ld, bt, dim, ja, jb, o); break;
      case 2: simd::score_panel_strided<2>(am, ld, bt, dim, ja, jb, o); break;
      case 3: simd::score_panel_strided<3>(am, ld, bt, dim, ja, jb, o); break;
      case 4: simd::score_panel_strided<4>(am, ld, bt, dim, ja, jb, o); break;
      case 5: simd::score_panel_strided<5>(am, ld, bt, dim, ja, jb, o); break;
      default: simd::score_panel_strided<simd::kPanelRows>(am, ld, bt, dim, ja, jb, o); break;
    }
  }
}

template <int MR, class E>
void pv(const float* p, int64_t ldp, const Rows<E>& v, float* o, int64_t ldo, int a, int b, int64_t dim) {
  if (a < b) simd::pv_rows<MR>(p, ldp, v, o, ldo, nullptr, a, b, dim);
}

// o[m] += sum_{j in [a_m, b_m)} p[m * ldp + j] v_j for `rows` accumulator rows o (ldo apart),
// [a_m, b_m) = range[m]: the pairs the mask shows, exactly - a hidden pair is never multiplied,
// so a NaN or Inf in a v_j that row m does not see cannot reach it (0 * NaN). Register panels
// of up to kPanelRows rows run the keys every row of the panel sees; each row's own fringe
// outside them runs alone.
template <class E>
void axpys(int rows, const float* p, int64_t ldp, const Rows<E>& v, const Interval* range, float* o, int64_t ldo,
           int64_t dim) {
  for (int m0 = 0; m0 < rows; m0 += simd::kPanelRows) {
    const int mr = std::min(simd::kPanelRows, rows - m0);
    int lo = 0, hi = 1 << 30;
    for (int m = m0; m < m0 + mr; ++m) {
      lo = std::max<int>(lo, static_cast<int>(range[m].lo)), hi = std::min<int>(hi, static_cast<int>(range[m].hi));
    }
    if (lo >= hi) lo = hi = 0;  // no key every row sees: each row alone
    const float* pm = p + m0 * ldp;
    float* om = o + m0 * ldo;
    switch (mr) {
      case 1: pv<1>(pm, ldp, v, om, ldo, lo, hi, dim); break;
      case 2: pv<2>(pm, ldp, v, om, ldo, lo, hi, dim); break;
      case 3: pv<3>(pm, ldp, v, om, ldo, lo, hi, dim); break;
      case 4: pv<4>(pm, ldp, v, om, ldo, lo, hi, dim); break;
      case 5: pv<5>(pm, ldp, v, om, ldo, lo, hi, dim); break;
      default: pv<simd::kPanelRows>(pm, ldp, v, om, ldo, lo, hi, dim); break;
    }
    for (int m = m0; m < m0 + mr; ++m) {
      const int a = static_cast<int>(range[m].lo), b = static_cast<int>(range[m].hi);
      if (lo < hi) {
        pv<1>(p + m * ldp, ldp, v, o + m * ldo, ldo, a, std::min(b, lo), dim);
        pv<1>(p + m * ldp, ldp, v, o + m * ldo, ldo, std::max(a, hi), b, dim);
      } else {
        pv<1>(p + m * ldp, ldp, v, o + m * ldo, ldo, a, b, dim);
      }
    }
  }
}
static_assert(simd::kPanelRows <= 6, "axpys dispatches 1..6 rows");

// o[m] += sum over the set bits j of cols[m] of w[m * ldw + j] x_j: axpys for a sparse pattern's
// partial tiles, whose visible keys are not an interval per row - one vector axpy per visible
// pair, so a hidden pair is never multiplied (its NaN cannot leak as 0 * NaN).
template <class E>
void masked_axpys(int rows, const float* w, int64_t ldw, const Rows<E>& x, const uint64_t* cols, float* o, int64_t ldo,
                  int64_t dim) {
  const int64_t full = dim / kLanes * kLanes;
  const int tail = static_cast<int>(dim - full);
  for (int m = 0; m < rows; ++m) {
    float* om = o + m * ldo;
    for (uint64_t bits = cols[m]; bits != 0; bits &= bits - 1) {
      const int j = std::countr_zero(bits);
      const Batch wj(w[m * ldw + j]);
      const E* xr = x.row(j);
      for (int64_t c = 0; c < full; c += kLanes) {
        simd::fma(wj, simd::load_at(xr, c), Batch::load_aligned(om + c)).store_aligned(om + c);
      }
      if (tail > 0) {
        simd::fma(wj, simd::load_partial_at(xr, full, tail), Batch::load_aligned(om + full)).store_aligned(om + full);
      }
    }
  }
}

template <class E>
void widen_row(const E* src, int64_t n, int64_t padded, float* dst) {
  for (int64_t x = 0; x < n; ++x) dst[x] = to_float(src[x]);
  std::fill(dst + n, dst + padded, 0.f);
}

template <class E>
class Engine {
 public:
  // pat: the problem's sparse pattern (nullptr for interval masks).
  Engine(const Problem& p, const TypedInputs<E>& in, const BackwardInputs& bw, const Gradients& g, const float* dd,
         const Pattern* pat)
      : p_(p),
        in_(in),
        bw_(bw),
        g_(g),
        dd_(dd),
        pat_(pat),
        l_(p),
        scale_(p.effective_scale()),
        mods_(p.softcap > 0.f || p.has_alibi()) {}

  // Query rows of a tile as the GEMMs read them (float32, ld floats apart).
  struct QueryRows {
    const float *q, *go;
    int64_t ldq, ldgo;
  };

  // Q, dO, LSE and D of query rows [i0, i0 + br) of head h: LSE and D into the tile, Q and dO
  // read where they lie (dO is float32; Q when stored so) - copying them into the tile cost 2-4% of
  // the backward's time (paired, avx512) - and a bf16 or f16 Q widened into the tile.
  QueryRows load_rows(const Tile& t, int64_t b, int64_t h, int64_t i0, int br) const {
    QueryRows rows{t.q, bw_.d_o.row(b, h, i0), l_.dp, bw_.d_o.stride_s};
    if constexpr (std::is_same_v<E, float>) rows.q = in_.q.row(b, h, i0), rows.ldq = in_.q.stride_s;
    for (int r = 0; r < br; ++r) {
      const int64_t i = i0 + r;
      if constexpr (!std::is_same_v<E, float>) widen_row(in_.q.row(b, h, i), p_.head_dim, l_.dp, t.q + r * l_.dp);
      t.lse[r] = bw_.lse[(b * p_.q_heads + h) * p_.q_len + i];
      t.dd[r] = dd_[(b * p_.q_heads + h) * p_.q_len + i];
    }
    return rows;
  }

  // How rows [i0, i0 + br) of head h meet keys [j0, j0 + nk): their intervals into iv (for
  // Elements each row's hull of its words, which go into t.words and t.colw). A sparse pattern's
  // tile pair is classified as the forward's block map does (Pattern::classify): empty pairs are
  // skipped, full ones run as intervals, partial ones per element.
  Meet meet(const Tile& t, int64_t b, int64_t h, int64_t i0, int br, int64_t j0, int nk, Interval* iv) const {
    if (!pat_) {
      const MaskSpec mask = p_.mask_for_batch(b);
      bool any = false;
      for (int r = 0; r < br; ++r) {
        iv[r] = mask.row(i0 + r);
        any = any || std::max(iv[r].lo, j0) < std::min(iv[r].hi, j0 + nk);
      }
      return any ? Meet::Intervals : Meet::None;
    }
    const Pattern::Block block = pat_->classify(b, h, i0, i0 + br, j0, j0 + nk);
    if (block == Pattern::Block::Empty) return Meet::None;
    if (block == Pattern::Block::Full) {
      for (int r = 0; r < br; ++r) iv[r] = Interval{j0, j0 + nk};
      return Meet::Intervals;
    }
    bool any = false;
    std::fill(t.colw, t.colw + kTileKeys, uint64_t{0});
    for (int r = 0; r < br; ++r) {
      uint64_t w = 0;
      for (int c = 0; c < nk; ++c) {
        if (pat_->visible(b, h, i0 + r, j0 + c)) w |= uint64_t{1} << c, t.colw[c] |= uint64_t{1} << r;
      }
      t.words[r] = w;
      iv[r] = w ? Interval{j0 + std::countr_zero(w), j0 + 64 - std::countl_zero(w)} : Interval{j0, j0};
      any = any || w != 0;
    }
    return any ? Meet::Elements : Meet::None;
  }

  // K^T and V^T of a key tile for the score GEMMs.
  void pack_keys(const Tile& t, const Rows<E>& k, const Rows<E>& v, int nk) const {
    simd::pack_k_transposed(k, nk, p_.head_dim, t.kt);
    simd::pack_k_transposed(v, nk, p_.dim_v(), t.vt);
  }

  // S, P (into t.s), dP, dS (into t.dpm) of the loaded rows (b, h, i0 + r) against the packed keys
  // [j0, j0 + nk); P^T and scale dS^T into t.pt and t.dst when `transposed`.
  void tile(const Tile& t, const QueryRows& rows, int br, const Interval* iv, int64_t j0, int nk, bool transposed,
            Meet meet, int64_t b, int64_t h, int64_t i0) const {
    dots(br, rows.q, rows.ldq, t.kt, p_.head_dim, iv, j0, nk, t.s);
    dots(br, rows.go, rows.ldgo, t.vt, p_.dim_v(), iv, j0, nk, t.dpm);
    alignas(64) static constexpr float kIota[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    static_assert(kLanes <= 16 && kTileKeys % kLanes == 0, "whole vectors of a tile row");
    const Batch scale(scale_);
    for (int r = 0; r < br; ++r) {
      const int lo = static_cast<int>(std::clamp<int64_t>(iv[r].lo - j0, 0, nk));
      const int hi = static_cast<int>(std::clamp<int64_t>(iv[r].hi - j0, lo, nk));
      float* s = t.s + r * kTileKeys;
      float* dp = t.dpm + r * kTileKeys;
      const Batch neg_lse(-t.lse[r]), dd(t.dd[r]), blo(static_cast<float>(lo)), bhi(static_cast<float>(hi));
      if (mods_) {  // the score modifications (score_mod.hpp): the modified score's P, dS times softcap's slope
        const ScoreMod mod = p_.score_mod(b, h, i0 + r);
        const Batch cap(mod.softcap), inv(mod.softcap > 0.f ? 1.f / mod.softcap : 0.f), slope(mod.slope),
            base(static_cast<float>(j0 - mod.pos));
        for (int c = 0; c < nk; c += kLanes) {
          const Batch idx = Batch::load_aligned(kIota) + Batch(static_cast<float>(c));
          const auto seen = simd::mask_and(idx >= blo, idx < bhi);
          Batch x = scale * Batch::load_aligned(s + c), d_cap(1.f);
          if (mod.softcap > 0.f) {
            const Batch th = simd::tanh(x * inv);
            x = cap * th;
            d_cap = simd::fnma(th, th, Batch(1.f));
          }
          if (mod.slope != 0.f) x = simd::fma(slope, idx + base, x);
          const Batch pc = simd::select(seen, simd::exp(x + neg_lse), Batch(0.f));
          const Batch ds = simd::select(seen, pc * (Batch::load_aligned(dp + c) - dd) * d_cap, Batch(0.f));
          pc.store_aligned(s + c);
          ds.store_aligned(dp + c);
        }
        continue;
      }
      for (int c = 0; c < nk; c += kLanes) {
        // P = e^(scale S - LSE) and dS = P (dP - D) on the keys the row sees, 0 elsewhere: the
        // mask decides (select), never the arithmetic (a hidden key's NaN score stays out).
        const Batch idx = Batch::load_aligned(kIota) + Batch(static_cast<float>(c));
        const auto seen = simd::mask_and(idx >= blo, idx < bhi);
        const Batch pc =
            simd::select(seen, simd::exp(simd::fma(scale, Batch::load_aligned(s + c), neg_lse)), Batch(0.f));
        const Batch ds = simd::select(seen, pc * (Batch::load_aligned(dp + c) - dd), Batch(0.f));
        pc.store_aligned(s + c);
        ds.store_aligned(dp + c);
      }
    }
    if (meet == Meet::Elements) {  // the holes inside each row's hull
      for (int r = 0; r < br; ++r)
        for (int c = 0; c < nk; ++c) {
          if (!(t.words[r] >> c & 1)) t.s[r * kTileKeys + c] = t.dpm[r * kTileKeys + c] = 0.f;
        }
    }
    if (transposed) {
      transpose(t.s, br, nk, 1.f, t.pt);
      transpose(t.dpm, br, nk, scale_, t.dst);
    }
  }

  // dst[c * kBr + r] = scale * src[r * kTileKeys + c] for r < br, c < nk (in kLanes x kLanes
  // register blocks where the target has them: rows past br are read from the tile's spare rows
  // and written where no sum reads them).
  static void transpose(const float* src, int br, int nk, float scale, float* dst) {
    if constexpr (simd::kRegisterTranspose) {
      using Reg = simd::FloatReg;
      const Batch k(scale);
      for (int r0 = 0; r0 < br; r0 += kLanes)
        for (int c0 = 0; c0 < nk; c0 += kLanes) {
          Reg x[kLanes];
          for (int i = 0; i < kLanes; ++i) x[i] = Reg(Batch::load_aligned(src + (r0 + i) * kTileKeys + c0) * k);
          simd::transpose_block(x);
          for (int i = 0; i < kLanes; ++i) Batch(x[i]).store_aligned(dst + (c0 + i) * kBr + r0);
        }
    } else {
      for (int r = 0; r < br; ++r)
        for (int c = 0; c < nk; ++c) dst[c * kBr + r] = scale * src[r * kTileKeys + c];
    }
  }

  Rows<E> key_rows(const View4<const E>& x, int64_t b, int64_t hk, int64_t j0, int nk) const {
    return Rows<E>::strided(x.row(b, hk, j0), x.stride_s, nk);
  }

  // Pass 1: dK and dV of keys [j0, j0 + nk) of kv head hk; with dq (the fused pass: one task
  // owns the whole kv head) also dQ += dS K into dq, the group's rows (h - first head, i) at
  // ((h - first) * q_len + i) * dp.
  void keys_task(const Tile& t, int64_t b, int64_t hk, int64_t j0, float* dq = nullptr) const {
    const int nk = static_cast<int>(std::min<int64_t>(kTileKeys, p_.kv_len - j0));
    std::fill(t.dk, t.dk + nk * l_.dp, 0.f);
    std::fill(t.dv, t.dv + nk * l_.dvp, 0.f);
    pack_keys(t, key_rows(in_.k, b, hk, j0, nk), key_rows(in_.v, b, hk, j0, nk), nk);
    Interval iv[kBr];
    for (int64_t h = hk * p_.group(); h < (hk + 1) * p_.group(); ++h) {
      for (int64_t i0 = 0; i0 < p_.q_len; i0 += kBr) {
        const int br = static_cast<int>(std::min<int64_t>(kBr, p_.q_len - i0));
        const Meet m = meet(t, b, h, i0, br, j0, nk, iv);
        if (m == Meet::None) continue;
        const QueryRows rows = load_rows(t, b, h, i0, br);
        // Rows past br in the transposed tiles stay out of the sums: n = br below.
        tile(t, rows, br, iv, j0, nk, true, m, b, h, i0);
        const Rows<float> go = Rows<float>::strided(rows.go, rows.ldgo, br),
                          q = Rows<float>::strided(rows.q, rows.ldq, br);
        float* acc = dq ? dq + ((h - hk * p_.group()) * p_.q_len + i0) * l_.dp : nullptr;
        if (m == Meet::Elements) {
          masked_axpys(nk, t.pt, kBr, go, t.colw, t.dv, l_.dvp, p_.dim_v());
          masked_axpys(nk, t.dst, kBr, q, t.colw, t.dk, l_.dp, p_.head_dim);
          if (acc) add_dq(t, br, iv, j0, nk, key_rows(in_.k, b, hk, j0, nk), acc, m);
          continue;
        }
        // The rows that see key c: [first, last] of them (interval masks: a contiguous range);
        // every row when each row sees the whole tile (no mask, or off the diagonal).
        Interval seen_by[kTileKeys];
        bool whole = true;
        for (int r = 0; r < br && whole; ++r) whole = iv[r].lo <= j0 && j0 + nk <= iv[r].hi;
        for (int c = 0; c < nk; ++c) {
          int a = whole ? 0 : br, b = whole ? br : 0;
          for (int r = 0; r < br && !whole; ++r) {
            if (iv[r].lo <= j0 + c && j0 + c < iv[r].hi) a = std::min(a, r), b = r + 1;
          }
          seen_by[c] = a < b ? Interval{a, b} : Interval{0, 0};
        }
        axpys(nk, t.pt, kBr, go, seen_by, t.dv, l_.dvp, p_.dim_v());
        axpys(nk, t.dst, kBr, q, seen_by, t.dk, l_.dp, p_.head_dim);
        if (acc) add_dq(t, br, iv, j0, nk, key_rows(in_.k, b, hk, j0, nk), acc, m);
      }
    }
    for (int c = 0; c < nk; ++c) {
      std::copy(t.dk + c * l_.dp, t.dk + c * l_.dp + p_.head_dim, g_.dk.row(b, hk, j0 + c));
      std::copy(t.dv + c * l_.dvp, t.dv + c * l_.dvp + p_.dim_v(), g_.dv.row(b, hk, j0 + c));
    }
  }

  // Pass 2: dQ of query rows [i0, i0 + br) of head h.
  void rows_task(const Tile& t, int64_t b, int64_t h, int64_t i0) const {
    const int br = static_cast<int>(std::min<int64_t>(kBr, p_.q_len - i0));
    const int64_t hk = p_.kv_head_of(h);
    Interval iv[kBr];
    const QueryRows rows = load_rows(t, b, h, i0, br);
    float* dq = t.dk;  // pass 2 has no dK: its accumulator holds dQ (kBr x dp)
    std::fill(dq, dq + br * l_.dp, 0.f);
    int64_t lo = p_.kv_len, hi = 0;  // the keys some row may see (a pattern: its rows' hulls)
    const MaskSpec mask = p_.mask_for_batch(b);
    for (int r = 0; r < br; ++r) {
      const Interval h_r = pat_ ? pat_->hull(b, i0 + r) : mask.row(i0 + r);
      if (!h_r.empty()) lo = std::min(lo, h_r.lo), hi = std::max(hi, h_r.hi);
    }
    for (int64_t j0 = lo / kTileKeys * kTileKeys; j0 < hi; j0 += kTileKeys) {
      const int nk = static_cast<int>(std::min<int64_t>(kTileKeys, p_.kv_len - j0));
      const Meet m = meet(t, b, h, i0, br, j0, nk, iv);
      if (m == Meet::None) continue;
      const Rows<E> k = key_rows(in_.k, b, hk, j0, nk);
      pack_keys(t, k, key_rows(in_.v, b, hk, j0, nk), nk);
      tile(t, rows, br, iv, j0, nk, false, m, b, h, i0);
      add_dq(t, br, iv, j0, nk, k, dq, m);
    }
    write_dq(b, h, i0, br, dq);
  }

  // The fused pass: one task per (batch, kv head) computes dK, dV and dQ of all its rows and
  // keys, S and dP once per tile pair (5 GEMMs, not 7); dq: its group's dQ accumulators.
  void head_task(const Tile& t, int64_t b, int64_t hk, float* dq) const {
    const int64_t G = p_.group();
    std::fill(dq, dq + G * p_.q_len * l_.dp, 0.f);
    for (int64_t j0 = 0; j0 < p_.kv_len; j0 += kTileKeys) keys_task(t, b, hk, j0, dq);
    for (int64_t h = hk * G; h < (hk + 1) * G; ++h)
      for (int64_t i0 = 0; i0 < p_.q_len; i0 += kBr) {
        write_dq(b, h, i0, static_cast<int>(std::min<int64_t>(kBr, p_.q_len - i0)),
                 dq + ((h - hk * G) * p_.q_len + i0) * l_.dp);
      }
  }

 private:
  // dQ += dS K over the keys of the tile each row sees (the scale is applied in write_dq): the
  // same sums in the same order in either pass, so both give the same bits.
  void add_dq(const Tile& t, int br, const Interval* iv, int64_t j0, int nk, const Rows<E>& k, float* dq,
              Meet m) const {
    if (m == Meet::Elements) return masked_axpys(br, t.dpm, kTileKeys, k, t.words, dq, l_.dp, p_.head_dim);
    Interval sees_keys[kBr];  // row r's keys inside the tile
    for (int r = 0; r < br; ++r) {
      const int64_t a = std::clamp<int64_t>(iv[r].lo - j0, 0, nk), b = std::clamp<int64_t>(iv[r].hi - j0, a, nk);
      sees_keys[r] = Interval{a, b};
    }
    axpys(br, t.dpm, kTileKeys, k, sees_keys, dq, l_.dp, p_.head_dim);
  }

  void write_dq(int64_t b, int64_t h, int64_t i0, int br, const float* dq) const {
    for (int r = 0; r < br; ++r) {
      float* out = g_.dq.row(b, h, i0 + r);
      for (int64_t d = 0; d < p_.head_dim; ++d) out[d] = scale_ * dq[r * l_.dp + d];
    }
  }

  const Problem& p_;
  const TypedInputs<E>& in_;
  const BackwardInputs& bw_;
  const Gradients& g_;
  const float* dd_;
  const Pattern* pat_;
  const Layout l_;
  const float scale_;
  const bool mods_;  // softcap or ALiBi (a sink logit changes only LSE, which the forward gave, and dsink)
};

// The fused pass's dQ accumulators of one task (a kv head's group of query heads).
size_t dq_bytes(const Problem& p) {
  return static_cast<size_t>(p.group() * p.q_len * simd::padded_dim(p.head_dim)) * sizeof(float);
}

// Whether the fused pass runs: enough (batch, kv head) tasks to keep every thread busy to 90%
// or better (whole rounds of tasks), and the whole workspace with their dQ accumulators within
// 64 MiB; else the two passes, whose tasks are tiles (O(n) workspace: D and the tiles). Both give
// the same bits (add_dq), so the choice - a function of the thread count - never changes a
// gradient.
bool fused(const Problem& p, int threads) {
  const int64_t tasks = p.batch * p.kv_heads, rounds = (tasks + threads - 1) / threads;
  const bool balanced = static_cast<double>(tasks) >= 0.9 * static_cast<double>(rounds * threads);
  const size_t fused_bytes = d_bytes(p) + static_cast<size_t>(threads) * (Layout(p).bytes + dq_bytes(p));
  return balanced && fused_bytes <= (size_t{64} << 20);
}

size_t thread_bytes(const Problem& p, int threads) { return Layout(p).bytes + (fused(p, threads) ? dq_bytes(p) : 0); }

}  // namespace

size_t flash_backward_bytes(const Problem& p, int threads) {
  return d_bytes(p) + static_cast<size_t>(threads) * thread_bytes(p, threads);
}

void flash_backward(const Problem& p, const Inputs& in, const BackwardInputs& bw, const Gradients& g, RunContext& ctx) {
  const Layout l(p);
  float* dd = reinterpret_cast<float*>(ctx.workspace.data());
  // Pass 0: D_i = dO_i . O_i.
  attnlab::parallel_tasks(TaskRange(0, p.batch * p.q_heads, 1), [&](const TaskRange& range) {
    for (int64_t bh = range.begin(); bh != range.end(); ++bh) {
      const int64_t b = bh / p.q_heads, h = bh % p.q_heads;
      for (int64_t i = 0; i < p.q_len; ++i) {
        const float* go = bw.d_o.row(b, h, i);
        const float* o = bw.o.row(b, h, i);
        float sum = 0.f;
        for (int64_t d = 0; d < p.dim_v(); ++d) sum += go[d] * o[d];
        dd[bh * p.q_len + i] = sum;
      }
    }
  });
  // The sink logits' gradient (backward.hpp): dsink_h = - sum_{b,i} e^(b_h - LSE) D, in a fixed order
  // (the same bits for any thread count), O(rows).
  if (g.dsink) {
    for (int64_t h = 0; h < p.q_heads; ++h) {
      double acc = 0;
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t i = 0; i < p.q_len; ++i) {
          const int64_t r = (b * p.q_heads + h) * p.q_len + i;
          acc += std::exp(static_cast<double>(p.sink_logit(h)) - bw.lse[r]) * dd[r];
        }
      g.dsink[h] = static_cast<float>(-acc);
    }
  }
  // A sparse pattern's rule and block classification: the session's plan (made outside the timed
  // call), else built here (O(n)).
  std::optional<Pattern> own;
  const Pattern* pat = nullptr;
  if (p.sparse()) {
    const auto* planned = dynamic_cast<const PatternPlan*>(ctx.plan);
    pat = planned ? &planned->pattern : &own.emplace(p);
  }
  visit_inputs(in, [&](const auto& typed) {
    using E = std::remove_const_t<std::remove_pointer_t<decltype(typed.k.data)>>;
    const Engine<E> engine(p, typed, bw, g, dd, pat);
    const size_t mine_bytes = thread_bytes(p, ctx.threads);
    const auto mine = [&] { return thread_scratch(ctx, mine_bytes, "flash backward", d_bytes(p)); };
    const auto scratch = [&] { return Tile(mine(), l); };
    if (fused(p, ctx.threads)) {  // one task per (batch, kv head)
      attnlab::parallel_tasks(TaskRange(0, p.batch * p.kv_heads, 1), [&](const TaskRange& range) {
        const Tile t = scratch();
        float* dq = reinterpret_cast<float*>(mine() + l.bytes);
        for (int64_t bh = range.begin(); bh != range.end(); ++bh)
          engine.head_task(t, bh / p.kv_heads, bh % p.kv_heads, dq);
      });
      return;
    }
    // Pass 1: (batch, kv head, key tile) tasks own dK and dV.
    const int64_t key_tiles = (p.kv_len + kTileKeys - 1) / kTileKeys;
    attnlab::parallel_tasks(TaskRange(0, p.batch * p.kv_heads * key_tiles, 1), [&](const TaskRange& range) {
      const Tile t = scratch();
      for (int64_t x = range.begin(); x != range.end(); ++x) {
        const int64_t kt = x % key_tiles, bh = x / key_tiles;
        engine.keys_task(t, bh / p.kv_heads, bh % p.kv_heads, kt * kTileKeys);
      }
    });
    // Pass 2: (batch, query head, query tile) tasks own dQ.
    const int64_t row_tiles = (p.q_len + kBr - 1) / kBr;
    attnlab::parallel_tasks(TaskRange(0, p.batch * p.q_heads * row_tiles, 1), [&](const TaskRange& range) {
      const Tile t = scratch();
      for (int64_t x = range.begin(); x != range.end(); ++x) {
        const int64_t qt = x % row_tiles, bh = x / row_tiles;
        engine.rows_task(t, bh / p.q_heads, bh % p.q_heads, qt * kBr);
      }
    });
  });
}

}  // namespace attnlab::ATTN_TARGET_NS::cpu
