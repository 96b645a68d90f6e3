// flash_amx and flash_int8_amx's tile-unit steps: the AMX blocks (amx.hpp) on whole 64-key tiles
// of 32 query rows, the tiles pre-packed once per run and run kAmxGroup at a time. Part of the tile
// engine's translation unit: src/cpu/engine/tiles.cpp includes it inside its anonymous namespace,
// after the panel steps it calls (softmax_rows, the scratch layout) and before attend_tiles, which
// calls it. Only the avx512_bf16 object runs it (kAmxBuilt); the other objects compile it against
// amx.hpp's declarations and never call it ([[maybe_unused]]).
#pragma once

// The online softmax of the 32 rows at rb on nt whole tiles, their scores in sb (rows of RowKeys,
// log2 units once multiplied by scale): softmax_rows with the scale folded in and P rounded to
// bf16 pairs into s.pw (rows of RowKeys / 2 words), then the O rows whose max grew rescaled, then
// O += P.V on the tile unit (tile q's V pairs at vp[q], pack_v_pairs' layout). Rows past the
// task's are zero Q rows with state of their own (begin_rows), never read back.
// lo, hi (one tile, nt = 1): each row's visible keys in it, the others masked (a tile whose V is
// finite: P.V then multiplies the masked keys' V rows by exactly 0, adding nothing).
template <int RowKeys = kTileKeys>
inline void amx_softmax_pv(const Tiling& t, const Scratch& s, int64_t rb, float* sb, float scale,
                           const uint32_t* const* vp, int nt = 1, const int* lo = nullptr, const int* hi = nullptr) {
  float alpha[kAmxRows];
  const bool rescale = softmax_rows<kAmxRows, false, true, RowKeys>(s, sb, rb, lo == nullptr, lo, hi, nullptr, alpha, 0,
                                                                    nt * kTileKeys / kLanes, scale, s.pw);
  float* o = s.o + rb * t.dim_v_pad;
  for (int64_t m = 0; rescale && m < kAmxRows; ++m) {
    if (alpha[m] == 1.f) continue;
    const Batch a(alpha[m]);
    float* row = o + m * t.dim_v_pad;
    for (int64_t c = 0; c < t.dim_v_pad; c += kLanes) (Batch::load_aligned(row + c) * a).store_aligned(row + c);
  }
  amx_pv(s.pw, RowKeys / 2, vp, nt, t.dim_v_pad, o, t.dim_v_pad, t.dim_v_pad);
}

// flash_amx's unscaled scores for the 32 rows at rb into sb (rows lds floats apart): K^T pairs at
// kt (pack_k_pairs' layout), Q rows as words in s.qa.
inline void amx_scores_bf16(const Tiling& t, const Scratch& s, int64_t rb, const uint32_t* kt, float* sb,
                            int64_t lds = kTileKeys) {
  const int64_t dw = padded_words(t.dim);
  amx_scores(s.qa + rb * dw, dw, kt, dw, sb, lds);
}

// A whole tile's blocks of 32 rows in turn (its K^T pairs at kt, V pairs at vp).
[[maybe_unused]] inline void amx_tile_bf16(const Tiling& t, const Scratch& s, int64_t rows, const uint32_t* kt,
                                           const uint32_t* vp) {
  for (int64_t rb = 0; rb < rows; rb += kAmxRows) {
    amx_scores_bf16(t, s, rb, kt, s.p);
    amx_softmax_pv(t, s, rb, s.p, t.score_scale, &vp);
  }
}

// The pre-packed tiles of a head (Tiling::pairs_head): tile j0 / 64's K^T pairs and V pairs.
[[maybe_unused]] inline const uint32_t* packed_k(const Tiling& t, const std::byte* head, int64_t j0) {
  return reinterpret_cast<const uint32_t*>(head + static_cast<size_t>(j0 / kTileKeys) * t.pairs_tile);
}
[[maybe_unused]] inline const uint32_t* packed_v(const Tiling& t, const std::byte* head, int64_t j0) {
  return reinterpret_cast<const uint32_t*>(head + static_cast<size_t>(j0 / kTileKeys) * t.pairs_tile + t.pairs_v_off);
}
// The packed tiles of head (b, hk).
[[maybe_unused]] inline const std::byte* amx_head(const Tiling& t, const Scratch& s, int64_t b, int64_t hk) {
  return s.pairs + static_cast<size_t>(b * t.kv_heads + hk) * t.pairs_head;
}
// ... and whether every V value of its tile at j0 is finite (prepare_pairs' flag).
[[maybe_unused]] inline bool packed_v_finite(const Tiling& t, const std::byte* head, int64_t j0) {
  return head[static_cast<size_t>(j0 / kTileKeys) * t.pairs_tile + t.pairs_flag_off] == std::byte{1};
}

// flash_int8_amx's scores for the 32 rows at rb into sb (rows lds floats apart): TDPBSSD on the
// task's Q codes (s.qa) and the head's int8 key tile (I8KeyTile), each int32 sum then scaled as
// score_panel_i8 does (its key's and its row's scales, plus the row's q.mean), in place - log2
// units, so the softmax's scale is 1.
inline void amx_scores_i8(const Tiling& t, const Scratch& s, int64_t rb, const std::byte* tile, float* sb,
                          int64_t lds = kTileKeys) {
  const I8KeyTile l(t.dim);
  const float* ks = l.scale(const_cast<std::byte*>(tile));
  const float* qsc = reinterpret_cast<const float*>(s.i8 + t.i8_qsc_off);
  const float* qc = reinterpret_cast<const float*>(s.i8 + t.i8_c_off);
  amx_scores<true>(s.qa + rb * l.rows, l.rows, reinterpret_cast<const uint32_t*>(tile), l.rows, sb, lds);
  for (int64_t m = 0; m < kAmxRows; ++m) {
    const Batch sc(qsc[rb + m]), shift(qc[rb + m]);
    float* row = sb + m * lds;
    for (int64_t v = 0; v < kTileKeys; v += kLanes) {
      const Batch x = i8_detail::to_float(i8_detail::load_ivec(row + v));
      simd::fma(x * Batch::load_aligned(ks + v), sc, shift).store_aligned(row + v);
    }
  }
}
// A whole tile's blocks of 32 rows in turn (its key tile at tile, V pairs in s.vp).
[[maybe_unused]] inline void amx_tile_i8(const Tiling& t, const Scratch& s, int64_t rows, const std::byte* tile) {
  for (int64_t rb = 0; rb < rows; rb += kAmxRows) {
    amx_scores_i8(t, s, rb, tile, s.p);
    const uint32_t* vp = s.vp;
    amx_softmax_pv(t, s, rb, s.p, 1.f, &vp);
  }
}

// The AMX kernels' whole tiles of a task, packed before the tasks (prepare_pairs, Tiling::pairs_head:
// every 64-key tile of the sequence's K^T and V pairs - flash_int8_amx's keys are its int8 key
// tiles - once per run instead of once per task), block of 32 rows by
// block: per chunk of those tiles that fits half the L2, each row block runs through all of them
// kAmxGroup tiles at a time - their scores side by side (32 x 256), one softmax over the group,
// one load and store of the block's O tiles for the group's P.V - so its O and Q rows (16 + 8 KiB
// at d 128) stay in L1 and only the packed K and V stream in from L2. A masked tile (the causal
// diagonal, a window's edges; the interval path) runs here too, alone, when its V is finite
// (prepare_pairs' flag): its masked keys get P = 0, and 0 times a finite V adds exactly nothing,
// so no row takes anything from a key it does not see; a NaN or Inf in its V sends it to the
// panels, which multiply only the keys each row sees. The tile loop then skips the tiles run
// here (amx_runs); the online softmax takes a row's tiles in any order.
// Measured (8/8, d 128, 4096, bf16, 2 threads, the AMX Xeon, paired with the version before):
// tile by tile (every row block per tile, K and V packed per task, 16-row blocks) 63-68 ms,
// 16-17% of the tile peak, causal 46-51 ms; this 53-56 ms, causal 28 ms (with Br 64);
// flash_int8_amx (float32 inputs) 64-71 -> 59-62 ms, causal 44 -> 36 ms. Issuing
// the next tile's scores and the last one's P.V between the softmax's rows, so the tile unit
// would run beside the vector units, changed nothing (1.00x): here the two do not overlap.
[[maybe_unused]] inline bool prepacked_tile(const Tiling& t, const TileRef& r) {
  return t.pairs_head > 0 && r.k == nullptr && r.j0 % kTileKeys == 0;
}
// Whether amx_prepacked_tiles runs tile r: a whole one, or (the interval path) a masked one whose
// V is finite. common: common_keys.
template <bool Words>
bool amx_runs(const Tiling& t, const std::byte* head, const Interval& common, const TileRef& r) {
  if (!prepacked_tile(t, r) || r.nk != kTileKeys) return false;
  return whole_tile<Words>(common, r) || (!Words && packed_v_finite(t, head, r.j0));
}
template <bool Words, class At>
void amx_prepacked_tiles(const Tiling& t, const Scratch& s, int64_t b, int64_t hk, int64_t rows, int64_t n,
                         const At& at) {
  const std::byte* head = amx_head(t, s, b, hk);
  constexpr int64_t kMaxChunk = 64;
  const int64_t chunk = std::clamp<int64_t>(planning_l2_bytes() / 2 / static_cast<int64_t>(t.pairs_tile), 1, kMaxChunk);
  const Interval common = common_keys(s, rows);
  // flash_amx: bf16 K^T pairs, packed here; flash_int8_amx: the head's int8 key tiles (scaled
  // into log2 units by amx_scores_i8, so the softmax's scale is 1).
  const auto score = [&](int64_t rb, int64_t j0, float* out, int64_t lds) {
    if constexpr (kAmxInt8Built) {
      if (t.i8_prefill) return amx_scores_i8(t, s, rb, i8_key_tile(t, i8_task_head(s), j0), out, lds);
    }
    amx_scores_bf16(t, s, rb, packed_k(t, head, j0), out, lds);
  };
  const float scale = t.i8_prefill ? 1.f : t.score_scale;
  int64_t first[kMaxChunk], masked[kMaxChunk];  // the chunk's whole and masked tiles, by their first key
  for (int64_t x = 0; x < n;) {
    int64_t c = 0, cm = 0;
    for (int64_t taken = 0; x < n && taken < chunk; ++x) {
      const TileRef r = at(x);
      if (!amx_runs<Words>(t, head, common, r)) continue;
      (whole_tile<Words>(common, r) ? first[c++] : masked[cm++]) = r.j0;
      ++taken;
    }
    for (int64_t rb = 0; rb < rows; rb += kAmxRows) {
      for (int64_t g = 0; g < c; g += kAmxGroup) {
        const int nt = static_cast<int>(std::min(kAmxGroup, c - g));
        const uint32_t* vp[kAmxGroup];
        for (int q = 0; q < nt; ++q) {
          score(rb, first[g + q], s.p + q * kTileKeys, kAmxGroupKeys);
          vp[q] = packed_v(t, head, first[g + q]);
        }
        amx_softmax_pv<kAmxGroupKeys>(t, s, rb, s.p, scale, vp, nt);
      }
      for (int64_t i = 0; i < cm; ++i) {  // the causal diagonal, a window's edges
        const int64_t j0 = masked[i];
        int lo[kAmxRows], hi[kAmxRows];
        bool seen = false;
        for (int64_t m = 0; m < kAmxRows; ++m) {
          const Interval iv = rb + m < rows ? s.iv[rb + m] : Interval{0, 0};  // (padding rows: none)
          lo[m] = static_cast<int>(std::clamp<int64_t>(iv.lo - j0, 0, kTileKeys));
          hi[m] = static_cast<int>(std::clamp<int64_t>(iv.hi - j0, 0, kTileKeys));
          if (hi[m] <= lo[m]) lo[m] = hi[m] = 0;
          seen = seen || hi[m] > 0;
        }
        if (!seen) continue;  // no row of the block sees a key of it
        const uint32_t* vp = packed_v(t, head, j0);
        score(rb, j0, s.p, kTileKeys);
        amx_softmax_pv(t, s, rb, s.p, scale, &vp, 1, lo, hi);
      }
    }
  }
}
