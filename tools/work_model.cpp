// What the flash kernel computes for a sparse pattern, against what is visible: walks the
// block map (build_block_map, as src/cpu/kernels/flash.cpp builds it) panel by panel the way
// process_panel in src/cpu/engine/tiles.cpp does, and counts per (b, kv head):
//   scores: pairs GEMM 1 computes (MR rows x the 16-key vectors [ja, jb) the panel's rows see;
//           whole tiles when full), pv6: pairs through the MR-row P.V kernel, pv1: pairs through
//           the 1-row kernel, tiles: key tiles packed (one K^T packing each per task), tasks, rows.
// Built by CMake as build/attn_work_model (tools/, ctest Tools.work_model runs it); run:
// build/attn_work_model [PATTERN [N [ROWS_PER_TILE]]] (default bigbird 4096 120).
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "attnlab/problem.hpp"

using namespace attnlab;

struct Count {
  double visits = 0, full_visits = 0, scores = 0, pv6 = 0, pv1 = 0, tiles = 0, tasks = 0, rows = 0, visible = 0;
};

static Count walk(const Problem& p, int64_t br) {
  const BlockMap map = build_block_map(p, br, true);
  const int64_t G = p.group(), MR = 6, lanes = 16;
  Count c;
  for (int64_t qt = 0; qt < map.tiles(); ++qt) {
    const int64_t npos = map.tile_positions(qt, p.q_len), R = npos * G;
    const int64_t gw = map.gathered.empty() ? -1 : map.gathered_words[qt];
    const auto [e0, e1] = map.entries_in(0, qt, 0, p.kv_len);
    c.tasks += 1;
    c.rows += R;
    const int64_t n = (e1 - e0) + (gw >= 0 ? 1 : 0);
    for (int64_t x = 0; x < n; ++x) {
      const bool gathered = x == e1 - e0;
      const uint64_t* words =
          gathered ? map.bits.data() + gw : (e0[x].words < 0 ? nullptr : map.bits.data() + e0[x].words);
      int nk = gathered ? static_cast<int>(map.gathered.size())
                        : static_cast<int>(std::min<int64_t>(64, p.kv_len - e0[x].key_tile * 64));
      if (words && !gathered) {
        uint64_t seen = 0;
        for (int64_t rr = 0; rr < R; ++rr) seen |= words[rr];
        nk = std::min(nk, std::max(1, 64 - std::countl_zero(seen)));
      }
      c.tiles += 1;
      const uint64_t valid = nk == 64 ? ~uint64_t{0} : (uint64_t{1} << nk) - 1;
      for (int64_t r0 = 0; r0 < R; r0 += MR) {
        const int64_t mr = std::min(MR, R - r0);
        uint64_t w[6], common = ~uint64_t{0}, any = 0;
        bool full = true;
        for (int64_t m = 0; m < mr; ++m) {
          w[m] = (words ? words[r0 + m] : ~uint64_t{0}) & valid;
          common &= w[m], any |= w[m];
          full = full && w[m] == ~uint64_t{0};
        }
        // A full tile's rows include a dropped solo position (skip): computed, not visible.
        if (!any) continue;
        c.visits += 1;
        if (full) {
          c.full_visits += 1;
          c.scores += mr * 64, c.pv6 += mr * 64;
          continue;
        }
        const int ja = std::countr_zero(any), jb = 64 - std::countl_zero(any);
        c.scores += mr * lanes * ((jb + lanes - 1) / lanes - ja / lanes);
        c.pv6 += mr * std::popcount(common);
        for (int64_t m = 0; m < mr; ++m) c.pv1 += std::popcount(w[m] & ~common);
      }
    }
  }
  return c;
}

int main(int argc, char** argv) {
  const std::string pattern = argc > 1 ? argv[1] : "bigbird";
  const int64_t n = argc > 2 ? std::atoll(argv[2]) : 4096;
  const int64_t br = argc > 3 ? std::atoll(argv[3]) : 120;
  Problem p;
  p.q_heads = p.kv_heads = 1;
  p.q_len = p.kv_len = n;
  p.head_dim = 128;
  if (pattern == "bigbird") {
    p.window_left = p.window_right = 96;
    for (int g = 0; g < 8; ++g) p.globals.push_back(g * n / 8);
    p.bigbird = BigBird{64, 3, 1};
  } else if (pattern == "longformer") {
    p.window_left = p.window_right = 256;
    for (int g = 0; g < 16; ++g) p.globals.push_back(g * n / 16);
  } else if (pattern == "sinks") {
    p.causal = CausalAlign::BottomRight, p.window_left = 512, p.window_right = 0, p.sinks = 4;
  } else {
    std::fprintf(stderr, "pattern: bigbird | longformer | sinks\n");
    return 2;
  }
  p.validate();
  const Count c = walk(p, br);
  const double vis = static_cast<double>(count_pattern(p).pairs);
  std::printf(
      "%s n %lld br %lld: visible %.0f; scores computed %.3fx visible; P.V %.3fx visible (6-row %.3f, 1-row %.3f);"
      " panel visits per row %.2f (full %.2f), score keys per visit %.1f;"
      " tiles %.0f (%.2f per row-tile of %lld rows: %.1f key tiles, %.1f visible per row); tasks %.0f\n",
      pattern.c_str(), (long long)n, (long long)br, vis, c.scores / vis, (c.pv6 + c.pv1) / vis, c.pv6 / vis,
      c.pv1 / vis, c.visits * 6 / c.rows, c.full_visits * 6 / c.rows, c.scores / c.visits / 6, c.tiles,
      c.tiles / c.tasks, (long long)br, c.tiles / c.tasks, vis / n / 64, c.tasks);
  return 0;
}
