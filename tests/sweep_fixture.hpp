// The sweep tests' stand-ins (tests/bench/test_sweep.cpp, tests/bench/test_sweep_peers.cpp): kernels that
// fail in planted ways, a peak file so no test measures the machine, and the SweepRun fixture
// with a tiny experiment and the options that run it quickly.
#pragma once

#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "attnlab/isa.hpp"
#include "attnlab/npy.hpp"
#include "attnlab/verify.hpp"
#include "bench/results/files.hpp"
#include "bench/sweep/bench_point.hpp"
#include "bench/results/machine.hpp"
#include "bench/results/results.hpp"
#include "bench/peers/peers.hpp"
#include "peaks/stats.hpp"
#include "bench/sweep/sweep.hpp"
#include "test_util.hpp"

namespace attnlab::bench {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

// naive with one output value perturbed: must be caught by the pre-timing verification.
class Broken final : public Kernel {
 public:
  std::string_view name() const override { return "broken"; }
  std::string_view description() const override { return "test: naive with O[0,0,0,0] off by 0.01"; }
  size_t workspace_bytes(const Problem& p, int t) const override { return find_kernel("naive")->workspace_bytes(p, t); }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    find_kernel("naive")->run(p, in, out, ctx);
    out.o.row(0, 0, 0)[0] += 0.01f;
  }
};

// A kernel that supports nothing.
class Picky final : public Kernel {
 public:
  std::string_view name() const override { return "picky"; }
  std::string_view description() const override { return "test: supports no problem"; }
  Support supports(const Problem&) const override { return Support::no("test kernel supports nothing"); }
  void run(const Problem&, const Inputs&, const Outputs&, RunContext&) const override {}
};

// naive with O[0,0,0,0] = NaN: a failed point whose O error is inf.
class NanOut final : public Kernel {
 public:
  std::string_view name() const override { return "nanout"; }
  std::string_view description() const override { return "test: naive with O[0,0,0,0] = NaN"; }
  size_t workspace_bytes(const Problem& p, int t) const override { return find_kernel("naive")->workspace_bytes(p, t); }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    find_kernel("naive")->run(p, in, out, ctx);
    out.o.row(0, 0, 0)[0] = std::numeric_limits<float>::quiet_NaN();
  }
};

// naive, except that it raises g_doomed_signal (when non-zero) while it runs: a process
// killed in the middle of a point. Set only inside death-test statements, so the parent
// process runs it as naive.
int g_doomed_signal = 0;
class Doomed final : public Kernel {
 public:
  std::string_view name() const override { return "doomed"; }
  std::string_view description() const override { return "test: naive that may kill its process"; }
  size_t workspace_bytes(const Problem& p, int t) const override { return find_kernel("naive")->workspace_bytes(p, t); }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    if (g_doomed_signal != 0) std::raise(g_doomed_signal);
    find_kernel("naive")->run(p, in, out, ctx);
  }
};

// naive that records the most heap memory in use (mallinfo2) while it runs: the moments
// the verification and the timing hold all their buffers.
inline size_t heap_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}
inline size_t g_probe_peak = 0;
class Probe final : public Kernel {
 public:
  std::string_view name() const override { return "probe"; }
  std::string_view description() const override { return "test: naive that samples the heap"; }
  size_t workspace_bytes(const Problem& p, int t) const override { return find_kernel("naive")->workspace_bytes(p, t); }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    g_probe_peak = std::max(g_probe_peak, heap_in_use());
    find_kernel("naive")->run(p, in, out, ctx);
  }
};

// naive whose backward's dK[0,0,0,0] is off by 0.01 (its forward is right): the backward
// point's gradient check must catch it.
class BrokenGrad final : public Kernel {
 public:
  std::string_view name() const override { return "brokengrad"; }
  std::string_view description() const override { return "test: naive with dK[0,0,0,0] off by 0.01"; }
  size_t workspace_bytes(const Problem& p, int t) const override { return naive().workspace_bytes(p, t); }
  const Capabilities& capabilities() const override {
    static constexpr Capabilities k{.backward = true};
    return k;
  }
  size_t backward_workspace_bytes(const Problem& p, int t) const override {
    return naive().backward_workspace_bytes(p, t);
  }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    naive().run(p, in, out, ctx);
  }
  void run_backward(const Problem& p, const Inputs& in, const BackwardInputs& bw, const Gradients& g,
                    RunContext& ctx) const override {
    naive().run_backward(p, in, bw, g, ctx);
    g.dk.row(0, 0, 0)[0] += 0.01f;
  }

 private:
  static const Kernel& naive() { return *find_kernel("naive"); }
};

inline const Broken kBroken;
inline const BrokenGrad kBrokenGrad;
inline const Picky kPicky;
inline const NanOut kNanOut;
inline const Doomed kDoomed;
inline const Probe kProbe;

inline std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/attn_sweep_" + name;
  fs::remove_all(d);
  return d;
}

// A peak file so the tests do not spend time measuring the machine.
inline std::string peak_file() {
  const std::string path = ::testing::TempDir() + "/attn_sweep_peak.json";
  Json rows = Json::array();
  for (int t : {1, 2}) {
    rows.push_back({{"threads", t}, {"fma_flops", 1e11 * t}, {"read_bytes", 1e10}, {"exp_per_s", 1e9}});
  }
  const Json j = {{"schema", "attnlab-peak-1"}, {"simd_arch", "test"}, {"lanes", 16}, {"exp_function", "test"},
                  {"buffer_bytes", 0},          {"repeats", 1},        {"rows", rows}};
  write_file_atomic(path, j.dump());
  return path;
}

struct SweepRun : ::testing::Test {
  std::vector<const Kernel*> kernels = {
      find_kernel("naive"), find_kernel("blocked"), &kBroken, &kPicky, &kNanOut, &kDoomed, &kProbe, &kBrokenGrad};
  std::vector<std::string> names = {"naive", "blocked", "broken", "picky", "nanout", "doomed", "probe", "brokengrad"};
  std::ostringstream log;

  Experiment experiment(const std::string& extra = "") {
    const std::string doc = R"({"description": "tiny", "implementations": ["naive", "blocked"],
        "q_heads": 2, "q_len": [8, 16, 32], "head_dim": 16, "causal": [false, true], "threads": [1, 2],
        "repetitions": 2, "min_time_s": 0.001, "time_cap_s": 30)" +
                            extra + "}";
    return parse_experiment(Json::parse(doc), "tiny", names);
  }
  SweepOptions options(const std::string& dir) {
    SweepOptions o;
    o.out_dir = dir;
    o.kernels = kernels;
    o.peak_json = peak_file();
    // A resumed sweep re-measures the peaks at its end: small and quick here.
    o.peak_buffer_bytes = size_t{4} << 20;
    o.peak_repeats = 1;
    o.all_threads = 2;
    o.progress = &log;
    return o;
  }
  static std::map<std::string, std::string> point_files(const std::string& dir) {
    std::map<std::string, std::string> out;
    for (const auto& f : list_files(points_dir(dir), ".json")) out[f] = read_text_file(points_dir(dir) + "/" + f);
    return out;
  }
  // naive and doomed on one shape: one point each.
  Experiment died_experiment() {
    return parse_experiment(
        Json::parse(R"({"description": "d", "implementations": ["naive", "doomed"], "q_len": 8, "q_heads": 2,
                        "head_dim": 16, "threads": 1, "repetitions": 1, "min_time_s": 0.001})"),
        "died", names);
  }
  static std::string doomed_point_id(const Experiment& e) {
    for (const auto& g : expand(e, 2)) {
      if (g.kernel == "doomed") return g.id();
    }
    return "";
  }
  static std::vector<std::string> csv_lines(const std::string& dir) {
    std::istringstream in(read_text_file(dir + "/results.csv"));
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    return lines;
  }
};

}  // namespace
}  // namespace attnlab::bench
