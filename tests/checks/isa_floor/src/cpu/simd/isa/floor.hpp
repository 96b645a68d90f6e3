// The check's fixture: the floor may hold both.
#if defined(__AVX512F__)
#include <immintrin.h>
inline __m512 twice(__m512 x) { return _mm512_add_ps(x, x); }
#endif
