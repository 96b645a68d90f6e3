// Decode's score kernel (score_rows<4>: 4 query rows against a 64-key tile straight from the K
// rows) on one L1-resident tile, for a float32, bf16 and f16 K: GFLOP/s per K type, best and
// median of ROUNDS rounds with the types interleaved in each round (the host drifts; the order
// within a round does not favour one). Args: [ROUNDS [CALLS]].
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cpu/simd/microkernel.hpp"

using namespace attnlab::avx2::simd;

namespace {
constexpr int kDim = 128, kKeys = 64;

template <class E>
double gflops(int calls) {
  alignas(64) static float q[5 * kDim];
  alignas(64) static E k[kKeys * kDim];
  alignas(64) static float s[4 * kKeys];
  for (int i = 0; i < 5 * kDim; ++i) q[i] = i < 4 * kDim ? 0.001f * static_cast<float>(i % 97) : 0.f;
  for (int i = 0; i < kKeys * kDim; ++i) k[i] = attnlab::from_float<E>(0.0001f * static_cast<float>(i % 101));
  const auto rows = Rows<E>::strided(k, kDim, kKeys);
  NoStep none;
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < calls; ++it) {
    score_rows<4>(q, kDim, q + 4 * kDim, rows, kDim, 0, kKeys, s, none);
    asm volatile("" ::: "memory");
  }
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return 2.0 * 4 * kKeys * kDim * calls / t / 1e9 + 0 * s[1];
}
}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5, calls = argc > 2 ? std::atoi(argv[2]) : 20000;
  std::vector<double> r[3];
  for (int i = 0; i < rounds; ++i) {
    r[0].push_back(gflops<float>(calls));
    r[1].push_back(gflops<attnlab::bf16>(calls));
    r[2].push_back(gflops<attnlab::f16>(calls));
  }
  const char* names[3] = {"f32", "bf16", "f16"};
  for (int t = 0; t < 3; ++t) {
    std::sort(r[t].begin(), r[t].end());
    std::printf("score_rows<4> %s K: best %.1f median %.1f GFLOP/s\n", names[t], r[t].back(), r[t][r[t].size() / 2]);
  }
}
