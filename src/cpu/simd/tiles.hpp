// The FlashAttention-2 tile engine shared by `flash` (prefill: query tiles, all keys) and
// `decode` (a few query rows, one key chunk per task). Defined in src/cpu/engine/tiles.cpp; the
// algorithm, its tile sizes and its cost are described in src/cpu/kernels/flash.cpp's header.
//
// A caller owns one Scratch per thread and, per task:
//   begin_rows   packs the query rows [i0, i0 + nr) of all G query heads of one kv head
//                (R = G * nr rows, interleaved rr = r * G + g) and resets their state;
//   attend_keys  runs the online softmax over the keys of a range that some row sees, in
//                tiles of kTileKeys keys (any number of calls, in key order or not: the
//                state is exact for any split);
//   then either finish_rows (O = acc / l and LSE into the outputs) or reads the
//   unnormalized state (Scratch::o, m, and row_sum) to merge it with other key ranges.
// Results depend only on the arguments, never on the thread or on what ran before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

#include "attnlab/kernel.hpp"
#include "attnlab/pattern.hpp"
#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab::ATTN_TARGET_NS::simd {

// Up to this many rows (G x rows per task) a task is direct: it streams its K/V tiles and scores
// straight from the K rows (score_rows, score_rows_i8). decode_i8 scores only direct tasks (up to
// kStreamRows rows); decode's float32 tasks are direct up to kDirectRows and past it pack K^T and
// run flash's register-blocked panels (score_panel) - one K widening and pack per tile for all the
// rows instead of K re-read and re-widened by every 4-row pass. Measured against direct tasks
// (build/attn_ab_switch decode, 32/2 (GQA 16: 16 rows), d 128, 32k keys, 2 threads, Zen 4 avx512,
// paired): f32 1.24x, bf16 1.13x, u8 1.08x, q4_0 1.20x, fp8_e4m3 1.22x; at 12 rows (32/8, q_len 3)
// direct tasks stay ahead (f32 1.13x, u8 1.00x), and at 8 rows (32/4) 1.09-1.16x.
inline constexpr int64_t kStreamRows = 16;
inline constexpr int64_t kDirectRows = 12;

// A wide step (tiles.cpp: attend_wide): up to kWideTiles consecutive key tiles that every row of
// a task sees whole go through one softmax step - their scores side by side in rows of
// kWideKeys floats, one max and rescale per row, O loaded and stored once per column block for
// all their keys - instead of one step per 64-key tile. Measured against tile by tile
// (results/2026-12-06-prefill_levers, 2 threads, Zen 4 avx512, paired): 128 keys 1.05-1.06x,
// 256 keys 1.08-1.09x at d 64 and 128 (causal 1.08x, 32/8 1.08x), 512 keys no better than 256
// (1.07-1.10x) for twice the packed K^T in L2. flash_bf16's pairs the same way: 1.11-1.13x.
inline constexpr int kWideTiles = 4;
inline constexpr int kWideKeys = kWideTiles * 64;

// Tile sizes and the per-thread scratch layout, a function of the problem (and of the
// running machine's L2 when the caller lets the engine choose Br).
struct Tiling {
  int64_t group = 1;     // G
  int64_t br = 1;        // query rows per task
  int64_t rows = 1;      // R = G * br (at most)
  int64_t dim = 1;       // d, of Q and K
  int64_t dim_pad = 16;  // d rounded up to whole vectors
  int64_t dim_v = 1;     // d_v, of V and O (head_dim_v)
  int64_t dim_v_pad = 16;
  size_t q_off = 0, o_off = 0, kt_off = 0, p_off = 0, m_off = 0, l_off = 0, iv_off = 0;
  int wide = 1;            // key tiles per wide step (kWideTiles; 1: none - the panels of flash's float32
                           // tiling only, kt and p then sized for that many tiles)
  bool direct = false;     // rows few enough for unpacked scores (decode): q rows at qr_off
  bool stream_l2 = false;  // a direct task prefetches the next tile into L2 (two tiles exceed L1d)
  size_t qr_off = 0;
  size_t gather_off = 0;                   // 0: no gathered key tile (pattern.hpp: gathered_columns)
  size_t gather_v_off = 0;                 // its V rows, bytes after its K rows
  int64_t gather_ldk = 0, gather_ldv = 0;  // their row strides, in elements of the stored type
  // bf16 dot products (flash_bf16, src/cpu/simd/isa/avx512_bf16.hpp): Q, K^T, V and P as bf16 pairs,
  // Q unscaled and the scores scaled by score_scale; V pairs at vp_off, P pairs at pw_off.
  bool bf16_dot = false;
  float score_scale = 1.f;
  size_t vp_off = 0, pw_off = 0;
  // amx (flash_amx, src/cpu/simd/isa/amx.hpp): key tiles that every row sees whole go through the
  // tile unit 32 rows at a time (Q rows as words at qa_off; o, m, l for R rounded up to 32
  // rows; p and pw for 32 rows); the other tiles through the bf16 panels.
  bool amx = false;
  size_t qa_off = 0;
  // amx: every head's 64-key tiles packed once per run as TDPBF16PS's B operands (tiles.cpp:
  // amx_prepacked_tiles; pairs_shared bytes after i8_shared, before the threads' scratch: per
  // (batch, kv head) pairs_head bytes, kv_len / 64 tiles of pairs_tile bytes - K^T pairs
  // (pack_k_pairs; flash_amx only, pairs_v_off 0 for flash_int8_amx), then at pairs_v_off V
  // pairs (pack_v_pairs), then at pairs_flag_off a byte, 1 when every V pair of the tile is
  // finite); 0 for the other kernels.
  size_t pairs_tile = 0, pairs_v_off = 0, pairs_flag_off = 0, pairs_head = 0, pairs_shared = 0;
  int64_t kv_heads = 0;
  // int8 dot products (decode_i8, src/cpu/simd/int8_dot.hpp; direct tasks over a q8_0, q4_0, u8 or
  // u4 cache): at i8_off a 64-byte flag (1: every row of the task rounded), then R + 1 rows of
  // i8_row bytes (Q's integer form; the last all zero). A task of 2 panels or more on a target with
  // the integer vectors (kI8Vector): at i8_prep_off a tile's K words (prep_k_words), then (3 panels
  // or more) at i8_prep_off + i8_prep_v its V words (prep_v_words), then its V scales (v_tile_scales),
  // made once per tile for all the panels.
  bool int8_dot = false;
  bool i8_vnni = false;  // vpdpbusd (the CPU has this target's VNNI unit; not ATTN_NO_VNNI=1), else vpmaddubsw;
                         // decode_i8 on NEON: sdot where the CPU has it, else the rule
  bool i8_pv = false;    // decode_i8's P.V in integers (pv_tile_i8, int8_dot.hpp), else float32; flash_int8:
                         // whole tiles' P.V in integers (pv_tile_u8) on V rounded per channel (i8_v_off)
  size_t i8_off = 0, i8_prep_off = 0, i8_prep_v = 0;
  int64_t i8_row = 0;
  // int8 prefill (flash_int8: a dense float32 problem, src/cpu/simd/int8_dot.hpp): K smoothed and
  // rounded once per run into shared key tiles (i8_shared bytes before the threads' scratch: per
  // (batch, kv head) i8_head bytes, a 64-byte header - byte 0: 1 when the head's keys rounded -
  // then the mean (d floats), then its key tiles of I8KeyTile(d).bytes); per thread at i8_off the
  // task's header (byte 0: 1 when it scores in integers; its head's tiles), Q's panel words at
  // i8_qw_off, per row the scale times the score scale, then the smoothing's score term q.mean (log2).
  // With i8_pv the head's V follows at i8_v_off (header byte 1: 1 when it rounded): the channels'
  // scales (dim_v_pad floats), then its value tiles of I8ValueTile(dim_v_pad).bytes.
  bool i8_prefill = false;
  size_t i8_head = 0, i8_shared = 0, i8_qw_off = 0, i8_qsc_off = 0, i8_c_off = 0, i8_v_off = 0;
  size_t bytes = 0;  // per thread, a 64-byte multiple
  // The run's shared part of the workspace (before the threads' scratch): int8 key tiles, packed pairs.
  // flash's and flash_bf16's prefill (br chosen by the engine, wide steps, no sparse pattern, several query
  // tiles per head): every head's K^T packed once per run (prepare_kt) into kt_shared bytes after
  // pairs_shared - per (batch, kv head) kt_head bytes, ceil(kv_len / 64) tiles of pack_k_transposed's
  // dim_pad x 64 floats - and read by every query tile of the head, instead of each task packing
  // the tiles it meets; at most kMaxSharedKt bytes (else per task, as before). flash_bf16's
  // (bf16_dot): per head the tiles' K^T pairs (pack_k_pairs: padded_words(d) x 64 words each), then
  // their V pairs (pack_v_pairs: 32 rows of dim_v_pad words each), all tiles' side by side
  // (1.03-1.04x at 8/8 d 64 / d 128 and 32/8, 4096: results/2026-12-06-prefill_levers-2).
  size_t kt_head = 0, kt_shared = 0;
  int64_t kt_tiles = 0;
  // Score modifications (include/attnlab/blocks/score_mod.hpp) in the scores' log2 units: softcap c
  // log2 e (0: none); alibi: per row its slope times log2 e and its diagonal at mod_off (Scratch).
  // Sink logits are the finish's (finish_rows, decode's merge).
  float softcap2 = 0.f;
  bool alibi = false;
  size_t mod_off = 0;
  static constexpr size_t kMaxSharedKt = size_t{64} << 20;
  size_t shared_bytes() const { return i8_shared + pairs_shared + kt_shared; }
};

// ALiBi in the tile engine adds slope x (j0 + lane - diagonal): a tile's keys must be consecutive
// positions. Refused (naming `kernel` and what runs it): a sparse pattern's gathered tile of global
// columns, and flash's dilated phases (strided sub-problems); yes otherwise.
Support alibi_support(const Problem& p, std::string_view kernel);

// br = 0: the largest Br whose working set fits half the L2 (flash); else exactly br rows.
// bf16_dot: flash_bf16's tiling (only where the target has AVX512_BF16; never direct); amx:
// flash_amx's (bf16_dot too, and a target with AMX-BF16).
// int8_dot: decode_i8's (a direct tiling, a float32 Q and a cache kv_int_dot takes).
// int8_prefill: flash_int8's (never direct; a dense float32 problem).
Tiling make_tiling(const Problem& p, int64_t br = 0, bool bf16_dot = false, bool amx = false, bool int8_dot = false,
                   bool int8_prefill = false);

struct Scratch {
  float* q;            // R x d, panels of kPanelRows rows, k-major in a panel, times scale*log2e
                       // (not written for a direct task, which uses qr; bf16_dot: R x d/2 words of
                       // unscaled bf16 pairs, word-major in a panel)
  float* o;            // R x dim_v_pad unnormalized output accumulators
  float* kt;           // dim_pad x kTileKeys packed K tile (a wide step: Tiling::wide of them)
  float* p;            // kPanelRows x kTileKeys scores, then probabilities, of the current panel
                       // (amx: 32 x 256, the scores of up to four whole tiles side by side;
                       // a wide tiling: kPanelRows x kWideKeys)
  float* m;            // R running max (log2 units)
  float* l;            // R x kLanes running sums, one partial sum per lane (row_sum adds them)
  Interval* iv;        // R visible intervals, one per row (the G rows of a query row share it)
  float* qr;           // (R + 1) x dim_pad: Q rows times scale*log2e, zero padded, then a zero
                       // row (Tiling::direct only, else nullptr)
  float* gather;       // 64 K rows, then 64 V rows (Tiling::gather_*), gathered as stored, or nullptr
  uint32_t* vp;        // bf16_dot or amx: 32 x dim_v_pad words, the V tile by key pairs (else nullptr)
  uint32_t* pw;        // bf16_dot or amx: kPanelRows x 32 words (amx: 32 x 128), P rounded to bf16 pairs
  uint32_t* qa;        // amx: R rounded up to 32 rows of padded_words(d) words, Q rows as bf16 pairs
                       // (flash_int8_amx: as int8 codes, I8KeyTile(d).rows words a row)
  std::byte* i8;       // int8_dot: the flag, then Q's integer rows (Tiling::i8_off); int8_prefill: the
                       // task's header and Q words; else nullptr
  std::byte* i8_keys;  // int8_prefill: the shared key tiles of all heads (Tiling::i8_shared), else nullptr
  std::byte* i8_prep;  // int8_dot over 2 panels or more: Tiling::i8_prep_off, else nullptr
  const std::byte* i8_k_pre = nullptr;  // the current tile's K words and V words when made (attend_tiles),
  const std::byte* i8_v_pre = nullptr;  // else nullptr
  const float* i8_v_scales = nullptr;   // and its V scales (v_tile_scales), else nullptr
  const std::byte* pairs;               // flash_amx: the packed tiles of all heads (Tiling::pairs_shared), else nullptr
  const float* kts;                     // the packed K^T tiles of all heads (Tiling::kt_shared), else nullptr
  float* slope2;  // Tiling::alibi: R ALiBi slopes times log2 e, then R diagonals (int64); else nullptr
  int64_t* diag;
  float softcap2;  // Tiling::softcap2
  Scratch(std::byte* base, const Tiling& t, std::byte* shared = nullptr);
  // Whether this task scores in integers: int8_dot, and every row's Q rounded (round_q_row).
  bool i8_on() const { return i8 && i8[0] == std::byte{1}; }
};

// A row's interval when another task computes it (attend_blocks: a solo position's row in its
// br-row tile): empty for the tile's arithmetic, and finish_rows does not write it.
inline constexpr Interval kNotThisTask{-1, -1};

// The query positions of a task's rows: i0, i0 + 1, ... (an int converts), or a list (a block
// map's solo tile: global rows run together, BlockMap::solo_positions).
struct RowPositions {
  RowPositions(int64_t first) : i0(first) {}  // NOLINT: consecutive rows from first
  explicit RowPositions(const int64_t* positions) : list(positions) {}
  int64_t operator[](int64_t r) const { return list ? list[r] : i0 + r; }
  int64_t i0 = 0;
  const int64_t* list = nullptr;
};

// Returns R, the number of rows packed.
int64_t begin_rows(const Problem& p, const Inputs& in, const Tiling& t, const Scratch& s, int64_t b, int64_t hk,
                   RowPositions at, int64_t nr);
void attend_keys(const Problem& p, const Inputs& in, const Tiling& t, const Scratch& s, int64_t b, int64_t hk,
                 int64_t rows, Interval keys);
// Query-aware sparse decode's attend_keys (kv_summary.hpp's topk_pages): the n 64-key pages at
// `pages` (ascending page indices of sequence b), each a key tile masked by the rows' intervals.
void attend_pages(const Problem& p, const Inputs& in, const Tiling& t, const Scratch& s, int64_t b, int64_t hk,
                  int64_t rows, const int64_t* pages, int64_t n);
// A sparse pattern's attend_keys: the key tiles of the block map's entries for query tile qt
// (a br-row tile at positions qt * map.br ..., map.br == t.br, or a solo tile: positions
// map.solo_positions(qt)) inside `keys` (bounds at multiples of 64), each masked by its
// per-row words; also marks the rows the map finds fully masked, and in a br-row tile the
// rows of solo positions as not this task's (finish_rows leaves them).
void attend_blocks(const Problem& p, const Inputs& in, const Tiling& t, const Scratch& s, const BlockMap& map,
                   int64_t b, int64_t hk, int64_t qt, RowPositions at, int64_t rows,
                   Interval keys = {0, std::numeric_limits<int64_t>::max()});
// l of row rr (the sum of its lane partial sums).
float row_sum(const Scratch& s, int64_t rr);
// Where finish_rows writes LSE when p is a strided part of a larger problem (flash's dilation
// phases, phases.hpp): row i of head h at base[h * head_stride + i * step]. Without it, out.lse
// is p's contiguous (batch, q_heads, q_len) array.
struct LseRows {
  float* base = nullptr;
  int64_t head_stride = 0, step = 1;
};
void finish_rows(const Problem& p, const Outputs& out, const Tiling& t, const Scratch& s, int64_t b, int64_t hk,
                 RowPositions at, int64_t rows, const LseRows* lse_rows = nullptr);

// flash's prefill driver (src/cpu/kernels/flash.cpp), shared with flash_bf16: oneTBB over (b, kv head,
// query tile) tasks of tiling t, a sparse pattern through its block map (the plan's, or built
// here when run without one). `kernel` names the caller in scratch errors.
std::shared_ptr<const Plan> prefill_plan(const Problem& p, const Tiling& t);
void run_prefill(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx, const Tiling& t,
                 const char* kernel);
// int8_prefill: rounds every head's keys into the shared tiles (run_prefill's first step).
void prepare_i8_keys(const Problem& p, const Inputs& in, const Tiling& t, std::byte* shared);
// flash_amx (Tiling::pairs_shared): packs every head's whole 64-key tiles at area (run_prefill's first step).
void prepare_pairs(const Problem& p, const Inputs& in, const Tiling& t, std::byte* area);
// Tiling::kt_shared: packs every head's K^T tiles at area (run_prefill's first step).
void prepare_kt(const Problem& p, const Inputs& in, const Tiling& t, std::byte* area);

// The running thread's AMX tile configuration for the lifetime of the scope (Tiling::amx; else
// nothing): tile state is per thread, so each task range sets it up and releases it.
struct AmxScope {
  explicit AmxScope(const Tiling& t);
  ~AmxScope();
  AmxScope(const AmxScope&) = delete;
  AmxScope& operator=(const AmxScope&) = delete;
  bool on;
};

}  // namespace attnlab::ATTN_TARGET_NS::simd
