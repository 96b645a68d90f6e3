// Helpers shared by the tests.
#pragma once

#include <cstdlib>
#include <string>

#include "attnlab/problem.hpp"

namespace attnlab::test {

inline Problem shape(int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d) {
  Problem p;
  p.batch = b, p.q_heads = hq, p.kv_heads = hkv, p.q_len = sq, p.kv_len = sk, p.head_dim = d;
  return p;
}

// ATTN_TEST_SMALL=1 (set by the sanitizer CI pass) shrinks the grids.
inline bool small_mode() {
  const char* s = std::getenv("ATTN_TEST_SMALL");
  return s && std::string(s) == "1";
}

}  // namespace attnlab::test
