#include "bench/results/machine.hpp"

#include <sys/utsname.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <set>
#include <sstream>

#include <CLI/Version.hpp>
#include <benchmark/benchmark.h>
#include <tbb/version.h>
#include <xsimd/xsimd.hpp>

#include "attnlab/isa.hpp"

#include "attnlab/kernel.hpp"
#include "attnlab/limits.hpp"

#ifndef ATTN_BUILD_TYPE
#define ATTN_BUILD_TYPE "unknown"
#endif
#ifndef ATTN_BUILD_FLAGS
#define ATTN_BUILD_FLAGS "unknown"
#endif
#ifndef ATTN_BENCHMARK_VERSION
#define ATTN_BENCHMARK_VERSION "unknown"
#endif
#ifndef ATTN_SOURCE_DIR
#define ATTN_SOURCE_DIR "."
#endif

namespace attnlab::bench {

namespace {

// First line of a command's output, trimmed; empty on failure.
std::string command_output(const std::string& cmd) {
  std::string out;
  if (FILE* f = popen(cmd.c_str(), "r")) {
    std::array<char, 512> buf{};
    while (fgets(buf.data(), buf.size(), f)) out += buf.data();
    pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string cpuinfo_field(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "";
}

// The SIMD-related CPU flags (the whole list is long and mostly irrelevant).
std::string simd_flags() {
#if defined(__aarch64__)
  std::istringstream all(cpuinfo_field("Features"));  // AArch64: asimd (NEON), asimdhp, sve, bf16, ...
#else
  std::istringstream all(cpuinfo_field("flags"));
#endif
  std::string f, out;
  while (all >> f) {
    if (f.rfind("avx", 0) == 0 || f == "fma" || f == "f16c" || f.rfind("amx", 0) == 0 || f.rfind("sse", 0) == 0 ||
        f.rfind("asimd", 0) == 0 || f.rfind("sve", 0) == 0 || f == "fphp" || f == "bf16" || f == "i8mm") {
      out += (out.empty() ? "" : " ") + f;
    }
  }
  return out;
}

std::string compiler() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("GCC ") + __VERSION__;
#else
  return "unknown";
#endif
}

}  // namespace

size_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
}

namespace {
std::string local_time(const char* format) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}
}  // namespace

std::string today() { return local_time("%Y-%m-%d"); }

std::string now_iso8601() { return local_time("%Y-%m-%dT%H:%M:%S%z"); }

nlohmann::json describe_machine() {
  nlohmann::json m;
  m["schema"] = "attnlab-machine-1";
  m["date"] = now_iso8601();
  utsname u{};
  if (uname(&u) == 0) {
    m["host"] = u.nodename;
    m["os"] = std::string(u.sysname) + " " + u.release + " " + u.machine;
  }
  m["cpu_model"] = cpuinfo_field("model name");
  m["cores"] = all_cores();
  m["memory_bytes"] = physical_memory_bytes();
  {
    // Other users of the machine slow every figure: record how busy it was.
    std::ifstream la("/proc/loadavg");
    double l1 = 0, l5 = 0, l15 = 0;
    if (la >> l1 >> l5 >> l15) m["load_avg"] = {l1, l5, l15};
  }
  m["virtual_machine"] = cpuinfo_field("flags").find("hypervisor") != std::string::npos;
  {
    // The lab advises its large tensors as huge-page memory (attnlab/tensor.hpp); whether the
    // kernel honours it: "always", "madvise" (yes) or "never" (4 KiB pages).
    std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string modes, mode;
    std::getline(thp, modes);
    if (const auto a = modes.find('['), b = modes.find(']'); a != std::string::npos && b > a)
      mode = modes.substr(a + 1, b - a - 1);
    m["transparent_hugepages"] = mode.empty() ? "unknown" : mode;
  }
  {
    // Instruction-set targets (include/attnlab/isa.hpp): what the SIMD kernels ran with.
    const std::string isa = default_isa();
    nlohmann::json flags = nlohmann::json::object();
    for (const auto& t : built_isas()) flags[t] = isa_flags(t);
    m["isa"] = {{"simd_arch", isa},
                {"float_lanes", isa_lanes(isa)},
                {"default", isa},
                {"targets_built", built_isas()},
                {"targets_cpu_runs", runnable_isas()},
                {"target_flags", flags},
                {"cpu_features", cpu_isa_features()},
                {"cpu_simd_flags", simd_flags()}};
    const CacheSizes& c = cache();
    m["caches"] = {{"l1d_bytes", c.l1d},
                   {"l2_bytes", c.l2},
                   {"l3_bytes", c.l3},
                   {"source", c.source},
                   {"planning_l2_bytes", planning_l2_bytes()}};
  }
  m["compiler"] = compiler();
  m["build_type"] = ATTN_BUILD_TYPE;
  m["flags"] = ATTN_BUILD_FLAGS;
  m["libraries"] = {{"xsimd", std::to_string(XSIMD_VERSION_MAJOR) + "." + std::to_string(XSIMD_VERSION_MINOR) + "." +
                                  std::to_string(XSIMD_VERSION_PATCH)},
                    {"oneTBB", std::string(TBB_VERSION_STRING) + " (runtime " + TBB_runtime_version() + ")"},
                    {"google_benchmark", ATTN_BENCHMARK_VERSION},
                    {"nlohmann_json", std::to_string(NLOHMANN_JSON_VERSION_MAJOR) + "." +
                                          std::to_string(NLOHMANN_JSON_VERSION_MINOR) + "." +
                                          std::to_string(NLOHMANN_JSON_VERSION_PATCH)},
                    {"CLI11", CLI11_VERSION}};
  const std::string src = ATTN_SOURCE_DIR;
  const std::string commit = command_output("git -C '" + src + "' rev-parse HEAD 2>/dev/null");
  const std::string dirty = command_output("git -C '" + src + "' status --porcelain --untracked-files=no 2>/dev/null");
  m["git"] = {{"commit", commit.empty() ? "unknown" : commit}, {"dirty", !dirty.empty()}};
  m["kernels"] = nlohmann::json::array();
  for (const Kernel* k : registry()) {
    const Support a = k->available();
    m["kernels"].push_back({{"name", k->name()},
                            {"description", k->description()},
                            {"available", a.ok},
                            {"why_not", a.reason},
                            {"isa", k->isa()},
                            {"targets", kernel_isas(k->name())}});
  }
  return m;
}

nlohmann::json describe_machine(const Peaks& peaks) {
  nlohmann::json m = describe_machine();
  m["peaks"] = peaks.to_json();
  return m;
}

void add_benchmark_context(const nlohmann::json& m) {
  auto str = [](const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
  benchmark::AddCustomContext("attnlab_cpu_model", str(m.value("cpu_model", "")));
  benchmark::AddCustomContext("attnlab_simd_arch", str(m["isa"]["simd_arch"]));
  benchmark::AddCustomContext("attnlab_compiler", str(m["compiler"]));
  benchmark::AddCustomContext("attnlab_flags", str(m["flags"]));
  benchmark::AddCustomContext("attnlab_build_type", str(m["build_type"]));
  benchmark::AddCustomContext("attnlab_git_commit",
                              str(m["git"]["commit"]) + (m["git"]["dirty"].get<bool>() ? "+dirty" : ""));
  if (m.contains("peaks")) {
    // The default target's peaks (as before per-target peaks), then every target's FMA peak.
    for (const auto& r : m["peaks"]["rows"]) {
      const std::string t = std::to_string(r["threads"].get<int>());
      benchmark::AddCustomContext("attnlab_peak_gflops_t" + t, std::to_string(r["fma_flops"].get<double>() * 1e-9));
      benchmark::AddCustomContext("attnlab_peak_read_gbs_t" + t, std::to_string(r["read_bytes"].get<double>() * 1e-9));
    }
    for (const auto& target : m["peaks"].value("targets", nlohmann::json::array())) {
      for (const auto& r : target["rows"]) {
        benchmark::AddCustomContext(
            "attnlab_peak_gflops_" + target["isa"].get<std::string>() + "_t" + std::to_string(r["threads"].get<int>()),
            std::to_string(r["fma_flops"].get<double>() * 1e-9));
      }
    }
  }
}

}  // namespace attnlab::bench
