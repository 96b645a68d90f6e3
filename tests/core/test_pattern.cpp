// Sparse patterns (include/attnlab/pattern.hpp): the element rule against the interval rule
// and hand-worked cases, the block map and the pair count against the element rule, every
// kernel that runs patterns against the float64 reference over patterns x GQA x layouts x
// kv_lens x dtypes, a pattern against the same pattern as a mask file, planted pattern bugs
// that the check must catch, special values across tile holes, and bad input.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <tuple>
#include <random>

#include "attnlab/kernel.hpp"
#include "attnlab/pattern.hpp"
#include "attnlab/blocks/phases.hpp"
#include "attnlab/verify.hpp"
#include "cuda_emu.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

// Brute force over every element.
int64_t brute_pairs(const Problem& p) {
  const Pattern pat(p);
  int64_t n = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.q_heads; ++h)
      for (int64_t i = 0; i < p.q_len; ++i)
        for (int64_t j = 0; j < p.kv_len; ++j) n += pat.visible(b, h, i, j);
  return n;
}

// A mask file holding exactly p's pattern (per batch and head), built by the element rule.
std::shared_ptr<const BoolMask> as_mask(const Problem& p,
                                        const std::function<bool(int64_t, int64_t, int64_t, int64_t)>& f) {
  auto m = std::make_shared<BoolMask>();
  m->batch = p.batch, m->heads = p.q_heads, m->q_len = p.q_len, m->kv_len = p.kv_len, m->source = "test";
  m->data.resize(static_cast<size_t>(p.batch * p.q_heads * p.q_len * p.kv_len));
  size_t x = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.q_heads; ++h)
      for (int64_t i = 0; i < p.q_len; ++i)
        for (int64_t j = 0; j < p.kv_len; ++j) m->data[x++] = f(b, h, i, j);
  return m;
}

// The same problem with its pattern given only as a mask file (no other sparse term).
Problem mask_only(const Problem& p, const std::function<bool(int64_t, int64_t, int64_t, int64_t)>& f) {
  Problem q = p;
  q.mask = as_mask(p, f);
  q.sinks = 0, q.globals.clear(), q.doc_lens.clear(), q.dilation = 1, q.bigbird = {};
  q.causal = CausalAlign::None, q.window_left = q.window_right = -1;
  return q;
}

struct Named {
  std::string name;
  Problem p;
};
void PrintTo(const Named& n, std::ostream* os) { *os << n.name << " " << n.p.describe(); }

// Patterns over a shape: every term alone and in the combinations the experiments use.
std::vector<Named> patterns(int64_t b, int64_t hq, int64_t hkv, int64_t n, int64_t d) {
  const Problem base = test::shape(b, hq, hkv, n, n, d);
  std::vector<Named> out;
  auto add = [&](const std::string& name, const std::function<void(Problem&)>& f) {
    Problem p = base;
    f(p);
    out.push_back({name, p});
  };
  add("sinks_window_causal", [](Problem& p) { p.causal = CausalAlign::BottomRight, p.window_left = 20, p.sinks = 4; });
  add("longformer", [n](Problem& p) { p.window_left = p.window_right = 9, p.globals = {0, 5, n / 2, n - 1}; });
  add("docs_causal", [n](Problem& p) { p.causal = CausalAlign::BottomRight, p.doc_lens = {n / 3, 1, n - n / 3 - 1}; });
  add("docs_window_sinks", [n](Problem& p) {
    p.doc_lens = {n / 2, n - n / 2}, p.window_left = 11, p.window_right = 2, p.sinks = 3;
  });
  add("dilated", [](Problem& p) { p.causal = CausalAlign::BottomRight, p.window_left = 70, p.dilation = 3; });
  add("dilated_both", [](Problem& p) { p.window_left = 33, p.window_right = 33, p.dilation = 4; });
  add("bigbird", [](Problem& p) { p.window_left = p.window_right = 8, p.globals = {0}, p.bigbird = {16, 2, 5}; });
  add("bigbird_causal_tl", [](Problem& p) {
    p.causal = CausalAlign::TopLeft, p.window_left = 8, p.bigbird = {7, 3, 1};
  });
  add("global_causal_tl", [n](Problem& p) {
    p.causal = CausalAlign::TopLeft, p.window_left = 6, p.globals = {2, n - 3};
  });
  return out;
}

// ---------------------------------------------------------------- the element rule

TEST(PatternRule, IntervalProblemsFollowTheIntervalRule) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    Problem p = test::shape(2, 2, 1, 1 + rng() % 40, 1 + rng() % 40, 8);
    p.causal = static_cast<CausalAlign>(rng() % 3);
    p.window_left = static_cast<int64_t>(rng() % 12) - 1;
    p.window_right = static_cast<int64_t>(rng() % 12) - 1;
    if (rng() % 2) p.kv_lens = {static_cast<int64_t>(rng() % (p.kv_len + 1)), p.kv_len};
    p.validate();
    const Pattern pat(p);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t i = 0; i < p.q_len; ++i) {
        const Interval iv = p.visible(b, i);
        for (int64_t j = 0; j < p.kv_len; ++j)
          ASSERT_EQ(pat.visible(b, 0, i, j), j >= iv.lo && j < iv.hi) << p.describe() << " i=" << i << " j=" << j;
      }
  }
}

TEST(PatternRule, HandWorkedCases) {
  // StreamingLLM: window 4 back + 2 sinks, causal: row 10 sees keys 0, 1 and 6..10.
  Problem p = test::shape(1, 1, 1, 16, 16, 8);
  p.causal = CausalAlign::BottomRight, p.window_left = 4, p.sinks = 2;
  Pattern s(p);
  for (int64_t j = 0; j < 16; ++j) EXPECT_EQ(s.visible(0, 0, 10, j), j < 2 || (j >= 6 && j <= 10)) << j;
  EXPECT_FALSE(s.visible(0, 0, 1, 1 + 1)) << "a sink is never a future key";
  // Longformer: a global row sees every key, a global column is seen by every row.
  p = test::shape(1, 1, 1, 16, 16, 8);
  p.window_left = p.window_right = 1, p.globals = {3};
  Pattern g(p);
  for (int64_t j = 0; j < 16; ++j) EXPECT_TRUE(g.visible(0, 0, 3, j));
  for (int64_t i = 0; i < 16; ++i) EXPECT_TRUE(g.visible(0, 0, i, 3));
  EXPECT_FALSE(g.visible(0, 0, 10, 5));
  // Documents 3 + 5: token 3 (first of the second document) sees only itself under causal.
  p = test::shape(1, 1, 1, 8, 8, 8);
  p.causal = CausalAlign::BottomRight, p.doc_lens = {3, 5};
  Pattern d(p);
  EXPECT_TRUE(d.visible(0, 0, 3, 3));
  EXPECT_FALSE(d.visible(0, 0, 3, 2)) << "no key of the previous document";
  EXPECT_TRUE(d.visible(0, 0, 2, 0));
  // Dilation 3, window 7 back, causal: row 9 sees 9, 6, 3 only.
  p = test::shape(1, 1, 1, 12, 12, 8);
  p.causal = CausalAlign::BottomRight, p.window_left = 7, p.dilation = 3;
  Pattern dl(p);
  for (int64_t j = 0; j < 12; ++j) EXPECT_EQ(dl.visible(0, 0, 9, j), j == 9 || j == 6 || j == 3) << j;
}

TEST(PatternRule, BigBirdPicksAreDistinctSortedAndSeeded) {
  const BigBird bb{16, 3, 11};
  for (int64_t qb = 0; qb < 50; ++qb) {
    const auto v = bigbird_pick(bb, qb, 5);
    ASSERT_EQ(v.size(), 3u);
    EXPECT_TRUE(std::is_sorted(v.begin(), v.end()));
    EXPECT_TRUE(std::adjacent_find(v.begin(), v.end()) == v.end());
    EXPECT_EQ(v, bigbird_pick(bb, qb, 5));
  }
  EXPECT_EQ(bigbird_pick(bb, 0, 2).size(), 2u) << "at most the number of key blocks";
  // Fixed values, the same ones tests/python/test_numpy_attention.py pins for
  // scripts/numpy_attention.py's own bigbird_picks: the two codes draw the same blocks.
  using V = std::vector<int64_t>;
  EXPECT_EQ(bigbird_pick(BigBird{64, 3, 1}, 0, 64), (V{3, 30, 43}));
  EXPECT_EQ(bigbird_pick(BigBird{64, 3, 2}, 0, 64), (V{5, 12, 52}));
  EXPECT_EQ(bigbird_pick(BigBird{16, 3, 11}, 7, 5), (V{0, 2, 4}));
  EXPECT_EQ(bigbird_pick(BigBird{16, 2, 9}, 3, 4), (V{1, 3}));
  EXPECT_EQ(bigbird_pick(BigBird{64, 3, 1}, 0, 2), (V{0, 1}));
}

// ---------------------------------------------------------------- block map and count

std::vector<Problem> varied_patterns() {
  std::vector<Problem> out;
  for (const Named& n : patterns(2, 4, 2, 150, 8)) out.push_back(n.p);
  for (const Named& n : patterns(1, 6, 2, 67, 8)) out.push_back(n.p);
  Problem kv = patterns(3, 2, 1, 130, 8)[0].p;  // sinks + window with padded batches
  kv.kv_lens = {0, 130, 71};
  out.push_back(kv);
  Problem cross = test::shape(2, 4, 2, 40, 200, 8);  // q_len != kv_len
  cross.window_left = 30, cross.globals = {1, 150}, cross.bigbird = {32, 2, 9}, cross.kv_lens = {200, 90};
  out.push_back(cross);
  Problem per_head = test::shape(2, 4, 2, 70, 90, 8);  // a per-head mask file
  std::mt19937_64 rng(5);
  per_head.mask = as_mask(
      per_head, [&](int64_t, int64_t h, int64_t i, int64_t j) { return h == 1 ? (i + j) % 5 == 0 : (rng() % 7 == 0); });
  out.push_back(per_head);
  Problem many = test::shape(1, 2, 2, 150, 150, 8);  // more global rows than one solo tile holds
  many.window_left = many.window_right = 4, many.causal = CausalAlign::BottomRight;
  for (int64_t g = 1; g < 150; g += 9) many.globals.push_back(g);
  out.push_back(many);
  return out;
}

// Every tile of the map against the element rule, with and without split globals: a br-row
// tile's rows (but the solo positions' rows, which it drops) see exactly their keys through its
// entries and its gathered tile, never one key through both; a solo tile's rows (up to br
// global positions together) see all of theirs; emptiness follows the whole rule.
TEST(BlockMap, EveryTileMatchesTheElementRule) {
  int solo_maps = 0, gathered_maps = 0;
  for (const Problem& p : varied_patterns()) {
    p.validate();
    const Pattern pat(p);
    for (bool solo : {false, true})
      for (int64_t br : {6, 24, 31}) {
        const BlockMap m = build_block_map(p, br, solo);
        if (!solo) {
          ASSERT_TRUE(m.solo.empty() && m.gathered.empty());
        }
        solo_maps += !m.solo.empty();
        gathered_maps += !m.gathered.empty();
        for (int64_t i : m.solo) ASSERT_TRUE(pat.global_row(0, i)) << p.describe() << " i=" << i;
        const int64_t G = p.group(), kB = BlockMap::kBlockKeys;
        for (int64_t b = 0; b < p.batch; ++b)
          for (int64_t hk = 0; hk < p.kv_heads; ++hk) {
            const int64_t v = m.variant(b, hk);
            for (int64_t qt = 0; qt < m.tiles(); ++qt) {
              const bool alone = qt >= m.query_tiles;
              const int64_t n = m.tile_positions(qt, p.q_len);
              if (alone) {  // the solo positions, up to br per tile, in order, each once
                ASSERT_EQ(m.solo_positions(qt), m.solo.data() + (qt - m.query_tiles) * br);
                ASSERT_EQ(n, std::min<int64_t>(br, static_cast<int64_t>(m.solo.size()) - (qt - m.query_tiles) * br));
              }
              std::vector<int64_t> words_at((p.kv_len + kB - 1) / kB, -2);  // -2: no entry
              for (int64_t e = m.start[v * m.tiles() + qt]; e < m.start[v * m.tiles() + qt + 1]; ++e) {
                words_at[m.entries[e].key_tile] = m.entries[e].words;
              }
              const int64_t gw = m.gathered.empty() ? -1 : m.gathered_words[v * m.tiles() + qt];
              if (alone) {
                ASSERT_EQ(gw, -1) << "a solo tile gathers nothing";
              }
              for (int64_t r = 0; r < n; ++r) {
                const int64_t i = m.position(qt, r);
                if (!alone && m.skip(i)) {  // run alone: no words here (it widens no panel)
                  for (int64_t w : words_at)
                    for (int64_t g = 0; g < G && w >= 0; ++g) ASSERT_EQ(m.bits[w + r * G + g], 0u) << i;
                  for (int64_t g = 0; g < G && gw >= 0; ++g) ASSERT_EQ(m.bits[gw + r * G + g], 0u) << i;
                  continue;
                }
                for (int64_t g = 0; g < G; ++g) {
                  const int64_t h = hk * G + g;
                  bool any = false;
                  for (int64_t j = 0; j < p.kv_len; ++j) {
                    const bool vis = pat.visible(b, h, i, j);
                    any = any || vis;
                    const int64_t w = words_at[j / kB];
                    const bool in_tiles =
                        w == -1 ? j < p.kv_len_of(b) : (w >= 0 && (m.bits[w + r * G + g] >> (j % kB) & 1));
                    const auto x = std::find(m.gathered.begin(), m.gathered.end(), j) - m.gathered.begin();
                    const bool in_gathered =
                        gw >= 0 && x < static_cast<int64_t>(m.gathered.size()) && (m.bits[gw + r * G + g] >> x & 1);
                    ASSERT_FALSE(in_tiles && in_gathered) << p.describe() << " i=" << i << " j=" << j << " twice";
                    ASSERT_EQ(in_tiles || in_gathered, vis)
                        << p.describe() << " br=" << br << " split=" << solo << " b=" << b << " h=" << h << " i=" << i
                        << " j=" << j << " entry=" << w;
                  }
                  ASSERT_EQ(m.row_empty[(v * p.q_len + i) * G + g] != 0, !any) << p.describe() << " i=" << i;
                }
              }
            }
          }
      }
  }
  EXPECT_GE(solo_maps, 3) << "the cases must include global rows run alone";
  EXPECT_GE(gathered_maps, 3) << "the cases must include gathered global columns";
}

TEST(PatternCount, EqualsTheElementCount) {
  for (const Problem& p : varied_patterns()) {
    EXPECT_EQ(p.visible_pairs(), brute_pairs(p)) << p.describe();
    // kv_keys: per (b, kv head), the keys any of its query heads' rows sees.
    const Pattern pat(p);
    double keys = 0;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t hk = 0; hk < p.kv_heads; ++hk)
        for (int64_t j = 0; j < p.kv_len; ++j) {
          bool seen = false;
          for (int64_t g = 0; g < p.group() && !seen; ++g)
            for (int64_t i = 0; i < p.q_len && !seen; ++i) seen = pat.visible(b, hk * p.group() + g, i, j);
          keys += seen;
        }
    EXPECT_DOUBLE_EQ(p.kv_bytes(), 2.0 * 4 * keys * static_cast<double>(p.head_dim)) << p.describe();
  }
}

// A dilated window's phases (phases.hpp) against the element rule: every row in exactly one
// phase, and a phase's interval rule in its own coordinates sees exactly the keys the pattern
// gives the row, for every alignment, window and length; other sparse terms never decompose.
TEST(DilationPhases, CoverEveryRowOnceAndSeeExactlyThePatternsKeys) {
  int64_t decomposed = 0;
  const int64_t windows[][2] = {{-1, -1}, {5, -1}, {9, 0}, {3, 2}, {0, 0}, {12, 7}};
  for (int64_t D : {2, 3, 4, 7})
    for (const auto& lens : std::vector<std::array<int64_t, 2>>{{1, 1}, {7, 7}, {33, 33}, {64, 64}, {5, 29}, {20, 13}})
      for (CausalAlign c : {CausalAlign::None, CausalAlign::BottomRight, CausalAlign::TopLeft})
        for (const auto& w : windows)
          for (int kv_case = 0; kv_case < 3; ++kv_case) {
            Problem p = test::shape(2, 2, 1, lens[0], lens[1], 8);
            p.dilation = D, p.causal = c, p.window_left = w[0], p.window_right = w[1];
            if (kv_case == 1) p.kv_lens = {p.kv_len, p.kv_len / 2};
            if (kv_case == 2) p.kv_lens = {0, p.kv_len};
            const std::vector<DilationPhase> phases = dilation_phases(p);
            ASSERT_FALSE(phases.empty()) << p.describe();
            ++decomposed;
            const Pattern pat(p);
            std::vector<int> covered(static_cast<size_t>(p.batch * p.q_len), 0);
            for (const DilationPhase& ph : phases) {
              ASSERT_EQ(ph.sub.batch, 1);
              ASSERT_FALSE(ph.sub.sparse());
              const MaskSpec m = ph.sub.mask_for_batch(0);
              for (int64_t ii = 0; ii < ph.sub.q_len; ++ii) {
                const int64_t i = ph.first_q + D * ii;
                ASSERT_LT(i, p.q_len);
                ++covered[static_cast<size_t>(ph.b * p.q_len + i)];
                const Interval iv = m.row(ii);
                for (int64_t j = 0; j < p.kv_len; ++j) {
                  const bool in_phase = j >= ph.first_k && (j - ph.first_k) % D == 0;
                  const int64_t jj = (j - ph.first_k) / D;
                  const bool sub_sees = in_phase && jj < ph.sub.kv_len && jj >= iv.lo && jj < iv.hi;
                  ASSERT_EQ(sub_sees, pat.visible(ph.b, 0, i, j))
                      << p.describe() << " phase b=" << ph.b << " first_q=" << ph.first_q << " i=" << i << " j=" << j;
                }
              }
            }
            for (int v : covered) ASSERT_EQ(v, 1) << p.describe() << ": every row in exactly one phase";
          }
  EXPECT_GT(decomposed, 1000);
  Problem other = test::shape(1, 1, 1, 16, 16, 8);
  other.dilation = 2, other.window_left = 4;
  ASSERT_FALSE(dilation_phases(other).empty());
  for (const auto& add :
       std::vector<std::function<void(Problem&)>>{[](Problem& p) { p.sinks = 1; }, [](Problem& p) { p.globals = {3}; },
                                                  [](Problem& p) {
                                                    p.doc_lens = {8, 8};
                                                  },
                                                  [](Problem& p) {
                                                    p.bigbird = {4, 1, 1};
                                                  },
                                                  [](Problem& p) { p.dilation = 1; }}) {
    Problem q = other;
    add(q);
    EXPECT_TRUE(dilation_phases(q).empty()) << q.describe();
  }
}

// flash's dilated plan on problems with several query tiles per phase and phases of unequal
// length: every (phase, kv head, query tile) is one task, the D phases of a tile index are
// adjacent (the cache-sharing order), and the result still agrees with the float64 reference.
TEST(DilationPhases, FlashTasksCoverEveryTileOnceWithPhasesTogether) {
  const Kernel& flash = *find_kernel("flash");
  for (const auto& [n, D, kv_lens] : std::vector<std::tuple<int64_t, int64_t, std::vector<int64_t>>>{
           {1000, 3, {}}, {725, 4, {725, 301}}, {2000, 7, {}}}) {
    Problem p = test::shape(2, 4, 2, n, n, 32);
    p.causal = CausalAlign::BottomRight, p.window_left = 200, p.dilation = D, p.kv_lens = kv_lens;
    const std::shared_ptr<const Plan> made = flash.make_plan(p);
    const auto* plan = dynamic_cast<const PhasePlan*>(made.get());
    ASSERT_NE(plan, nullptr) << p.describe();
    std::map<std::tuple<int32_t, int32_t, int64_t>, int> seen;
    int64_t want = 0;
    for (const DilationPhase& ph : plan->phases) want += p.kv_heads * ((ph.sub.q_len + plan->br - 1) / plan->br);
    EXPECT_GT(want, static_cast<int64_t>(plan->phases.size()) * p.kv_heads) << "several query tiles per phase";
    ASSERT_EQ(static_cast<int64_t>(plan->tasks.size()), want);
    for (size_t x = 0; x < plan->tasks.size(); ++x) {
      const PhasePlan::Task& t = plan->tasks[x];
      const DilationPhase& ph = plan->phases[static_cast<size_t>(t.phase)];
      ASSERT_LT(t.qt * plan->br, ph.sub.q_len);
      ASSERT_EQ(++seen[std::make_tuple(t.phase, t.hk, t.qt)], 1);
      if (x > 0) {  // the tile index changes only after every phase of the batch entry had it
        const PhasePlan::Task& u = plan->tasks[x - 1];
        if (plan->phases[static_cast<size_t>(u.phase)].b == ph.b && u.hk == t.hk) {
          ASSERT_LE(t.qt, u.qt);
          if (t.qt == u.qt) {
            ASSERT_GT(t.phase, u.phase);
          }
        }
      }
    }
    Tensors ts = random_tensors(p, 3);
    const Agreement a = prepare_agreement(p, ts.inputs, sample_rows(p, 400, 5));
    const KernelCheck c = check_kernel(flash, p, ts.inputs, a, 2);
    EXPECT_EQ(c.verdict, Verdict::Pass) << p.describe() << ": " << c.reason;
  }
}

// ---------------------------------------------------------------- kernels

struct Param {
  const Kernel* kernel;
  std::string name;
  Problem p;
};
void PrintTo(const Param& p, std::ostream* os) { *os << test::variant_name(*p.kernel) << " " << p.p.describe(); }

std::vector<Param> params() {
  std::vector<Named> cases;
  const int64_t heads[][2] = {{1, 1}, {4, 1}, {6, 2}, {8, 8}};
  const int64_t lens[] = {67, 200};
  int x = 0;
  for (int64_t n : lens)
    for (const auto& hh : heads)
      for (Named c : patterns(1 + x % 2, hh[0], hh[1], n, n == 67 ? 40 : 64)) {
        c.name += "_n" + std::to_string(n) + "_h" + std::to_string(hh[0]) + "_" + std::to_string(hh[1]);
        if (x % 3 == 1) c.p.layout = Layout::BSHD, c.name += "_bshd";
        if (x % 4 == 2) c.p.dtype = DType::BF16, c.name += "_bf16";
        if (x % 4 == 3) c.p.dtype = DType::F16, c.name += "_f16";
        if (x % 5 == 4 && c.p.doc_lens.empty() && c.p.batch == 2) {
          c.p.kv_lens = {c.p.kv_len / 2, 0}, c.name += "_kvlens";  // a fully padded sequence too
        }
        ++x;
        cases.push_back(c);
      }
  // Few query rows against many keys (decode's shapes: several key chunks, a direct task in
  // flash), with and without per-batch kv lengths.
  for (int64_t q : {1, 5})
    for (Named c : patterns(2, 8, 2, 1300, 128)) {
      c.p.q_len = q, c.p.doc_lens.clear();
      if (!c.p.sparse()) continue;
      c.name += "_q" + std::to_string(q) + "_k1300";
      if (q == 5) c.p.kv_lens = {1300, 700}, c.name += "_kvlens";
      cases.push_back(c);
    }
  // More global rows than a solo tile holds (flash's Br is at most 240): several solo tiles;
  // more than 64 global columns, so none are gathered, and the query tiles past position 500
  // hold no global row (PatternAsMaskFile compares those bit for bit).
  Named many{"globals_250_n640", test::shape(1, 4, 2, 640, 640, 40)};
  many.p.window_left = many.p.window_right = 3;
  for (int64_t g = 0; g < 500; g += 2) many.p.globals.push_back(g);
  cases.push_back(many);
  std::vector<Param> out;
  for (const Kernel* k : variants()) {
    if (!k->capabilities().patterns) continue;
    for (Named c : cases) {
      const std::optional<DType> d = test::case_dtype(*k, c.p.dtype);
      if (!d) continue;
      if (*d != c.p.dtype) c.p.dtype = *d, c.name += "_as_" + std::string(to_string(*d));
      out.push_back({k, c.name, c.p});
    }
  }
  return out;
}

class PatternAgreement : public ::testing::TestWithParam<Param> {};

TEST_P(PatternAgreement, MatchesFloat64Reference) {
  const Kernel& k = *GetParam().kernel;
  const Problem& p = GetParam().p;
  if (Support a = k.available(); !a) GTEST_SKIP() << a.reason;
  if (Support s = supports_problem(k, p); !s) GTEST_SKIP() << "shape: " << s.reason;  // decode: q_len <= 16
  ASSERT_TRUE(supports_problem(k, p)) << supports_problem(k, p).reason;
  Tensors t = random_tensors(p, 42);
  const Agreement a = prepare_agreement(p, t.inputs, sample_rows(p, 768, 7));
  const KernelCheck c = check_kernel(k, p, t.inputs, a, 2);
  EXPECT_EQ(c.verdict, Verdict::Pass) << p.describe() << ": " << c.reason;
}

INSTANTIATE_TEST_SUITE_P(Patterns, PatternAgreement, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return test::variant_name(*info.param.kernel) + "_" + info.param.name;
                         });

// The same pattern as a mask file: identical outputs (the block words are the same, so the
// arithmetic is too), but where flash splits the globals off (BlockMap::solo, gathered): a
// global row leaves its query tile, global columns move to the gathered tile, so the keys are
// summed in another order; those tiles agree to rounding only. One test per kernel over every
// case.
class PatternAsMaskFile : public ::testing::TestWithParam<const Kernel*> {};

TEST_P(PatternAsMaskFile, GivesIdenticalOutputs) {
  const Kernel& k = *GetParam();
  if (Support a = k.available(); !a) GTEST_SKIP() << a.reason;
  int64_t exact_beside_solo = 0, solo_cases = 0;  // rows compared bit for bit where rows ran alone
  int64_t exact = 0;
  // Rows whose tiles differ (near) agree to float32 rounding; with bf16 products to P's bf16
  // rounding, which happens against the running max, so it depends on the tile order.
  const float near_tol = k.arithmetic() == Arithmetic::F32 ? 1e-5f : 1e-2f;
  int ran = 0;
  for (const Param& c : params()) {
    if (c.kernel != &k || !supports_problem(k, c.p)) continue;
    ++ran;
    const Problem& p = c.p;
    const Pattern pat(p);
    const Problem q = mask_only(p, [&](int64_t b, int64_t h, int64_t i, int64_t j) { return pat.visible(b, h, i, j); });
    Tensors t = random_tensors(p, 9);
    Tensors u = random_tensors(p, 9);
    Session(k, p, 2).run(t.inputs, t.outputs);
    Session(k, q, 2).run(t.inputs, u.outputs);
    const std::shared_ptr<const Plan> plan = k.make_plan(p);
    const auto* made = dynamic_cast<const BlockPlan*>(plan.get());
    const bool phased = dynamic_cast<const PhasePlan*>(plan.get()) != nullptr;
    // a dilated window's phases (other tiles: the keys summed in another order), a gathered
    // tile, or i's query tile holds a solo position
    const auto near = [&](int64_t i) {
      if (phased) return true;
      if (!made) return false;
      if (!made->map.gathered.empty()) return true;
      if (made->map.solo.empty()) return false;
      const int64_t i0 = i / made->map.br * made->map.br;
      const auto it = std::lower_bound(made->map.solo.begin(), made->map.solo.end(), i0);
      return it != made->map.solo.end() && *it < i0 + made->map.br;
    };
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.q_heads; ++h)
        for (int64_t i = 0; i < p.q_len; ++i) {
          const float* x = t.outputs.o.row(b, h, i);
          const float* y = u.outputs.o.row(b, h, i);
          const size_t l = static_cast<size_t>((b * p.q_heads + h) * p.q_len + i);
          for (int64_t d = 0; d < p.head_dim; ++d) {
            if (near(i)) {
              ASSERT_TRUE(x[d] == y[d] || std::fabs(x[d] - y[d]) <= near_tol * std::max(1.f, std::fabs(x[d])))
                  << c.name << " i=" << i << ": " << x[d] << " vs " << y[d];
            } else {
              ASSERT_EQ(x[d], y[d]) << c.name << " b=" << b << " h=" << h << " i=" << i << " d=" << d;
            }
          }
          if (near(i)) {
            const float a = t.outputs.lse[l], z = u.outputs.lse[l];  // -inf == -inf: a fully masked row
            ASSERT_TRUE(a == z || std::fabs(a - z) <= 1e-5f) << c.name << " lse, i=" << i << ": " << a << " vs " << z;
          } else {
            ++exact;
            exact_beside_solo += made && !made->map.solo.empty();
            ASSERT_EQ(t.outputs.lse[l], u.outputs.lse[l]) << c.name << " lse " << l;
          }
        }
    solo_cases += made && !made->map.solo.empty() && made->map.gathered.empty();
  }
  // decode_i8 reads integer caches only: its patterns run in test_kv_quant.cpp's agreement grid.
  if (ran == 0) GTEST_SKIP() << k.name() << " supports none of these float32 pattern cases";
  EXPECT_GT(exact, 0) << "rows compared bit for bit";
  if (solo_cases > 0) {
    EXPECT_GT(exact_beside_solo, 0) << "the tiles without a global row are compared bit for bit";
  }
}

std::vector<const Kernel*> pattern_kernels() {
  std::vector<const Kernel*> out;
  for (const Kernel* k : variants())
    if (k->capabilities().patterns) out.push_back(k);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Kernels, PatternAsMaskFile, ::testing::ValuesIn(pattern_kernels()),
                         [](const ::testing::TestParamInfo<const Kernel*>& info) {
                           return test::variant_name(*info.param);
                         });

// cuda_flash's device code under the host emulation (src/cuda/emu.hpp, no GPU here): every
// pattern over 130 keys (three 64-key map tiles, the last one short), GQA 1, 4 and 8 (the
// map's rows are the block's rows), head_dim 40 (64-row blocks, 64-key steps) and 200 (32-row
// blocks, 16-key steps: four steps per map tile), a padded sequence, bf16, bshd, and the same
// pattern as a mask file (the map's words then come from the file).
std::vector<Named> emulated_cases() {
  std::vector<Named> out;
  const int64_t shapes[][4] = {{1, 1, 1, 40}, {2, 4, 1, 40}, {1, 8, 2, 200}};
  int x = 0;
  for (const auto& s : shapes)
    for (Named c : patterns(s[0], s[1], s[2], 130, s[3])) {
      c.name += "_h" + std::to_string(s[1]) + "_" + std::to_string(s[2]) + "_d" + std::to_string(s[3]);
      if (x % 4 == 1) c.p.layout = Layout::BSHD, c.name += "_bshd";
      if (x % 4 == 2) c.p.dtype = DType::BF16, c.name += "_bf16";
      if (x % 5 == 3 && c.p.doc_lens.empty() && c.p.batch == 2) c.p.kv_lens = {0, 97}, c.name += "_kvlens";
      ++x;
      out.push_back(c);
    }
  Named m = patterns(2, 4, 1, 130, 40)[0];
  const Pattern pat(m.p);
  m.p = mask_only(
      m.p, [&](int64_t b, int64_t h, int64_t i, int64_t j) { return pat.visible(b, h, i, j) && (i + j) % 5 != 0; });
  m.name = "mask_file_h4_1_d40";
  out.push_back(m);
  return out;
}

class PatternEmulatedCuda : public ::testing::TestWithParam<Named> {};

void expect_agrees(const Kernel& k, const Problem& p) {
  ASSERT_TRUE(supports_problem(k, p)) << supports_problem(k, p).reason;
  Tensors t = random_tensors(p, 5);
  const Agreement a = prepare_agreement(p, t.inputs, all_rows(p));
  const KernelCheck c = check_kernel(k, p, t.inputs, a, 1);
  EXPECT_EQ(c.verdict, Verdict::Pass) << p.describe() << ": " << c.reason;
}

TEST_P(PatternEmulatedCuda, MatchesFloat64Reference) { expect_agrees(test::emulated_cuda("flash"), GetParam().p); }

// cuda_flash_bf16's device code on the same patterns, its inputs in bf16 (tensor cores).
TEST_P(PatternEmulatedCuda, Bf16TensorCoresMatchToo) {
  Problem p = GetParam().p;
  p.dtype = DType::BF16;
  if (std::max(p.head_dim, p.dim_v()) > 128) GTEST_SKIP() << "cuda_flash_bf16: head dims up to 128";
  expect_agrees(test::emulated_cuda("flash_bf16"), p);
}

INSTANTIATE_TEST_SUITE_P(Patterns, PatternEmulatedCuda, ::testing::ValuesIn(emulated_cases()),
                         [](const ::testing::TestParamInfo<Named>& info) { return info.param.name; });

TEST(PatternEmulatedCuda, RefusesAGroupThatDoesNotDivideTheBlockAndNaiveRefusesPatterns) {
  Problem p = patterns(1, 6, 2, 130, 40)[0].p;  // G = 3 does not divide 64 rows
  const Support s = supports_problem(test::emulated_cuda("flash"), p);
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason.find("q_heads / kv_heads not dividing the block's rows"), std::string::npos) << s.reason;
  const Support n = supports_problem(test::emulated_cuda("naive"), p);
  ASSERT_FALSE(n);
  EXPECT_NE(n.reason.find("a sparse pattern"), std::string::npos) << n.reason;
}

// ---------------------------------------------------------------- planted bugs

// Naive run on a pattern that differs from the problem's by `wrong` (a mask file of it).
class Planted final : public Kernel {
 public:
  Planted(std::string name, std::function<bool(const Pattern&, int64_t, int64_t, int64_t, int64_t)> wrong)
      : name_(std::move(name)), wrong_(std::move(wrong)) {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return "planted pattern bug"; }
  const Capabilities& capabilities() const override {
    static constexpr Capabilities k{.patterns = true};
    return k;
  }
  size_t workspace_bytes(const Problem& p, int t) const override { return find_kernel("naive")->workspace_bytes(p, t); }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    const Pattern pat(p);
    const Problem q = mask_only(p, [&](int64_t b, int64_t h, int64_t i, int64_t j) { return wrong_(pat, b, h, i, j); });
    find_kernel("naive")->run(q, in, out, ctx);
  }

 private:
  std::string name_;
  std::function<bool(const Pattern&, int64_t, int64_t, int64_t, int64_t)> wrong_;
};

TEST(PatternPlantedBugs, AreCaught) {
  const auto check = [](const Kernel& k, const Problem& p) {
    Tensors t = random_tensors(p, 3);
    const Agreement a = prepare_agreement(p, t.inputs, sample_rows(p, 4096, 1));
    return check_kernel(k, p, t.inputs, a, 1).verdict;
  };
  Problem sinks = test::shape(1, 2, 1, 200, 200, 32);
  sinks.causal = CausalAlign::BottomRight, sinks.window_left = 16, sinks.sinks = 4;
  const Planted sink_off_by_one("sink_off_by_one", [](const Pattern& pat, int64_t b, int64_t h, int64_t i, int64_t j) {
    return pat.visible(b, h, i, j) || (j == 4 && j <= i);
  });
  EXPECT_EQ(check(sink_off_by_one, sinks), Verdict::Fail);

  Problem docs = test::shape(1, 2, 1, 200, 200, 32);
  docs.causal = CausalAlign::BottomRight, docs.doc_lens = {77, 123};
  const Planted doc_leak("document_boundary_leak", [](const Pattern& pat, int64_t b, int64_t h, int64_t i, int64_t j) {
    return pat.visible(b, h, i, j) || (i == 77 && j == 76);  // the next document's first token sees one key back
  });
  EXPECT_EQ(check(doc_leak, docs), Verdict::Fail);

  Problem dil = test::shape(1, 2, 1, 200, 200, 32);
  dil.causal = CausalAlign::BottomRight, dil.window_left = 60, dil.dilation = 4;
  const Planted phase("dilation_phase", [](const Pattern&, int64_t, int64_t, int64_t i, int64_t j) {
    return j <= i && i - j <= 60 && (i - j + 1) % 4 == 0;
  });
  EXPECT_EQ(check(phase, dil), Verdict::Fail);

  // The rule itself passes (the check is not vacuous).
  const Planted honest(
      "honest", [](const Pattern& pat, int64_t b, int64_t h, int64_t i, int64_t j) { return pat.visible(b, h, i, j); });
  EXPECT_EQ(check(honest, sinks), Verdict::Pass);
  EXPECT_EQ(check(honest, docs), Verdict::Pass);
  EXPECT_EQ(check(honest, dil), Verdict::Pass);
}

// ---------------------------------------------------------------- special values

// A NaN in V row j reaches exactly the rows that see key j: flash's partial tiles mask holes
// inside a tile, and a row never multiplies a V row it does not see. Also cuda_flash's device
// code under the emulation.
// decode_i8: int8 products over a cache's integer codes, so it reads q8_0 / q4_0 / u8 / u4 caches
// only (flash_int8, the same arithmetic on a dense problem, reads float32 K and V).
bool test_reads_int_caches_only(const Kernel& k) {
  return k.arithmetic() == Arithmetic::Int8Products && k.capabilities().kv_quant;
}

TEST(PatternSpecialValues, NaNReachesOnlyTheRowsThatSeeIt) {
  std::vector<const Kernel*> kernels = variants();
  kernels.push_back(&test::emulated_cuda("flash"));
  kernels.push_back(&test::emulated_cuda("flash_bf16"));
  for (const Kernel* k : kernels) {
    if (!k->capabilities().patterns || !k->available()) continue;
    // decode_i8 reads integer caches only (no float V to plant a NaN in): test_kv_quant.cpp plants
    // its NaNs in the cache, and runs its patterns.
    if (test_reads_int_caches_only(*k)) continue;
    for (Named c : patterns(1, 2, 1, 150, 16)) {
      c.p.dtype = test::native_dtype(*k);
      if (!supports_problem(*k, c.p)) c.p.q_len = 3, c.p.doc_lens.clear();  // decode: a few rows
      if (!c.p.sparse()) continue;
      if (const Support s = supports_problem(*k, c.p); !s) {  // flash_int8: no global columns or dilation, said so
        EXPECT_TRUE(s.reason.rfind("pattern", 0) == 0 || s.reason.rfind("dilation", 0) == 0)
            << test::variant_name(*k) << " " << c.name << ": " << s.reason;
        continue;
      }
      const Problem& p = c.p;
      const Pattern pat(p);
      for (int64_t j : {int64_t{0}, int64_t{5}, int64_t{63}, int64_t{64}, int64_t{75}, int64_t{149}}) {
        Tensors t = random_tensors(p, 1);
        visit_inputs(t.inputs, [&](const auto& typed) {  // a NaN of the storage type
          using E = std::remove_const_t<std::remove_pointer_t<decltype(typed.v.data)>>;
          E* row = const_cast<E*>(typed.v.row(0, 0, j));
          for (int64_t d = 0; d < p.head_dim; ++d) {
            if constexpr (std::is_same_v<E, float>) {
              row[d] = NAN;
            } else if constexpr (std::is_same_v<E, bf16>) {
              row[d] = to_bf16(NAN);
            } else {
              row[d] = to_f16(NAN);
            }
          }
        });
        Session(*k, p, 2).run(t.inputs, t.outputs);
        for (int64_t h = 0; h < p.q_heads; ++h)
          for (int64_t i = 0; i < p.q_len; ++i) {
            ASSERT_EQ(std::isnan(t.outputs.o.row(0, h, i)[0]), pat.visible(0, h, i, j))
                << test::variant_name(*k) << " " << c.name << " key " << j << " row " << i;
          }
      }
    }
  }
}

// ---------------------------------------------------------------- bad input

TEST(PatternValidation, NamesTheFieldAndTheAllowedValues) {
  const auto fails_with = [](const std::function<void(Problem&)>& f, const std::string& field) {
    Problem p = test::shape(1, 2, 1, 64, 64, 16);
    f(p);
    try {
      p.validate();
    } catch (const InvalidInput& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(field), std::string::npos) << what;
      EXPECT_NE(what.find("allowed"), std::string::npos) << what;
      return;
    }
    ADD_FAILURE() << field << ": accepted";
  };
  fails_with([](Problem& p) { p.sinks = 4; }, "sinks");  // no window: every key is visible already
  fails_with([](Problem& p) { p.window_left = 4, p.sinks = -1; }, "sinks");
  fails_with([](Problem& p) { p.window_left = 4, p.globals = {5, 3}; }, "global[1]");
  fails_with([](Problem& p) { p.window_left = 4, p.globals = {64}; }, "global[0]");
  fails_with([](Problem& p) { p.doc_lens = {30, 30}; }, "doc_lens");
  fails_with([](Problem& p) { p.doc_lens = {0, 64}; }, "doc_lens[0]");
  fails_with([](Problem& p) { p.dilation = 0; }, "dilation");
  fails_with([](Problem& p) { p.window_left = 4, p.bigbird = {0, 2, 1}; }, "bigbird");
  fails_with([](Problem& p) { p.window_left = 4, p.bigbird = {16, 65, 1}; }, "bigbird");
  fails_with([](Problem& p) { p.bigbird = {16, 2, 1}; }, "bigbird");
  fails_with(
      [](Problem& p) {
        auto m = std::make_shared<BoolMask>();
        m->q_len = 64, m->kv_len = 63, m->data.resize(64 * 63), m->source = "m.npy";
        p.mask = m;
      },
      "mask");
  fails_with(
      [](Problem& p) {
        auto m = std::make_shared<BoolMask>();
        m->heads = 3, m->q_len = 64, m->kv_len = 64, m->data.resize(3 * 64 * 64), m->source = "m.npy";
        p.mask = m;
      },
      "mask");
}

TEST(PatternValidation, OtherKernelsRefuseWithTheReason) {
  Problem p = test::shape(1, 2, 1, 4, 64, 16);
  p.window_left = 4, p.sinks = 2;
  for (const Kernel* k : variants()) {
    if (!k->available()) continue;  // (a target this CPU cannot run is never asked)
    p.dtype = test::native_dtype(*k);
    p.kv_dtype = test_reads_int_caches_only(*k) ? KvDType::U8 : KvDType::Same;  // its caches
    const Support s = supports_problem(*k, p);
    EXPECT_EQ(static_cast<bool>(s), k->capabilities().patterns) << k->name() << ": " << s.reason;
    if (!s) {
      EXPECT_NE(s.reason.find("sparse pattern"), std::string::npos) << s.reason;
    }
  }
}

}  // namespace
}  // namespace attnlab
