// The instruction-set floor: every intrinsic and every instruction-set #if of the CPU kernels
// lives in this folder (tests/checks/check_isa_floor.py fails the build's tests on one outside it).
// The algorithms above it - vec_math.hpp, kv_load.hpp, microkernel.hpp, int8_dot.hpp, the
// tile engine - read as one algorithm for every target: they call the named primitives below
// and choose between a target's unit and the portable rule with `if constexpr` on the
// constants, never with the preprocessor.
//
// One header per target, the same names in each (namespace attnlab::<target>::simd):
//   avx512.hpp   x86-64-v4: AVX-512 F/BW/DQ/VL (+ VNNI by inline asm where the CPU has it)
//   avx2.hpp     x86-64-v3: AVX2, FMA, F16C (+ AVX-VNNI by inline asm where the CPU has it)
//   neon.hpp     AArch64 Advanced SIMD (+ sdot where the CPU has FEAT_DotProd)
//   scalar.hpp   one float per "vector" (the baseline the speed-ups are quoted against)
// with portable.hpp (xsimd-only forms the NEON target shares) and absent.hpp (the x86 vector
// vocabulary a target lacks: declared so the algorithms compile, defined nowhere, so a call
// that its constant did not select out fails to link). Units that are objects of their own:
// avx512_bf16.hpp (vdpbf16ps GEMM blocks) and amx.hpp (the AMX tile blocks).
//
// What each target header defines (the vocabulary; kLanes etc. as in vec_math.hpp's list):
//   kIsaName, kLanes, kVectorRegisters, Batch, fma/fnma/max/min/select/mask_and/mask_or/
//   nearbyint/abs_of, reduce_sum, reduce_max, transpose_sum, load_partial(float), store_partial,
//   keep_bits, load_unaligned(bf16 / f16), detail::scale_or_zero, detail::clamp_hi,
//   detail::scale_nonpositive_or_zero, keep_in_register, trunc_float
//   kRegisterTranspose: FloatReg, transpose_block (kLanes x kLanes in registers)
//   kEvenOddBf16: load_even_odd (2 * kLanes bf16 split into even and odd values)
//   kKvVector: kv_detail's code unpacking (u8/i8/nibble lanes, fp8 words, f16 scales)
//   kI8Vector: i8_detail's integer vocabulary (dot4, slices, group sums, V codes, P codes)
//   kI8Unit, kI8ScoreUnit, kI8Chunk: the integer dot-product unit and its step
//   kI8Sdot: sdot_codes (NEON's integer dot product of one key)
// and object.hpp: kBf16Object, which object this is (the avx512_bf16 object or a dispatch target's).
#pragma once

#ifndef ATTN_TARGET_NS
#error "src/cpu/simd/ is per-target code: include it only from ATTN_TARGET_SOURCES (src/cpu/dispatch/target.hpp)"
#endif

#if defined(ATTN_TARGET_SCALAR)
#include "cpu/simd/isa/scalar.hpp"
#elif defined(__AVX512F__)
#include "cpu/simd/isa/avx512.hpp"
#elif defined(__AVX2__)
#include "cpu/simd/isa/avx2.hpp"
#elif defined(__aarch64__)
#include "cpu/simd/isa/neon.hpp"
#else
#error "no instruction-set floor for this target's flags: build it as the scalar target (ATTN_TARGET_SCALAR)"
#endif

#include "cpu/simd/isa/object.hpp"
