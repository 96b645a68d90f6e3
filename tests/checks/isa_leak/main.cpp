// Baseline code of the fixture (default flags). Never run: only disassembled.
#include <cstdio>

#include "shared.hpp"

int main(int argc, char**) {
  float x[64];
  for (int i = 0; i < 64; ++i) x[i] = static_cast<float>(i + argc);
  float s = fixture::shared_sum(x, 64);  // the AVX2 copy, kept by the linker
  s += attnlab::avx2::sum(x, 64) + attnlab::avx2::wide(x, 64) + attnlab::avx2::evex_ymm(x, 64) +
       attnlab::avx2::with_lambda(x, 64) + static_cast<float>(baseline_popcount(static_cast<unsigned>(argc))) +
       attnlab::avx512::wide(x, 64) + static_cast<float>(baseline_clz(static_cast<unsigned>(argc)));
  std::printf("%g\n", s);
  return 0;
}
