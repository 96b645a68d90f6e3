#include <chrono>
#include <cstdio>
#include <cstdlib>
#include "cpu/simd/microkernel.hpp"
using namespace attnlab::avx512::simd;
int main(int argc, char** argv) {
  const int d = 128, dp = 128, P = 20;
  float* q = (float*)aligned_alloc(64, P * 6 * d * 4);
  float* kt = (float*)aligned_alloc(64, dp * 64 * 4);
  float* s = (float*)aligned_alloc(64, P * 6 * 64 * 4);
  float* v = (float*)aligned_alloc(64, 64 * d * 4);
  float* o = (float*)aligned_alloc(64, P * 6 * dp * 4);
  for (int i = 0; i < P * 6 * d; ++i) q[i] = 0.001f * (i % 1000);
  for (int i = 0; i < dp * 64; ++i) kt[i] = 0.0001f * i;
  for (int i = 0; i < 64 * d; ++i) v[i] = 0.0001f * i;
  for (int i = 0; i < P * 6 * dp; ++i) o[i] = 0;
  for (int i = 0; i < P * 6 * 64; ++i) s[i] = 0.01f;
  const int N = 10000;
  double f = 2 * 2.0 * 6 * 64 * d * N * P;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < N; ++it)
      for (int p = 0; p < P; ++p) {
        score_panel<6>(q + p * 6 * d, kt, d, 0, 64, s + p * 384);
        asm volatile("" ::: "memory");
        pv_rows<6>(s + p * 384, 64, Rows<float>::strided(v, d, 64), o + p * 6 * dp, dp, nullptr, 0, 64, d);
        asm volatile("" ::: "memory");
      }
    auto t1 = std::chrono::steady_clock::now();
    for (int it = 0; it < N; ++it) {
      for (int p = 0; p < P; ++p) {
        score_panel<6>(q + p * 6 * d, kt, d, 0, 64, s + p * 384);
        asm volatile("" ::: "memory");
      }
      for (int p = 0; p < P; ++p) {
        pv_rows<6>(s + p * 384, 64, Rows<float>::strided(v, d, 64), o + p * 6 * dp, dp, nullptr, 0, 64, d);
        asm volatile("" ::: "memory");
      }
    }
    auto t2 = std::chrono::steady_clock::now();
    printf("interleaved %.1f  two-phase %.1f GFLOP/s\n", f / std::chrono::duration<double>(t1 - t0).count() / 1e9,
           f / std::chrono::duration<double>(t2 - t1).count() / 1e9);
  }
  printf("%f %f\n", s[7], o[9]);
}
