// Size arithmetic on untrusted numbers, the lab's size limits and its memory budget, in
// one place. Every element or byte count formed from sizes that came from outside (flags,
// .npy headers, experiment files) goes through checked_product, so a hostile size becomes an
// InvalidInput naming the limit, never a wrapped product.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

namespace attnlab {

// Elements of one tensor (Q, K, V or O): 2^36 floats = 256 GiB, above any machine the lab
// runs on and small enough that every index and byte count below it fits int64 with room.
inline constexpr int64_t kMaxTensorElems = int64_t{1} << 36;
// Query-key pairs, batch * q_heads * q_len * kv_len: keeps pair counts, FLOPs and per-pair
// workspaces (naive's scores, decode's partial states) far inside int64.
inline constexpr int64_t kMaxPairs = int64_t{1} << 56;

// The product of the factors when every factor is >= 0 and the product is at most `limit`;
// std::nullopt otherwise (including when it would overflow int64).
inline std::optional<int64_t> checked_product(std::initializer_list<int64_t> factors, int64_t limit = INT64_MAX) {
  int64_t product = 1;
  for (int64_t f : factors) {
    if (f < 0 || __builtin_mul_overflow(product, f, &product)) return std::nullopt;
  }
  if (product > limit) return std::nullopt;
  return product;
}

// "2^36 (68719476736)": how error messages name a power-of-two limit.
std::string pow2_text(int64_t limit);

// Threads, one rule for every entry point (flags, experiment files, Python, sessions): a run
// takes 1..kMaxThreads; 0 - a flag's and Python's "all cores", an experiment's "all" - means
// all_cores().
inline constexpr int kMaxThreads = 1024;
// Every core: std::thread::hardware_concurrency(), at least 1 (at most kMaxThreads).
int all_cores();
// n as a run takes it: n for 1..kMaxThreads, all_cores() for 0; otherwise InvalidInput naming
// `field` and the allowed values.
int thread_count(int64_t n, const std::string& field = "threads");

// Bytes one run may allocate: ATTN_MEMORY_BUDGET when set (bytes, or with a K, M, G or T
// suffix, powers of 1024), otherwise half the physical memory (what a sweep assumes).
// Throws InvalidInput naming ATTN_MEMORY_BUDGET when its value is malformed.
int64_t memory_budget_bytes();
// Empty when `bytes` fit the budget; otherwise the reason, naming the bytes needed (with
// `what` they are for), the budget and how to change it.
std::string over_memory_budget(int64_t bytes, const std::string& what);
// "64.0 GiB": byte counts in messages.
std::string bytes_text(double bytes);

}  // namespace attnlab
