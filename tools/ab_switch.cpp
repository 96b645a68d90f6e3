// Paired measurements inside one process, for a host whose speed drifts by 20% over minutes.
// A/B mode: the change under test reads the weak global `attn_ab_variant` (0 = before, 1 =
// after; defined weakly in the source under test only while the experiment lasts, and here),
// and this driver alternates the two on the same session and inputs, call by call, so each
// pair of calls sees the same host. Prints per variant the median time, and the median and
// the quartiles of the per-pair ratio before / after.
// Huge-page mode (--thp): variant 0 runs on inputs in 4 KiB pages, variant 1 on a copy made
// while /sys/kernel/mm/transparent_hugepage/enabled said "always" (set here, then restored;
// root only), same values, same Session.
// Efficiency mode (--efficiency): the pattern against the dense problem of the same n, in
// turn, each pair = one dense call and as many pattern calls as take about as long (their
// median); prints the skipping efficiency dense time x density / pattern time per pair
// (the sparse report's, results/*-sparse), median and quartiles.
//
// Built by CMake as build/attn_ab_switch (tools/, ctest Tools.ab_switch runs it); the committed
// runs (results/2026-12-02-ab, -sparse-work) ran the same source as /tmp/ab_switch.
// Run: build/attn_ab_switch [--efficiency | --thp] PATTERN N LAYOUT [PAIRS] [THREADS] [HEAD_DIM] [Q_HEADS]
//   (PATTERN: dense causal window sinks longformer bigbird docs dilated, the shapes of
//   experiments/sparse.json; 8 kv heads, by default 8 query heads and d 128; or decode: one
//   token against N keys through the decode kernel, by default 32 query heads, with the cache
//   from the environment: AB_KV_DTYPE (q8_0 u8 ...), AB_KV_BLOCK (a paged cache's block),
//   AB_MIXED=1 (8 sequences of 1k..64k keys, kv_lens; N = 65536); for every pattern AB_DTYPE
//   (f32 bf16 f16: the inputs' type) and AB_KERNEL, another kernel than decode / flash on the
//   same problem (decode_i8, flash_int8, flash_amx with AB_DTYPE=bf16))
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "attnlab/dtype.hpp"
#include "attnlab/kernel.hpp"
#include "attnlab/kv_quant.hpp"
#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"

extern "C" __attribute__((weak)) int attn_ab_variant = 1;

using namespace attnlab;

static double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

static double seconds(Session& session, const Tensors& t) {
  const auto t0 = std::chrono::steady_clock::now();
  session.run(t.inputs, t.outputs);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A whole number argument or AB_* value, or an error naming it (atoll would read "x" as 0).
static int64_t whole(const char* text, const char* what, int64_t min) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || text[used] != '\0' || v < min) {
    throw InvalidInput(std::string(what) + ": '" + text + "'; allowed: a whole number >= " + std::to_string(min));
  }
  return v;
}

static int run(int argc, char** argv) {
  const bool efficiency = argc > 1 && std::string(argv[1]) == "--efficiency";
  const bool thp = argc > 1 && std::string(argv[1]) == "--thp";
  if (efficiency || thp) --argc, ++argv;
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: ab_switch [--efficiency | --thp] PATTERN N LAYOUT [PAIRS] [THREADS] [HEAD_DIM] [Q_HEADS]\n");
    return 2;
  }
  const std::string pattern = argv[1];
  const int64_t n = whole(argv[2], "N", 1);
  const int pairs = argc > 4 ? static_cast<int>(whole(argv[4], "PAIRS", 1)) : 20;
  const int threads = argc > 5 ? static_cast<int>(whole(argv[5], "THREADS", 1)) : 2;
  Problem p;
  p.q_heads = p.kv_heads = 8;
  p.q_len = p.kv_len = n;
  p.head_dim = argc > 6 ? whole(argv[6], "HEAD_DIM", 1) : 128;
  if (argc > 7) p.q_heads = whole(argv[7], "Q_HEADS", 1);
  p.layout = parse_layout(argv[3]);
  const auto spread = [&](int k) {
    for (int g = 0; g < k; ++g) p.globals.push_back(g * n / k);
  };
  if (pattern == "causal") {
    p.causal = CausalAlign::BottomRight;
  } else if (pattern == "window" || pattern == "sinks") {
    p.causal = CausalAlign::BottomRight, p.window_left = 512, p.window_right = 0;
    if (pattern == "sinks") p.sinks = 4;
  } else if (pattern == "longformer") {
    p.window_left = p.window_right = 256, spread(16);
  } else if (pattern == "bigbird") {
    p.window_left = p.window_right = 96, spread(8), p.bigbird = BigBird{64, 3, 1};
  } else if (pattern == "docs") {
    p.causal = CausalAlign::BottomRight;
    const int64_t cycle[3] = {512, 1536, 1024};
    for (int64_t at = 0, x = 0; at < n; ++x)
      p.doc_lens.push_back(std::min(cycle[x % 3], n - at)), at += p.doc_lens.back();
  } else if (pattern == "dilated") {
    p.causal = CausalAlign::BottomRight, p.window_left = 2048, p.window_right = 0, p.dilation = 4;
  } else if (pattern == "decode") {  // one token against N keys: decode's kernel, 32 query heads
    p.q_len = 1, p.q_heads = argc > 7 ? p.q_heads : 32;
    p.causal = CausalAlign::BottomRight;
    if (const char* kd = std::getenv("AB_KV_DTYPE")) p.kv_dtype = parse_kv_dtype(kd);
    if (const char* kb = std::getenv("AB_KV_BLOCK")) p.kv_block = whole(kb, "AB_KV_BLOCK", 0);
    if (std::getenv("AB_MIXED")) p.batch = 8, p.kv_lens = {1024, 2048, 4096, 8192, 16384, 32768, 49152, 65536};
  } else if (pattern != "dense") {
    std::fprintf(stderr, "unknown pattern %s\n", pattern.c_str());
    return 2;
  }
  if (const char* dt = std::getenv("AB_DTYPE")) p.dtype = parse_dtype(dt);
  p.validate();
  const char* named = std::getenv("AB_KERNEL");  // another kernel of the same interface (decode_i8, flash_int8)
  const Kernel& k = kernel_or_throw(named ? named : pattern == "decode" ? "decode" : "flash");
  Session session(k, p, threads);
  Tensors t = random_tensors(p, 1);
  if (efficiency) {
    Problem dense = p;
    dense.causal = CausalAlign::None, dense.window_left = dense.window_right = -1, dense.sinks = 0, dense.dilation = 1;
    dense.globals.clear(), dense.doc_lens.clear(), dense.bigbird = BigBird{};
    Session whole(k, dense, threads);
    Tensors td = random_tensors(dense, 1);
    const double density = static_cast<double>(p.visible_pairs()) / static_cast<double>(dense.visible_pairs());
    seconds(session, t), seconds(whole, td);  // warm-up
    const int per = std::max(1, static_cast<int>(seconds(whole, td) / seconds(session, t) + 0.5));
    std::vector<double> eff, dt, pt;
    for (int x = 0; x < pairs; ++x) {
      std::vector<double> mine;
      const double d = seconds(whole, td);
      for (int y = 0; y < per; ++y) mine.push_back(seconds(session, t));
      dt.push_back(d), pt.push_back(quantile(mine, 0.5));
      eff.push_back(d * density / pt.back());
    }
    std::printf(
        "%-10s %6lld %s: density %.4f, dense %8.2f ms, pattern %8.2f ms (%d calls per pair); "
        "efficiency per pair: median %.3f [q1 %.3f, q3 %.3f] (%d pairs)\n",
        pattern.c_str(), static_cast<long long>(n), argv[3], density, quantile(dt, 0.5) * 1e3, quantile(pt, 0.5) * 1e3,
        per, quantile(eff, 0.5), quantile(eff, 0.25), quantile(eff, 0.75), pairs);
    return 0;
  }
  std::vector<double> time[2], ratio;
  std::optional<Tensors> huge;
  if (thp) {
    const char* knob = "/sys/kernel/mm/transparent_hugepage/enabled";
    const auto put = [&](const char* mode) {
      std::FILE* f = std::fopen(knob, "w");
      if (!f || std::fputs(mode, f) < 0 || std::fclose(f) != 0) {
        std::fprintf(stderr, "cannot write %s\n", knob);
        std::exit(1);
      }
    };
    put("always");
    huge.emplace(random_tensors(p, 1));
    put("madvise");
    std::FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
    for (char line[256]; f && std::fgets(line, sizeof line, f);) {
      if (std::string(line).rfind("AnonHugePages", 0) == 0) std::printf("%s", line);
    }
    if (f) std::fclose(f);
  }
  // Each variant runs on a Session made under it: a kernel's plan (a pattern's block map, a
  // dilated window's phases) is made with the Session, and a plan made under the other variant
  // would be rebuilt inside every timed call (or run another way).
  std::optional<Session> before;
  if (!thp) {
    attn_ab_variant = 0;
    before.emplace(k, p, threads);
    attn_ab_variant = 1;
  }
  const auto once = [&](int variant) {
    attn_ab_variant = variant;
    return seconds(variant || thp ? session : *before, thp && variant ? *huge : t);
  };
  once(0), once(1);  // warm-up
  for (int x = 0; x < pairs; ++x) {
    // Alternate which goes first, so a trend inside a pair favours neither.
    const int first = x % 2;
    double s[2];
    s[first] = once(first);
    s[1 - first] = once(1 - first);
    time[0].push_back(s[0]), time[1].push_back(s[1]);
    ratio.push_back(s[0] / s[1]);
  }
  std::printf(
      "%-10s %6lld %s: before %8.2f ms, after %8.2f ms; before/after per pair: median %.3f [q1 %.3f, q3 %.3f] (%d "
      "pairs)\n",
      pattern.c_str(), static_cast<long long>(n), argv[3], quantile(time[0], 0.5) * 1e3, quantile(time[1], 0.5) * 1e3,
      quantile(ratio, 0.5), quantile(ratio, 0.25), quantile(ratio, 0.75), pairs);
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // a bad shape or AB_* value: the problem's own message
    std::fprintf(stderr, "ab_switch: %s\n", e.what());
    return 2;
  }
}
