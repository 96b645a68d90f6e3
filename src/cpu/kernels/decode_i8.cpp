// decode_i8: decode (src/cpu/kernels/decode.cpp: key chunks as tasks, every query row of a kv head per
// task, exact merge) with K.Q and P.V in integers - the arithmetic a compressed cache's bytes allow.
//
// Idea: a q8_0, q4_0, u8 or u4 cache already holds integer codes. The float decode widens each
// code to float32 (a load, two conversions and a multiply per lane) before its FMA - in both GEMMs.
// K.Q: each task rounds its Q rows to int8 once (round_q_row, kv_quant.hpp: per 32 values for q8_0 /
// q4_0, per row for u8 / u4) and scores every key with vpdpbusd - four byte products per 32-bit lane,
// exact - on the codes as stored, the scales applied after. P.V: on every 64-key tile all the task's
// rows see whole, each row's P times V's scales is rounded to 8-bit codes against the tile's largest
// weight (round_p_tile, kv_quant.hpp; per 32-value block for q8_0 / q4_0), and each output column is
// an exact int32 sum over the tile of P's codes times V's codes as stored (four V rows interleaved
// per vpdpbusd lane), scaled once; partial tiles and tiles with a NaN or Inf weight stay float32.
// src/cpu/simd/int8_dot.hpp has the formulas. Units: vpdpbusd where the CPU has the target's VNNI
// (AVX512-VNNI on avx512, AVX-VNNI on avx2); without it K.Q is vpmaddubsw + vpmaddwd on the same codes
// (ATTN_NO_VNNI=1 forces that) and P.V float32 (P's 255 levels overflow vpmaddubsw's int16 pairs); on
// NEON K.Q is sdot where the CPU has FEAT_DotProd (u8's codes as c - 128, 128 sum q added back; key by
// key, the rule's own combination of the integers), else the rule; P.V the rule's sums on scalar and
// NEON. ATTN_I8_PV=0 keeps P.V float32 (comparisons). Softmax is decode's,
// in float32. A task whose Q holds a NaN or Inf scores that task in float32 (rounding would hide it).
// Arithmetic: Int8Products (kernel.hpp): held to 4x the textbook's error with Q and P rounded by the
// same rules (verify.cpp: int8_cache_errors), plus float32's floor - the cost of rounding is derived
// from the inputs, never chosen. Memory: decode's, plus per task (R + 1) rows of Q's integer form
// (~3.6 bytes per value) and per panel its P codes (64 bytes per row and V scale block, on the stack);
// with 2 panels or more (GQA >= 8), per thread a tile's K as words (K^T, prep_k_words: K.Q a small
// GEMM), with 3 or more its V words and V scales too, made once per tile for every panel (18 KiB at
// d 128; tiles.cpp's prep_i8_tile: 1.09-1.24x at GQA 16, 1.02-1.13x at GQA 8).
// Cost: decode's bytes; per key and 64 values, K.Q is one vpdpbusd per row (row types; block types add
// a conversion and an FMA per 2 vpdpbusd, per 8 on a tile's words), P.V one vpdpbusd per row plus 2
// unpacks per key shared by the rows, against 4 FMAs per row and the widening in each GEMM.
#include "attnlab/kernel.hpp"
#include "cpu/dispatch/target.hpp"

namespace attnlab::ATTN_TARGET_NS::cpu {

const Kernel& decode_with_int8_scores();  // decode.cpp: the Decode kernel with int8 scores

const Kernel& decode_i8() { return decode_with_int8_scores(); }

}  // namespace attnlab::ATTN_TARGET_NS::cpu
