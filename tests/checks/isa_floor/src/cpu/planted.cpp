// The check's fixture (tests/checks/check_isa_floor.py --expect): a kernel file with an instruction-set #if
// and an intrinsic outside the floor. Mentions in comments do not count: _mm512_add_ps(a, b), __m256.
#if defined(__AVX2__)
inline float planted(const float* p) { return _mm256_cvtss_f32(_mm256_loadu_ps(p)); }
#endif
inline const char* name() { return "_mm512_add_ps(x, y) in a string does not count either"; }
