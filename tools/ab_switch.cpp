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
// runs (results/2026-12-02-ab, -sparse-work) ran the same source as /tmp/ab_switch, with the
// positional arguments and AB_* variables it took before the point schema's flags.
// --pass backward (or forward_backward): the A/B pairs time that pass as the sweep does (the
// sweep's PointFixture: dO random, O and LSE from the kernel's forward, made once per variant).
// Run: build/attn_ab_switch [--efficiency | --thp] PRESET [--pairs P] [--kernel NAME] [--threads T] [--pass P]
//        [the point schema's size, mask and setting flags: --q-len, --kv-len, --head-dim, --q-heads,
//         --dtype, --kv-dtype, --kv-block, --kv-lens, --batch, --layout, --causal, --sinks, ...]
//   PRESET: dense causal window sinks longformer bigbird docs dilated, the shapes of
//   experiments/sparse.json (8 query and 8 kv heads, d 128), or decode: one token against
//   --kv-len keys, 32 query heads, through the decode kernel; the flags replace the preset's
//   values (one value each: the run is one point). --kernel: another kernel of the interface on
//   the same problem (decode_i8, flash_int8, flash_amx with --dtype bf16); default decode for
//   the decode preset, else flash.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "attnlab/kernel.hpp"
#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"
#include "bench/sweep/bench_point.hpp"
#include "bench/sweep/experiment.hpp"
#include "cli/common.hpp"

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

// The presets as experiment keys: experiments/sparse.json's patterns, and decode.
static const nlohmann::json kPresets = {
    {"dense", nlohmann::json::object()},
    {"causal", {{"causal", true}}},
    {"window", {{"causal", true}, {"window", {512, 0}}}},
    {"sinks", {{"causal", true}, {"window", {512, 0}}, {"sinks", 4}}},
    {"longformer", {{"window", {256, 256}}, {"global", {{"spread", 16}}}}},
    {"bigbird", {{"window", {96, 96}}, {"global", {{"spread", 8}}}, {"bigbird", {64, 3, 1}}}},
    {"docs", {{"causal", true}, {"doc_lens", {{"mean", 1024}}}}},
    {"dilated", {{"causal", true}, {"window", {2048, 0}}, {"dilation", 4}}},
    {"decode", {{"q_len", 1}, {"q_heads", 32}, {"causal", true}, {"kv_len", 65536}}},
};

static int run(int argc, char** argv) {
  CLI::App app{"paired A/B calls of one point inside one process (tools/ab_switch.cpp)"};
  bool efficiency = false, thp = false;
  std::string preset, kernel_name, pass = "forward";
  int pairs = 20, threads = 2;
  cli::AxisFlags axes;
  app.add_flag("--efficiency", efficiency, "the pattern against the dense problem of the same n, in turn");
  app.add_flag("--thp", thp, "4 KiB pages against transparent huge pages (root)");
  app.add_option("preset", preset, "dense causal window sinks longformer bigbird docs dilated decode")->required();
  app.add_option("--pairs", pairs, "pairs of calls")->check(CLI::Range(1, 1 << 20));
  app.add_option("--threads", threads, "threads")->check(CLI::Range(1, 1024));
  app.add_option("--kernel", kernel_name, "the kernel (default: decode for the decode preset, else flash)");
  app.add_option("--pass", pass,
                 "forward, backward (dQ, dK, dV from a random dO and the kernel's forward, as the sweep times it) or "
                 "forward_backward");
  axes.add_to(app, {schema::AxisKind::Size, schema::AxisKind::Mask, schema::AxisKind::Setting});
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (!kPresets.contains(preset)) {
    throw InvalidInput("preset: '" + preset +
                       "'; allowed: dense, causal, window, sinks, longformer, bigbird, docs, dilated, decode");
  }
  // One point: the base shape, the preset's keys, then the flags, through the schema's grid.
  nlohmann::json doc = {
      {"description", "ab_switch"}, {"q_heads", 8}, {"kv_heads", 8}, {"q_len", 4096}, {"head_dim", 128},
      {"threads", threads}};
  bench::override_keys(doc, kPresets[preset]);
  bench::override_keys(doc, axes.as_experiment_keys());
  doc["pass"] = pass;  // the schema checks the value
  if (kernel_name.empty()) kernel_name = preset == "decode" ? "decode" : "flash";
  const Kernel& k = kernel_or_throw(kernel_name);
  doc["implementations"] = {kernel_name};
  const std::vector<bench::GridPoint> grid =
      bench::expand(bench::parse_experiment(doc, "ab_switch", {kernel_name}), threads);
  if (grid.size() != 1) {
    throw InvalidInput("the flags name " + std::to_string(grid.size()) + " points; allowed: one value per flag");
  }
  const Problem p = grid[0].problem;
  if (p.pass != Pass::Forward && (efficiency || thp)) {
    throw InvalidInput(std::string(efficiency ? "--efficiency" : "--thp") +
                       ": times the forward pass only; allowed with --pass forward");
  }
  const std::string point = schema::describe_point(schema::PointView{kernel_name, p, threads, "", ""}, k.name());
  std::vector<double> time[2], ratio;
  const auto paired = [&](const auto& once) {
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
        "%s: before %8.2f ms, after %8.2f ms; before/after per pair: median %.3f [q1 %.3f, q3 %.3f] (%d pairs)\n",
        point.c_str(), quantile(time[0], 0.5) * 1e3, quantile(time[1], 0.5) * 1e3, quantile(ratio, 0.5),
        quantile(ratio, 0.25), quantile(ratio, 0.75), pairs);
  };
  if (p.pass != Pass::Forward) {
    // The sweep's fixture per variant (inputs, dO and the forward's O and LSE from the same seed),
    // each made under its variant as the forward's Sessions below are.
    std::unique_ptr<bench::PointFixture> f[2];
    for (int v : {0, 1}) {
      attn_ab_variant = v;
      f[v] = bench::make_fixture(bench::BenchPoint{&k, p, threads, ""}, 1);
    }
    paired([&](int variant) {
      attn_ab_variant = variant;
      const auto t0 = std::chrono::steady_clock::now();
      f[variant]->run_pass();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
    return 0;
  }
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
        "%s: density %.4f, dense %8.2f ms, pattern %8.2f ms (%d calls per pair); "
        "efficiency per pair: median %.3f [q1 %.3f, q3 %.3f] (%d pairs)\n",
        point.c_str(), density, quantile(dt, 0.5) * 1e3, quantile(pt, 0.5) * 1e3, per, quantile(eff, 0.5),
        quantile(eff, 0.25), quantile(eff, 0.75), pairs);
    return 0;
  }
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
  paired(once);
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // a bad flag or shape: the schema's or the problem's own message
    std::fprintf(stderr, "ab_switch: %s\n", e.what());
    return 2;
  }
}
