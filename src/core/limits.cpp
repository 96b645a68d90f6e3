#include "attnlab/limits.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "attnlab/problem.hpp"

namespace attnlab {

namespace {
constexpr const char* kBudgetEnv = "ATTN_MEMORY_BUDGET";

int64_t half_physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  const auto bytes = checked_product({pages, page});
  return bytes ? *bytes / 2 : INT64_MAX;  // unknown: no budget
}

// ATTN_MEMORY_BUDGET's value in bytes; std::nullopt when unset.
std::optional<int64_t> budget_from_env() {
  const char* v = std::getenv(kBudgetEnv);
  if (!v || !*v) return std::nullopt;
  const std::string text = v;
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  int64_t unit = 1;
  const std::string suffix = text.substr(digits);
  if (suffix == "K" || suffix == "k") unit = int64_t{1} << 10;
  if (suffix == "M" || suffix == "m") unit = int64_t{1} << 20;
  if (suffix == "G" || suffix == "g") unit = int64_t{1} << 30;
  if (suffix == "T" || suffix == "t") unit = int64_t{1} << 40;
  const bool suffix_ok = suffix.empty() || unit > 1;
  std::optional<int64_t> bytes;
  if (digits > 0 && digits <= 18 && suffix_ok) {
    bytes = checked_product({std::strtoll(text.substr(0, digits).c_str(), nullptr, 10), unit});
  }
  if (!bytes || *bytes < 1) {
    throw InvalidInput(std::string(kBudgetEnv) + ": '" + text +
                       "' is not a memory size; allowed: a positive number of bytes, optionally "
                       "with a K, M, G or T suffix (powers of 1024), e.g. 512M, at most 2^63 - 1 bytes");
  }
  return bytes;
}
}  // namespace

std::string pow2_text(int64_t limit) {
  int shift = 0;
  while (shift < 62 && (int64_t{1} << shift) < limit) ++shift;
  if ((int64_t{1} << shift) != limit) return std::to_string(limit);
  return "2^" + std::to_string(shift) + " (" + std::to_string(limit) + ")";
}

std::string bytes_text(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  char buf[48];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

int64_t memory_budget_bytes() {
  if (auto b = budget_from_env()) return *b;
  return half_physical_memory();
}

std::string over_memory_budget(int64_t bytes, const std::string& what) {
  const int64_t budget = memory_budget_bytes();
  if (bytes <= budget) return {};
  const bool from_env = budget_from_env().has_value();
  return "needs " + bytes_text(static_cast<double>(bytes)) + " (" + std::to_string(bytes) + " bytes: " + what +
         "), above the memory budget of " + bytes_text(static_cast<double>(budget)) + " (" + std::to_string(budget) +
         " bytes, " +
         (from_env ? std::string("set by ") + kBudgetEnv
                   : std::string("half the physical memory; set ") + kBudgetEnv + " to change it") +
         ")";
}

int all_cores() {
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, static_cast<unsigned>(kMaxThreads)));
}

int thread_count(int64_t n, const std::string& field) {
  if (n == 0) return all_cores();
  if (n < 1 || n > kMaxThreads) {
    throw InvalidInput(field + ": " + std::to_string(n) + " is not allowed; allowed: 1 to " +
                       std::to_string(kMaxThreads) + ", or 0 for all cores");
  }
  return static_cast<int>(n);
}

}  // namespace attnlab
