#include <chrono>
#include <cstdio>
#include <cstdlib>
#include "cpu/simd/microkernel.hpp"
using namespace attnlab::avx2::simd;
int main() {
  const int d = 128, dp = 128;
  float* q = (float*)aligned_alloc(64, 6 * d * 4);
  float* kt = (float*)aligned_alloc(64, dp * 64 * 4);
  float* s = (float*)aligned_alloc(64, 6 * 64 * 4);
  float* v = (float*)aligned_alloc(64, 64 * d * 4);
  float* o = (float*)aligned_alloc(64, 6 * dp * 4);
  for (int i = 0; i < 6 * d; ++i) q[i] = 0.001f * i;
  for (int i = 0; i < dp * 64; ++i) kt[i] = 0.0001f * i;
  for (int i = 0; i < 64 * d; ++i) v[i] = 0.0001f * i;
  for (int i = 0; i < 6 * dp; ++i) o[i] = 0;
  for (int i = 0; i < 6 * 64; ++i) s[i] = 0.01f;
  const int N = 200000;
  for (int rep = 0; rep < 2; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < N; ++it) {
      score_panel<6>(q, kt, d, 0, 64, s);
      asm volatile("" ::: "memory");
    }
    auto t1 = std::chrono::steady_clock::now();
    for (int it = 0; it < N; ++it) {
      pv_rows<6>(s, 64, Rows<float>::strided(v, d, 64), o, dp, nullptr, 0, 64, d);
      asm volatile("" ::: "memory");
    }
    auto t2 = std::chrono::steady_clock::now();
    for (int it = 0; it < N; ++it) {
      score_panel<6>(q, kt, d, 0, 64, s);
      asm volatile("" ::: "memory");
      pv_rows<6>(s, 64, Rows<float>::strided(v, d, 64), o, dp, nullptr, 0, 64, d);
      asm volatile("" ::: "memory");
    }
    auto t3 = std::chrono::steady_clock::now();
    printf("interleaved %.1f GFLOP/s\n",
           2 * 2.0 * 6 * 64 * d * N / std::chrono::duration<double>(t3 - t2).count() / 1e9);
    double f = 2.0 * 6 * 64 * d * N;
    printf("score %.1f GFLOP/s  pv %.1f GFLOP/s\n", f / std::chrono::duration<double>(t1 - t0).count() / 1e9,
           f / std::chrono::duration<double>(t2 - t1).count() / 1e9);
  }
  printf("%f %f\n", s[7], o[9]);
}
