#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include "cpu/simd/microkernel.hpp"
using namespace attnlab::avx2::simd;
int main(int argc, char** argv) {
  const int d = 128;
  const size_t rows = argc > 2 ? atol(argv[2]) : 262144;  // 128 MiB
  float* k = (float*)aligned_alloc(64, rows * d * 4);
  memset(k, 1, rows * d * 4);
  float* kt = (float*)aligned_alloc(64, d * 64 * 4);
  int pf = argc > 1 ? atoi(argv[1]) : 0;
  for (int rep = 0; rep < 3; ++rep)
    for (int rr = 0; rr < (argc > 3 ? atoi(argv[3]) : 1); ++rr) {
      auto t0 = std::chrono::steady_clock::now();
      for (size_t j = 0; j < rows; j += 64) {
        if (pf)
          prefetch_rows(Rows<float>::strided(k + (j + pf * 64) * d, d, 64), 0, j + (pf + 1) * 64 <= rows ? 64 : 0, d);
        pack_k_transposed(Rows<float>::strided(k + j * d, d, 64), 64, d, kt);
        asm volatile("" ::: "memory");
      }
      auto t1 = std::chrono::steady_clock::now();
      Batch s(0.f);
      for (size_t i = 0; i < rows * d; i += 8) s += Batch::load_aligned(k + i);
      auto t2 = std::chrono::steady_clock::now();
      printf("pack %.1f GB/s   sum %.1f GB/s (%f)\n",
             rows * d * 4 / std::chrono::duration<double>(t1 - t0).count() / 1e9,
             rows * d * 4 / std::chrono::duration<double>(t2 - t1).count() / 1e9, reduce_sum(s));
    }
}
