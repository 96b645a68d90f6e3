// Sparse attention patterns: masks that are more than one interval of keys per row.
//
// The rule, in ONE place (Pattern::visible; the interval rule of interval.hpp is its special
// case and stays the fast path). With Lk = kv length of batch b and pos(i) = i + off the query
// row's position on the key axis (off = Lk - Lq, or 0 for top-left causal: the alignment of
// interval.hpp), query row i of (b, h) sees key j when ALL of
//   j < Lk;  causal: j <= pos(i);  documents: doc(i) == doc(j);  mask file: mask[b, h, i, j]
// and ANY of
//   the window: pos - left <= j <= pos + right (a -1 bound is unbounded) and, with dilation D,
//     (pos - j) a multiple of D;  every key when neither a window nor a dilation is given
//     (then the ANY terms below add nothing, so they need one);
//   a sink: j < sinks;
//   a global column: j is a global position;  a global row: pos(i) is a global position;
//   a BigBird random block: key block j / B is one of the R blocks drawn for query block pos / B.
// Documents partition the row and key indices alike (q_len == kv_len == sum of doc_lens).
// A row with no visible key is fully masked: O = 0, LSE = -inf.
//
// Kernels that skip work use the block classification below (FlexAttention's BlockMask): per
// tile of rows x 64 keys, empty (skipped), full (no masking arithmetic) or partial (one 64-bit
// word of visible keys per row). It is built once per problem, outside the timed region.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attnlab/blocks/interval.hpp"

namespace attnlab {

struct Problem;

// A boolean mask read from a file or handed over as an array (True = attend, PyTorch's bool
// attn_mask), broadcast over batch and heads when those dimensions are 1.
struct BoolMask {
  int64_t batch = 1, heads = 1, q_len = 0, kv_len = 0;
  std::vector<uint8_t> data;  // batch x heads x q_len x kv_len, 0 or 1
  std::string source;         // the file (or argument) it came from (for messages)
  bool at(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const int64_t bb = batch == 1 ? 0 : b, hh = heads == 1 ? 0 : h;
    return data[static_cast<size_t>(((bb * heads + hh) * q_len + i) * kv_len + j)] != 0;
  }
};

// A mask of `shape` (q_len, kv_len) or (batch|1, 1|q_heads, q_len, kv_len) from its bytes in C
// order (nonzero = attend, kept as 0/1); another number of dimensions is InvalidInput naming
// `field` and `source`. Whether the sizes fit a problem is Problem::validate's.
BoolMask bool_mask(const std::vector<int64_t>& shape, std::vector<uint8_t> bytes, std::string source,
                   const std::string& field);

// BigBird's random blocks: R key blocks of B keys per query block of B positions, drawn with
// bigbird_pick() (splitmix64 of the seed, the query block and the draw; scripts/numpy_attention.py
// draws the same ones).
struct BigBird {
  int64_t block = 0;   // B; 0 = off
  int64_t random = 0;  // R (at most the number of key blocks)
  int64_t seed = 0;
  bool on() const { return block > 0 && random > 0; }
};

// The R (or fewer, when there are fewer key blocks) distinct key blocks of query block qb.
std::vector<int64_t> bigbird_pick(const BigBird& bb, int64_t qb, int64_t key_blocks);

// Whether the ANY terms matter: a window or a dilation is given (else a row sees every key
// the ALL terms leave, and sinks, globals and BigBird blocks add nothing).
bool pattern_bounded(const Problem& p);

// The rule of the header comment with its lookup tables (documents, global positions, BigBird
// draws), built once per problem; visible() is then O(1).
class Pattern {
 public:
  // global_rows / global_cols = false: the rule without the global-row (a global position's
  // row sees what any other row sees) or the global-column term; the block map uses it for the
  // rows it runs apart (solo tiles) and the columns it gathers.
  explicit Pattern(const Problem& p, bool global_rows = true, bool global_cols = true);
  bool visible(int64_t b, int64_t h, int64_t i, int64_t j) const;
  // Keys outside hull(b, i) are never visible to row i (a cheap bound for row-wise loops).
  Interval hull(int64_t b, int64_t i) const;
  // The keys row i of (b, h) sees, ascending, into `out` (replaced).
  void keys(int64_t b, int64_t h, int64_t i, std::vector<int64_t>& out) const;

  enum class Block { Empty, Full, Partial };
  // Rows [i0, i1) x keys [j0, j1) of (b, h): Empty or Full only when that is certain for every
  // pair (the keys clipped to Lk), Partial otherwise (decided per element by visible()).
  Block classify(int64_t b, int64_t h, int64_t i0, int64_t i1, int64_t j0, int64_t j1) const;
  // Whether row i of batch b is a global row (its position is global and the ANY terms
  // matter): it sees every key the ALL terms leave.
  bool global_row(int64_t b, int64_t i) const;
  size_t bytes() const;  // its lookup tables

 private:
  const Problem& p_;
  bool bounded_ = false;  // a window or a dilation: the ANY terms matter
  bool global_rows_ = true, global_cols_ = true;
  std::vector<int32_t> doc_;            // document of each index (documents only)
  std::vector<int64_t> doc_start_;      // first index of each document, then q_len
  std::vector<uint8_t> global_;         // per key position (globals only)
  std::vector<int64_t> global_prefix_;  // globals among positions < x
  int64_t query_blocks_ = 0, key_blocks_ = 0;
  std::vector<int64_t> picks_;  // R' sorted key blocks per query block (BigBird only)
  int64_t picks_per_ = 0;
  int64_t off(int64_t b) const;
  int64_t globals_in(int64_t lo, int64_t hi) const;  // global positions in [lo, hi)
  bool picked(int64_t qb, int64_t kb) const;
};

// What a pattern costs, counted once per problem (cached): the FLOP count and the compulsory
// K/V reads of Problem use it.
struct PatternCount {
  int64_t pairs = 0;   // visible (b, h, i, j) pairs
  double kv_keys = 0;  // sum over (b, kv head) of the keys any of its rows sees
};
PatternCount count_pattern(const Problem& p);

// The block classification of a tile kernel whose tasks are (b, kv head, query tile of `br`
// rows starting at multiples of br), rows interleaved rr = r * G + g (src/cpu/kernels/flash.cpp), key
// tiles of kBlockKeys keys at multiples of kBlockKeys.
struct BlockMap {
  static constexpr int64_t kBlockKeys = 64;
  int64_t br = 0, group = 1, query_tiles = 0;
  int64_t variants_b = 1, variants_h = 1;  // the map differs per batch / per kv head only when
                                           // kv_lens or the mask file make it so
  using Entry = BlockEntry;                // interval.hpp
  std::vector<int64_t> start;              // entries of (variant, query tile) t: [start[t], start[t + 1])
  std::vector<Entry> entries;
  std::vector<uint64_t> bits;
  std::vector<uint8_t> row_empty;  // per (variant, query row, g): no visible key at all
  // Query positions run apart (build_block_map's split_globals): a global row sees every key,
  // so in a query tile it would make every key tile partial for all the tile's rows. In their
  // br-row tile their rows get no words (so they widen no panel; a full tile still computes
  // them: dropped, skip()), and the tile follows the rule without the global-row term; they
  // are mapped again together, up to br positions per solo tile: solo tile x is query tile
  // query_tiles + x, positions solo[x * br ...], rows interleaved r * G + g like a br-row
  // tile's, so K and V are read once for all of them. Ascending; the same for every variant.
  std::vector<int64_t> solo;
  // Key positions gathered into one extra key tile (build_block_map's split_globals: the global
  // columns, at most 64): each is one visible key of an otherwise empty 64-key tile, so the
  // tiles follow the rule without the global-column term, and per query tile the gathered
  // tile's words (bit x: key gathered[x]; only keys the tile's own entries do not already
  // give the row) sit at gathered_words[v * tiles() + qt] (-1: no row sees one). The tile
  // kernel copies those K/V rows together once per task.
  std::vector<int64_t> gathered;
  std::vector<int64_t> gathered_words;

  // Query tiles per variant: the br-row tiles, then the solo tiles.
  int64_t solo_tiles() const { return br > 0 ? (static_cast<int64_t>(solo.size()) + br - 1) / br : 0; }
  int64_t tiles() const { return query_tiles + solo_tiles(); }
  // The positions of query tile qt: how many (q_len: the problem's), and the r-th of them.
  int64_t tile_positions(int64_t qt, int64_t q_len) const {
    return qt < query_tiles ? std::min(br, q_len - qt * br)
                            : std::min(br, static_cast<int64_t>(solo.size()) - (qt - query_tiles) * br);
  }
  int64_t position(int64_t qt, int64_t r) const {
    return qt < query_tiles ? qt * br + r : solo[static_cast<size_t>((qt - query_tiles) * br + r)];
  }
  // A solo tile's positions (nullptr for a br-row tile, whose positions are consecutive).
  const int64_t* solo_positions(int64_t qt) const {
    return qt < query_tiles ? nullptr : solo.data() + (qt - query_tiles) * br;
  }
  // Whether position i's rows in their br-row tile are dropped (run alone instead).
  bool skip(int64_t i) const { return !solo.empty() && std::binary_search(solo.begin(), solo.end(), i); }

  // The entries of query tile qt of variant v whose key tiles lie in [j0, j1) (multiples of 64).
  std::pair<const Entry*, const Entry*> entries_in(int64_t v, int64_t qt, int64_t j0, int64_t j1) const;
  // Whether row rr of that query tile sees a key of those entries.
  bool row_sees(int64_t v, int64_t qt, int64_t rr, int64_t j0, int64_t j1) const;
  int64_t variant(int64_t b, int64_t hk) const { return block_variant(variants_b, variants_h, b, hk); }
  size_t bytes() const;
};
// split_globals: run global rows apart, together in solo tiles (BlockMap::solo; not with
// per-batch kv_lens, whose positions move per batch entry) and gather the global columns
// (BlockMap::gathered, when gathered_columns(p) > 0). The tile kernel that asks for it runs
// the extra tiles.
BlockMap build_block_map(const Problem& p, int64_t br, bool split_globals = false);
// How many key positions build_block_map(p, br, true) gathers (sizes the kernel's buffer).
int64_t gathered_columns(const Problem& p);

}  // namespace attnlab
