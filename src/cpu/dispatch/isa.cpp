// Targets built, targets this CPU runs, the default target, and the machine's cache sizes
// (include/attnlab/isa.hpp). Baseline code: runs on any CPU of the architecture.
#include "attnlab/isa.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>

#include "attnlab/problem.hpp"
#include "cpu/dispatch/isa_internal.hpp"
#include "cpu/dispatch/target.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#elif defined(__aarch64__)
#include <sys/auxv.h>
#endif

// CMake lists the built targets: ATTN_TARGET_LIST = X(scalar) X(avx2) ... and, per target,
// ATTN_TARGET_FLAGS_<name> (a string).
#ifndef ATTN_TARGET_LIST
#error "ATTN_TARGET_LIST must name the targets (CMakeLists.txt)"
#endif

#define ATTN_DECLARE_TABLE(ns)       \
  namespace attnlab::ns {            \
  const TargetTable& target_table(); \
  }
#define X ATTN_DECLARE_TABLE
ATTN_TARGET_LIST
#undef X
#if defined(ATTN_HAVE_BF16_TARGET)
namespace attnlab::avx512_bf16 {
const Bf16Table& bf16_table();
}
#endif

namespace attnlab {
namespace {

struct Built {
  const TargetTable* table;
  const char* flags;
};

const std::vector<Built>& built() {
#define X(ns) {&ns::target_table(), ATTN_TARGET_FLAGS_##ns},
  static const std::vector<Built> b = {ATTN_TARGET_LIST};
#undef X
  return b;
}

// What the CPU (and the OS, for the AVX register state) supports.
struct Features {
  bool sse2 = false, avx = false, fma = false, f16c = false, avx2 = false, bmi1 = false, bmi2 = false, lzcnt = false,
       movbe = false, avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false, avx512cd = false,
       avx512_bf16 = false, amx_bf16 = false, amx_int8 = false, avx512_vnni = false, avx_vnni = false, neon = false,
       neon_dotprod = false;
  std::string text() const {
    std::string t;
    auto add = [&](bool on, const char* name) {
      if (!on) return;
      if (!t.empty()) t += ' ';
      t += name;
    };
    add(sse2, "sse2");
    add(avx, "avx");
    add(fma, "fma");
    add(f16c, "f16c");
    add(avx2, "avx2");
    add(bmi1, "bmi1");
    add(bmi2, "bmi2");
    add(lzcnt, "lzcnt");
    add(movbe, "movbe");
    add(avx512f, "avx512f");
    add(avx512bw, "avx512bw");
    add(avx512dq, "avx512dq");
    add(avx512vl, "avx512vl");
    add(avx512cd, "avx512cd");
    add(avx512_bf16, "avx512_bf16");
    add(avx512_vnni, "avx512_vnni");
    add(avx_vnni, "avx_vnni");
    add(amx_bf16, "amx_bf16");
    add(amx_int8, "amx_int8");
    add(neon, "neon");
    add(neon_dotprod, "neon_dotprod");
    return t.empty() ? "none detected" : t;
  }
};

Features detect() {
  Features f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  f.sse2 = d & (1u << 26);
  const bool osxsave = c & (1u << 27);
  f.fma = c & (1u << 12);
  f.movbe = c & (1u << 22);
  f.f16c = c & (1u << 29);
  const bool avx_cpu = c & (1u << 28);
  uint64_t xcr0 = 0;
  if (osxsave) {
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (uint64_t{hi} << 32) | lo;
  }
  const bool os_ymm = (xcr0 & 0x6) == 0x6;    // SSE and AVX state
  const bool os_zmm = (xcr0 & 0xe6) == 0xe6;  // plus opmask, ZMM_Hi256, Hi16_ZMM
  f.avx = avx_cpu && os_ymm;
  f.fma = f.fma && f.avx;
  f.f16c = f.f16c && f.avx;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.bmi1 = b & (1u << 3);
    f.avx2 = (b & (1u << 5)) && f.avx;
    f.bmi2 = b & (1u << 8);
    const bool z = os_zmm && f.avx;
    f.avx512f = (b & (1u << 16)) && z;
    f.avx512dq = (b & (1u << 17)) && z;
    f.avx512cd = (b & (1u << 28)) && z;
    f.avx512bw = (b & (1u << 30)) && z;
    f.avx512vl = (b & (1u << 31)) && z;
    // AMX-BF16 (EDX bit 22) with AMX-TILE (bit 24), and the OS saving tile state (XCR0 bits 17
    // XTILECFG, 18 XTILEDATA); Linux also wants a per-process request (src/cpu/kernels/flash_bf16.cpp).
    f.amx_bf16 = (d & (1u << 22)) && (d & (1u << 24)) && (xcr0 & (uint64_t{3} << 17)) == (uint64_t{3} << 17);
    f.amx_int8 = f.amx_bf16 && (d & (1u << 25));  // AMX-INT8 (EDX bit 25), on the same tile state
    f.avx512_vnni = (c & (1u << 11)) && f.avx512f;
    if (a >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) {
      f.avx512_bf16 = (a & (1u << 5)) && f.avx512f;
      f.avx_vnni = (a & (1u << 4)) && f.avx;  // the VEX-encoded vpdpbusd on ymm
    }
  }
  if (__get_cpuid(0x80000001u, &a, &b, &c, &d)) f.lzcnt = c & (1u << 5);
#elif defined(__aarch64__)
  f.neon = true;                                       // Advanced SIMD is part of the AArch64 baseline
  f.neon_dotprod = getauxval(AT_HWCAP) & (1ul << 20);  // HWCAP_ASIMDDP: sdot / udot (FEAT_DotProd)
#endif
  return f;
}

const Features& features() {
  static const Features f = detect();
  return f;
}

bool runs(std::string_view isa, const Features& f) {
  if (isa == "scalar") return true;
  if (isa == "sse2") return f.sse2;
  if (isa == "avx2") {  // x86-64-v3
    return f.avx2 && f.fma && f.f16c && f.bmi1 && f.bmi2 && f.lzcnt && f.movbe;
  }
  if (isa == "avx512") {  // x86-64-v4
    return runs("avx2", f) && f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl && f.avx512cd;
  }
  if (isa == "avx512_bf16") return runs("avx512", f) && f.avx512_bf16;
  // The int8 dot-product units (vpdpbusd) that decode_i8's avx512 / avx2 variants score with.
  if (isa == "avx512_vnni") return runs("avx512", f) && f.avx512_vnni;
  if (isa == "avx_vnni") return runs("avx2", f) && f.avx_vnni;
  if (isa == "amx_bf16") return runs("avx512_bf16", f) && f.amx_bf16;
  if (isa == "amx_int8") return runs("amx_bf16", f) && f.amx_int8;  // flash_int8_amx: int8 and bf16 tiles
  if (isa == "neon") return f.neon;
  if (isa == "neon_dotprod") return f.neon && f.neon_dotprod;  // decode_i8's sdot (int8_dot.hpp)
  return false;
}

std::mutex g_mutex;
std::optional<std::string> g_forced;  // set_default_isa

}  // namespace

std::string isa_names(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& x : names) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::string cannot_run_reason(std::string_view isa) {
  return "this CPU cannot run " + std::string(isa) + "; it runs " + isa_names(runnable_isas()) +
         " (CPU features: " + features().text() + ")";
}

const std::vector<std::string>& built_isas() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const Built& b : built()) n.emplace_back(b.table->isa);
    return n;
  }();
  return names;
}

bool cpu_runs_isa(std::string_view isa) { return runs(isa, features()); }

std::vector<std::string> runnable_isas() {
  std::vector<std::string> r;
  for (const auto& n : built_isas()) {
    if (cpu_runs_isa(n)) r.push_back(n);
  }
  return r;
}

const std::string& best_isa() {
  static const std::string best = [] {
    const auto r = runnable_isas();
    return r.empty() ? std::string("scalar") : r.back();
  }();
  return best;
}

void require_isa(std::string_view isa, std::string_view field) {
  const auto& b = built_isas();
  if (std::find(b.begin(), b.end(), isa) == b.end()) {
    throw InvalidInput(std::string(field) + ": '" + std::string(isa) +
                       "' is not a target of this build; allowed: " + isa_names(b));
  }
  if (!cpu_runs_isa(isa)) {
    throw InvalidInput(std::string(field) + ": " + cannot_run_reason(isa));
  }
}

std::string default_isa() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_forced) return *g_forced;
  }
  if (const char* env = std::getenv("ATTN_ISA"); env && *env) {
    require_isa(env, "ATTN_ISA");
    return env;
  }
  return best_isa();
}

void set_default_isa(std::string_view isa) {
  if (!isa.empty()) require_isa(isa);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (isa.empty()) {
    g_forced.reset();
  } else {
    g_forced = std::string(isa);
  }
}

int isa_lanes(std::string_view isa) {
  const TargetTable* t = target_table_for(isa);
  return t ? t->lanes : 0;
}

std::string isa_flags(std::string_view isa) {
  for (const Built& b : built()) {
    if (isa == b.table->isa) return b.flags;
  }
  return {};
}

std::string cpu_isa_features() { return features().text(); }

const Bf16Table* bf16_table() {
#if defined(ATTN_HAVE_BF16_TARGET)
  return &avx512_bf16::bf16_table();
#else
  return nullptr;
#endif
}

const TargetTable* target_table_for(std::string_view isa) {
  for (const Built& b : built()) {
    if (isa == b.table->isa) return b.table;
  }
  return nullptr;
}

const std::vector<const TargetTable*>& target_tables() {
  static const std::vector<const TargetTable*> t = [] {
    std::vector<const TargetTable*> v;
    for (const Built& b : built()) v.push_back(b.table);
    return v;
  }();
  return t;
}

namespace {

int64_t sysfs_cache(int level, bool data) {
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream lv(dir + "level"), ty(dir + "type"), sz(dir + "size");
    int l = 0;
    std::string type, size;
    if (!(lv >> l) || !(ty >> type) || !(sz >> size)) continue;
    if (l != level || (data ? type == "Instruction" : false)) continue;
    int64_t n = 0;
    size_t pos = 0;
    while (pos < size.size() && size[pos] >= '0' && size[pos] <= '9') n = n * 10 + (size[pos++] - '0');
    if (pos < size.size() && (size[pos] == 'K' || size[pos] == 'k')) n <<= 10;
    if (pos < size.size() && size[pos] == 'M') n <<= 20;
    return n;
  }
  return 0;
}

CacheSizes detect_caches() {
  CacheSizes c;
#if defined(_SC_LEVEL2_CACHE_SIZE)
  c.l1d = std::max<long>(0, sysconf(_SC_LEVEL1_DCACHE_SIZE));
  c.l2 = std::max<long>(0, sysconf(_SC_LEVEL2_CACHE_SIZE));
  c.l3 = std::max<long>(0, sysconf(_SC_LEVEL3_CACHE_SIZE));
  c.source = "sysconf";
#endif
  if (c.l2 <= 0) {
    c.l1d = sysfs_cache(1, true);
    c.l2 = sysfs_cache(2, true);
    c.l3 = sysfs_cache(3, true);
    c.source = "sysfs";
  }
  if (c.l2 <= 0) c.source = "default";
  return c;
}

}  // namespace

const CacheSizes& cache() {
  static const CacheSizes c = detect_caches();
  return c;
}

int64_t planning_l2_bytes() {
  static const int64_t l2 = [] {
    if (const char* env = std::getenv("ATTN_L2_BYTES"); env && *env) {
      char* end = nullptr;
      const long long v = std::strtoll(env, &end, 10);
      if (end && *end == '\0' && v >= (64 << 10) && v <= (int64_t{1} << 32)) return static_cast<int64_t>(v);
      throw InvalidInput("ATTN_L2_BYTES: '" + std::string(env) +
                         "' is not allowed; allowed: 65536 to 4294967296 (bytes)");
    }
    // Clamped: a VM may report an absurd L2 (or a shared one); tiles assume a per-core L2.
    const int64_t l2 = cache().l2 > 0 ? cache().l2 : int64_t{1} << 20;
    return std::clamp<int64_t>(l2, int64_t{256} << 10, int64_t{4} << 20);
  }();
  return l2;
}

}  // namespace attnlab
