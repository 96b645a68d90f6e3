// Sparse patterns (include/attnlab/pattern.hpp): the element rule, the block classification,
// the cached pair count and the block map of the tile kernels.
#include "attnlab/pattern.hpp"

#include <algorithm>
#include <optional>
#include <cstring>
#include <map>
#include <mutex>

#include "attnlab/kernel.hpp"
#include "attnlab/problem.hpp"

namespace attnlab {

BoolMask bool_mask(const std::vector<int64_t>& shape, std::vector<uint8_t> bytes, std::string source,
                   const std::string& field) {
  BoolMask m;
  if (shape.size() == 2) {
    m.q_len = shape[0], m.kv_len = shape[1];
  } else if (shape.size() == 4) {
    m.batch = shape[0], m.heads = shape[1], m.q_len = shape[2], m.kv_len = shape[3];
  } else {
    throw InvalidInput(field + ": " + source + " has " + std::to_string(shape.size()) +
                       " dimensions; allowed: 2 (q_len, kv_len) or 4 (batch|1, 1|q_heads, q_len, kv_len)");
  }
  for (uint8_t& x : bytes) x = x != 0;
  m.data = std::move(bytes);
  m.source = std::move(source);
  return m;
}

namespace {

uint64_t mix64(uint64_t x) {  // splitmix64
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

using Block = Pattern::Block;

// ANY of the terms: full if one is full, empty if all are.
Block any_of(Block a, Block b) {
  if (a == Block::Full || b == Block::Full) return Block::Full;
  return a == Block::Partial || b == Block::Partial ? Block::Partial : Block::Empty;
}

// `n` of `total` members of a range are in a set: the range's block status for that term.
Block share(int64_t n, int64_t total) { return n == 0 ? Block::Empty : (n == total ? Block::Full : Block::Partial); }

}  // namespace

std::vector<int64_t> bigbird_pick(const BigBird& bb, int64_t qb, int64_t key_blocks) {
  std::vector<int64_t> out;
  if (!bb.on() || key_blocks < 1) return out;
  const int64_t n = std::min(bb.random, key_blocks);
  const uint64_t base = mix64(static_cast<uint64_t>(bb.seed) + static_cast<uint64_t>(qb));
  for (int64_t r = 0; r < n; ++r) {
    auto kb = static_cast<int64_t>(mix64(base + static_cast<uint64_t>(r)) % static_cast<uint64_t>(key_blocks));
    while (std::find(out.begin(), out.end(), kb) != out.end()) kb = (kb + 1) % key_blocks;  // distinct
    out.push_back(kb);
  }
  std::sort(out.begin(), out.end());
  return out;
}

PatternPlan::PatternPlan(const Problem& p) : problem(p), pattern(problem) {}
size_t PatternPlan::bytes() const { return sizeof(PatternPlan) + pattern.bytes(); }

size_t Pattern::bytes() const {
  return doc_.capacity() * sizeof(int32_t) +
         (doc_start_.capacity() + global_prefix_.capacity() + picks_.capacity()) * sizeof(int64_t) + global_.capacity();
}

Pattern::Pattern(const Problem& p, bool global_rows, bool global_cols)
    : p_(p), global_rows_(global_rows), global_cols_(global_cols) {
  bounded_ = pattern_bounded(p);
  if (!p.doc_lens.empty()) {
    doc_.resize(static_cast<size_t>(p.kv_len));
    int64_t at = 0;
    for (size_t d = 0; d < p.doc_lens.size(); ++d) {
      doc_start_.push_back(at);
      std::fill_n(doc_.begin() + at, p.doc_lens[d], static_cast<int32_t>(d));
      at += p.doc_lens[d];
    }
    doc_start_.push_back(at);
  }
  if (!p.globals.empty()) {
    global_.assign(static_cast<size_t>(p.kv_len), 0);
    for (int64_t g : p.globals) global_[static_cast<size_t>(g)] = 1;
    global_prefix_.assign(static_cast<size_t>(p.kv_len) + 1, 0);
    for (int64_t x = 0; x < p.kv_len; ++x) global_prefix_[x + 1] = global_prefix_[x] + global_[x];
  }
  if (p.bigbird.on()) {
    const int64_t B = p.bigbird.block;
    key_blocks_ = (p.kv_len + B - 1) / B;
    query_blocks_ = (std::max(p.q_len, p.kv_len) + B - 1) / B;  // positions < max(q_len, kv_len)
    picks_per_ = std::min(p.bigbird.random, key_blocks_);
    picks_.reserve(static_cast<size_t>(query_blocks_ * picks_per_));
    for (int64_t qb = 0; qb < query_blocks_; ++qb) {
      const auto v = bigbird_pick(p.bigbird, qb, key_blocks_);
      picks_.insert(picks_.end(), v.begin(), v.end());
    }
  }
}

bool pattern_bounded(const Problem& p) { return p.window_left >= 0 || p.window_right >= 0 || p.dilation > 1; }

bool Pattern::global_row(int64_t b, int64_t i) const {
  const int64_t pos = i + off(b);
  return bounded_ && global_rows_ && !global_.empty() && pos >= 0 && pos < p_.kv_len && global_[pos];
}

int64_t Pattern::off(int64_t b) const { return p_.causal == CausalAlign::TopLeft ? 0 : p_.kv_len_of(b) - p_.q_len; }

int64_t Pattern::globals_in(int64_t lo, int64_t hi) const {
  lo = std::clamp<int64_t>(lo, 0, p_.kv_len), hi = std::clamp<int64_t>(hi, 0, p_.kv_len);
  return hi > lo ? global_prefix_[hi] - global_prefix_[lo] : 0;
}

bool Pattern::picked(int64_t qb, int64_t kb) const {
  if (qb < 0 || qb >= query_blocks_) return false;
  const auto first = picks_.begin() + qb * picks_per_;
  return std::binary_search(first, first + picks_per_, kb);
}

bool Pattern::visible(int64_t b, int64_t h, int64_t i, int64_t j) const {
  if (j < 0 || j >= p_.kv_len_of(b)) return false;
  const int64_t pos = i + off(b);
  // ALL of:
  if (p_.causal != CausalAlign::None && j > pos) return false;
  if (!doc_.empty() && doc_[i] != doc_[j]) return false;
  if (p_.mask && !p_.mask->at(b, h, i, j)) return false;
  if (!bounded_) return true;
  // ANY of: (distances compared, never bounds summed: any bound up to INT64_MAX is safe)
  const int64_t dist = pos - j;  // > 0: a key before the diagonal
  if ((p_.window_left < 0 || dist <= p_.window_left) && (p_.window_right < 0 || -dist <= p_.window_right) &&
      dist % p_.dilation == 0) {
    return true;
  }
  if (j < p_.sinks) return true;
  if (!global_.empty() &&
      ((global_cols_ && global_[j]) || (global_rows_ && pos >= 0 && pos < p_.kv_len && global_[pos]))) {
    return true;
  }
  return !picks_.empty() && pos >= 0 && picked(pos / p_.bigbird.block, j / p_.bigbird.block);
}

Interval Pattern::hull(int64_t b, int64_t i) const {
  Interval iv{0, p_.kv_len_of(b)};
  if (p_.causal != CausalAlign::None) iv.hi = std::clamp<int64_t>(i + off(b) + 1, 0, iv.hi);
  if (!doc_.empty()) {
    iv.lo = std::max(iv.lo, doc_start_[doc_[i]]);
    iv.hi = std::min(iv.hi, doc_start_[doc_[i] + 1]);
  }
  if (iv.lo > iv.hi) iv.lo = iv.hi;
  return iv;
}

void Pattern::keys(int64_t b, int64_t h, int64_t i, std::vector<int64_t>& out) const {
  out.clear();
  const Interval iv = hull(b, i);
  for (int64_t j = iv.lo; j < iv.hi; ++j) {
    if (visible(b, h, i, j)) out.push_back(j);
  }
}

Block Pattern::classify(int64_t b, int64_t h, int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
  (void)h;  // a mask file makes every nonempty block partial: its elements decide
  j1 = std::min(j1, p_.kv_len_of(b));
  if (i0 >= i1 || j0 >= j1) return Block::Empty;
  const int64_t o = off(b), p0 = i0 + o, p1 = i1 - 1 + o, k1 = j1 - 1;  // first/last position, key
  // ALL of: any empty term empties the block; all full terms keep it full.
  bool all_full = !p_.mask;
  if (p_.causal != CausalAlign::None) {
    if (j0 > p1) return Block::Empty;
    all_full = all_full && k1 <= p0;
  }
  if (!doc_.empty()) {
    const int32_t ra = doc_[i0], rz = doc_[i1 - 1], ka = doc_[j0], kz = doc_[k1];
    if (rz < ka || kz < ra) return Block::Empty;
    all_full = all_full && ra == rz && ka == kz && ra == ka;
  }
  if (!bounded_) return all_full ? Block::Full : Block::Partial;

  // ANY of: the window band (distance pos - j in [p0 - k1, p1 - j0]), ...
  const int64_t L = p_.window_left, R = p_.window_right;
  Block any;
  if ((L >= 0 && p0 - k1 > L) || (R >= 0 && j0 - p1 > R)) {
    any = Block::Empty;
  } else if ((L < 0 || p1 - j0 <= L) && (R < 0 || k1 - p0 <= R) && p_.dilation == 1) {
    any = Block::Full;
  } else {
    any = Block::Partial;
  }
  // ... sinks, global columns and rows, BigBird's picked blocks.
  if (p_.sinks > 0) any = any_of(any, share(std::max<int64_t>(0, std::min(j1, p_.sinks) - j0), j1 - j0));
  if (!global_.empty()) {
    if (global_cols_) any = any_of(any, share(globals_in(j0, j1), j1 - j0));
    if (global_rows_) any = any_of(any, share(globals_in(p0, p1 + 1), p1 - p0 + 1));
  }
  if (!picks_.empty() && p1 >= 0) {
    const int64_t B = p_.bigbird.block;
    const int64_t qa = std::max<int64_t>(p0, 0) / B, qz = std::min(p1 / B, query_blocks_ - 1);
    const int64_t ka = j0 / B, kz = k1 / B;
    for (int64_t qb = qa; qb <= qz; ++qb) {
      const auto first = picks_.begin() + qb * picks_per_, last = first + picks_per_;
      const int64_t n = std::upper_bound(first, last, kz) - std::lower_bound(first, last, ka);
      // Full only when one query block holds every row and its picks cover every key.
      const bool whole = qa == qz && p0 >= 0 && n == kz - ka + 1;
      any = any_of(any, n == 0 ? Block::Empty : (whole ? Block::Full : Block::Partial));
    }
  }
  if (any == Block::Empty) return Block::Empty;
  return any == Block::Full && all_full ? Block::Full : Block::Partial;
}

namespace {

// Which (b, q head) pairs have maps of their own, and how many pairs each stands for.
struct Variants {
  int64_t nb = 1, nh = 1, weight_b = 1, weight_h = 1;
  explicit Variants(const Problem& p, int64_t heads) {
    nb = !p.kv_lens.empty() || (p.mask && p.mask->batch > 1) ? p.batch : 1;
    nh = p.mask && p.mask->heads > 1 ? heads : 1;
    weight_b = p.batch / nb, weight_h = heads / nh;
  }
};

PatternCount count_uncached(const Problem& p) {
  const Pattern pat(p);
  const Variants v(p, p.q_heads);
  constexpr int64_t kB = 64;
  PatternCount c;
  std::vector<uint8_t> used(static_cast<size_t>(p.kv_len));
  for (int64_t b = 0; b < v.nb; ++b) {
    const int64_t lk = p.kv_len_of(b);
    int64_t keys_of_group = 0;
    std::fill(used.begin(), used.end(), 0);
    for (int64_t h = 0; h < v.nh; ++h) {
      for (int64_t i0 = 0; i0 < p.q_len; i0 += kB) {
        const int64_t i1 = std::min(i0 + kB, p.q_len);
        for (int64_t j0 = 0; j0 < lk; j0 += kB) {
          const int64_t j1 = std::min(j0 + kB, lk);
          const Block k = pat.classify(b, h, i0, i1, j0, j1);
          if (k == Block::Full) {
            c.pairs += (i1 - i0) * (j1 - j0) * v.weight_b * v.weight_h;
            std::fill(used.begin() + j0, used.begin() + j1, 1);
          } else if (k == Block::Partial) {
            for (int64_t i = i0; i < i1; ++i)
              for (int64_t j = j0; j < j1; ++j)
                if (pat.visible(b, h, i, j)) {
                  c.pairs += v.weight_b * v.weight_h;
                  used[j] = 1;
                }
          }
        }
      }
      // The keys a kv head reads: the union over its query heads (one map per q head only
      // with a per-head mask file; then G consecutive heads share a kv head).
      const int64_t group = p.q_heads / p.kv_heads;
      if (v.nh == 1 || (h + 1) % group == 0) {
        const int64_t n = std::count(used.begin(), used.end(), 1);
        keys_of_group += n * (v.nh == 1 ? p.kv_heads : 1);
        std::fill(used.begin(), used.end(), 0);
      }
    }
    c.kv_keys += static_cast<double>(keys_of_group) * static_cast<double>(v.weight_b);
  }
  return c;
}

uint64_t content_hash(const BoolMask& m) {
  uint64_t h = mix64(static_cast<uint64_t>(m.batch * 31 + m.heads) ^
                     mix64(static_cast<uint64_t>(m.q_len) << 32 ^ static_cast<uint64_t>(m.kv_len)));
  size_t k = 0;
  for (; k + 8 <= m.data.size(); k += 8) {
    uint64_t w;
    std::memcpy(&w, m.data.data() + k, 8);
    h = mix64(h ^ w);
  }
  for (; k < m.data.size(); ++k) h = mix64(h ^ m.data[k]);
  return h;
}

}  // namespace

PatternCount count_pattern(const Problem& p) {
  // Counting is O(blocks + elements of partial blocks): cached, since FLOP and byte counts are
  // asked for many times per point.
  static std::mutex mu;
  static std::map<std::string, PatternCount> cache;
  // Keyed by the mask's contents, not its address: a freed mask's address can come back
  // holding another mask.
  const std::string key = p.describe() + "#" + (p.mask ? std::to_string(content_hash(*p.mask)) : "");
  {
    const std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  const PatternCount c = count_uncached(p);
  const std::lock_guard<std::mutex> lock(mu);
  if (cache.size() > 256) cache.clear();
  cache.emplace(key, c);
  return c;
}

size_t BlockMap::bytes() const {
  return start.size() * sizeof(int64_t) + entries.size() * sizeof(Entry) + bits.size() * sizeof(uint64_t) +
         row_empty.size() + (solo.size() + gathered.size() + gathered_words.size()) * sizeof(int64_t);
}

std::pair<const BlockMap::Entry*, const BlockMap::Entry*> BlockMap::entries_in(int64_t v, int64_t qt, int64_t j0,
                                                                               int64_t j1) const {
  const Entry* first = entries.data() + start[v * tiles() + qt];
  const Entry* last = entries.data() + start[v * tiles() + qt + 1];
  const auto tile_below = [](const Entry& e, int64_t t) { return e.key_tile < t; };
  return {std::lower_bound(first, last, j0 / kBlockKeys, tile_below),
          std::lower_bound(first, last, j1 / kBlockKeys + (j1 % kBlockKeys != 0), tile_below)};
}

bool BlockMap::row_sees(int64_t v, int64_t qt, int64_t rr, int64_t j0, int64_t j1) const {
  const auto [first, last] = entries_in(v, qt, j0, j1);
  for (const Entry* e = first; e != last; ++e) {
    if (e->words < 0 || bits[e->words + rr]) return true;  // a full tile: every row sees all its keys
  }
  return false;
}

int64_t gathered_columns(const Problem& p) {
  const auto n = static_cast<int64_t>(p.globals.size());
  return pattern_bounded(p) && n <= BlockMap::kBlockKeys ? n : 0;
}

BlockMap build_block_map(const Problem& p, int64_t br, bool split_globals) {
  BlockMap m;
  const Pattern full(p);
  if (split_globals && p.kv_lens.empty()) {
    for (int64_t i = 0; i < p.q_len; ++i)
      if (full.global_row(0, i)) m.solo.push_back(i);
  }
  if (split_globals && gathered_columns(p) > 0) m.gathered = p.globals;
  // The tiles follow the rule without global rows / columns when those are split off.
  const Pattern banded(p, m.solo.empty(), m.gathered.empty());
  const int64_t G = p.group();
  m.br = br, m.group = G, m.query_tiles = (p.q_len + br - 1) / br;
  const Variants v(p, p.kv_heads);  // per kv head: a task covers its G query heads
  m.variants_b = v.nb, m.variants_h = v.nh;
  const int64_t kB = BlockMap::kBlockKeys;
  m.row_empty.assign(static_cast<size_t>(v.nb * v.nh * p.q_len * G), 1);
  m.start.push_back(0);
  // One query tile: the br-row tile at i0 by `banded`, or (alone) the solo tile of positions
  // solo[i0 ...] by `full`.
  const auto map_tile = [&](bool alone, int64_t b, int64_t hk, int64_t i0, uint8_t* empty) {
    const Pattern& pat = alone ? full : banded;
    const int64_t n = alone ? std::min(br, static_cast<int64_t>(m.solo.size()) - i0) : std::min(br, p.q_len - i0);
    const int64_t words = G * br;  // whole tiles: a GPU block reads the words of all its rows
    const auto pos = [&](int64_t r) { return alone ? m.solo[static_cast<size_t>(i0 + r)] : i0 + r; };
    const int64_t lk = p.kv_len_of(b);
    for (int64_t j0 = 0; j0 < lk; j0 += kB) {
      const int64_t j1 = std::min(j0 + kB, lk);
      // A br-row tile's rows at once; a solo tile's positions one by one (not consecutive).
      std::optional<Block> k;
      for (int64_t g = 0; g < (v.nh > 1 ? G : 1); ++g) {  // per-head masks: all heads of the group
        for (int64_t r = 0; r < (alone ? n : 1); ++r) {
          const Block kg = alone ? pat.classify(b, hk * G + g, pos(r), pos(r) + 1, j0, j1)
                                 : pat.classify(b, hk * G + g, i0, i0 + n, j0, j1);
          k = !k || *k == kg ? kg : Block::Partial;
        }
      }
      if (*k == Block::Empty) continue;
      if (*k == Block::Full) {
        m.entries.push_back({j0 / kB, -1});
        for (int64_t r = 0; r < n; ++r) std::fill_n(empty + pos(r) * G, G, 0);
        continue;
      }
      const auto at = static_cast<int64_t>(m.bits.size());
      m.bits.resize(m.bits.size() + static_cast<size_t>(words), 0);
      bool any = false;
      for (int64_t r = 0; r < n; ++r) {
        if (!alone && m.skip(i0 + r)) continue;  // dropped from a br-row tile: no keys there
        for (int64_t g = 0; g < G; ++g) {
          uint64_t w = 0;
          for (int64_t j = j0; j < j1; ++j) {
            if (pat.visible(b, hk * G + g, pos(r), j)) w |= uint64_t{1} << (j - j0);
          }
          m.bits[at + r * G + g] = w;
          if (w) any = true, empty[pos(r) * G + g] = 0;
        }
      }
      if (any) {
        m.entries.push_back({j0 / kB, at});
      } else {
        m.bits.resize(static_cast<size_t>(at));
      }
    }
    m.start.push_back(static_cast<int64_t>(m.entries.size()));
    if (m.gathered.empty()) return;
    // The gathered tile: the global columns the full rule shows a row and its tiles do not.
    // (A solo tile follows the full rule in its own tiles: nothing left to gather.)
    const auto at = static_cast<int64_t>(m.bits.size());
    m.bits.resize(m.bits.size() + static_cast<size_t>(words), 0);
    bool any = false;
    for (int64_t r = 0; r < n && !alone; ++r) {
      if (m.skip(i0 + r)) continue;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t h = hk * G + g, i = i0 + r;
        uint64_t w = 0;
        for (size_t x = 0; x < m.gathered.size(); ++x) {
          const int64_t j = m.gathered[x];
          if (full.visible(b, h, i, j) && !banded.visible(b, h, i, j)) w |= uint64_t{1} << x;
        }
        m.bits[at + r * G + g] = w;
        if (w) any = true, empty[i * G + g] = 0;
      }
    }
    if (!any) m.bits.resize(static_cast<size_t>(at));
    m.gathered_words.push_back(any ? at : -1);
  };
  for (int64_t b = 0; b < v.nb; ++b) {
    for (int64_t hk = 0; hk < v.nh; ++hk) {
      uint8_t* empty = m.row_empty.data() + (b * v.nh + hk) * p.q_len * G;
      for (int64_t qt = 0; qt < m.query_tiles; ++qt) {
        map_tile(false, b, hk, qt * br, empty);
      }
      for (int64_t i : m.solo) std::fill(empty + i * G, empty + (i + 1) * G, 1);  // by the whole rule
      for (int64_t x = 0; x < m.solo_tiles(); ++x) map_tile(true, b, hk, x * br, empty);
    }
  }
  return m;
}

}  // namespace attnlab
