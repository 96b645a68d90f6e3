// The negative test of tests/checks/check_isa_symbols.py (CMakeLists.txt: IsaSymbols.detects_leaks).
// A tiny program with the leaks the check exists for, and controls that must pass.
#pragma once

namespace fixture {

// An inline function of a shared header, used by a target object (avx2.cpp, built with
// -mavx2 -mfma) and by baseline code (main.cpp). Both objects carry a copy (a COMDAT); the
// linker keeps the first it sees (avx2.cpp is linked first), so main() calls AVX2 code: the
// leak the check must report.
__attribute__((noinline)) inline float shared_sum(const float* x, int n) {
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += x[i] * x[i];
  return s;
}

// A template that runs a callable: instantiated with a lambda of attnlab::avx2, its name
// mentions the target, so it belongs to it (control: must pass).
template <class F>
__attribute__((noinline)) float apply(F f, const float* x, int n) {
  return f(x, n);
}

}  // namespace fixture

namespace attnlab::avx2 {
float sum(const float* x, int n);
float wide(const float* x, int n);
float evex_ymm(const float* x, int n);
float with_lambda(const float* x, int n);
}  // namespace attnlab::avx2
namespace attnlab::avx512 {
float wide(const float* x, int n);
}  // namespace attnlab::avx512
unsigned baseline_clz(unsigned v);
int baseline_popcount(unsigned v);
