// The float lanes of the vector targets (avx512, avx2, neon): xsimd::batch<float> on the target's
// arch and the element-wise operations the kernels use, spelled once. Part of the floor (isa.hpp).
#pragma once

// GCC 12.2 reports -W(maybe-)uninitialized inside the AVX-512 intrinsic headers
// (_mm512_undefined_ps; GCC bug 105593, a false positive) wherever an intrinsic is inlined,
// and attributes it to the including kernel's functions. So the kernels that include the floor
// (and only they) ignore those two diagnostics for the whole translation unit.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <xsimd/xsimd.hpp>

namespace attnlab::ATTN_TARGET_NS::simd {

using Batch = xsimd::batch<float>;
inline constexpr int kLanes = static_cast<int>(Batch::size);
// Fused on every target. xsimd 8.1 has no avx512f fma: it falls back to x * y + z, which GCC contracts
// into vfmadd231ps but clang does not (its default -ffp-contract=on stops at the intrinsics) - so a
// clang build's AVX-512 kernels rounded twice where GCC's round once, and the page bound's bits
// (kv_summary.hpp: the same on every target) differed from the reference's (found by the ASan build).
#if defined(__AVX512F__)
inline Batch fma(Batch a, Batch b, Batch c) { return _mm512_fmadd_ps(a, b, c); }
inline Batch fnma(Batch a, Batch b, Batch c) { return _mm512_fnmadd_ps(a, b, c); }
#else
inline Batch fma(Batch a, Batch b, Batch c) { return xsimd::fma(a, b, c); }
inline Batch fnma(Batch a, Batch b, Batch c) { return xsimd::fnma(a, b, c); }
#endif
inline Batch max(Batch a, Batch b) { return xsimd::max(a, b); }
inline Batch min(Batch a, Batch b) { return xsimd::min(a, b); }
inline Batch abs_of(Batch a) { return xsimd::abs(a); }
inline Batch select(Batch::batch_bool_type m, Batch a, Batch b) { return xsimd::select(m, a, b); }
inline Batch::batch_bool_type mask_and(Batch::batch_bool_type a, Batch::batch_bool_type b) { return a & b; }
inline Batch::batch_bool_type mask_or(Batch::batch_bool_type a, Batch::batch_bool_type b) { return a | b; }
inline Batch nearbyint(Batch x) { return xsimd::nearbyint(x); }
// Sum of all lanes (xsimd 8.1 spells it hadd; 9.0+ renamed it reduce_add).
inline float reduce_sum(Batch v) { return xsimd::hadd(v); }

}  // namespace attnlab::ATTN_TARGET_NS::simd
