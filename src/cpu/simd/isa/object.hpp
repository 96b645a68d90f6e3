// Which object this is - part of the floor (isa.hpp), with no intrinsic, so a kernel's file that
// includes no vector code can ask: the avx512_bf16 object (CMakeLists.txt's ATTN_BF16_OBJECT;
// flash_bf16, flash_amx, flash_int8_amx) compiles the tile engine and flash's driver once more, for
// its kernels only; the dispatch targets' objects are the others.
#pragma once

namespace attnlab::ATTN_TARGET_NS::simd {
#if defined(ATTN_BF16_OBJECT)
inline constexpr bool kBf16Object = true;
#else
inline constexpr bool kBf16Object = false;
#endif
}  // namespace attnlab::ATTN_TARGET_NS::simd
