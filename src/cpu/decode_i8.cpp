// decode_i8: decode (src/cpu/decode.cpp: key chunks as tasks, every query row of a kv head per
// task, exact merge) with K.Q in integers - the arithmetic a compressed cache's bytes allow.
//
// Idea: a q8_0, q4_0, u8 or u4 cache already holds integer codes. The float decode widens each
// code to float32 (a load, two conversions and a multiply per lane) before its FMA; here each task
// rounds its Q rows to int8 once (round_q_row, kv_quant.hpp: per 32 values for q8_0 / q4_0, per
// row for u8 / u4) and scores every key with vpdpbusd - four byte products per 32-bit lane, exact -
// on the codes as stored, the scales applied after (src/cpu/simd/int8_dot.hpp has the formulas).
// Units: vpdpbusd where the CPU has the target's VNNI (AVX512-VNNI on avx512, AVX-VNNI on avx2),
// else vpmaddubsw + vpmaddwd on the same codes (ATTN_NO_VNNI=1 forces that), the scalar rule on scalar. Softmax and P.V
// are decode's, in float32 (V widened in registers). A task whose Q holds a NaN or Inf scores that task in float32
// (rounding would hide it). Arithmetic: Int8Products (kernel.hpp): held to 4x the textbook's error on the rounded Q,
// plus float32's floor - the cost of rounding Q is derived from the inputs, never chosen. Memory: decode's, plus per
// task (R + 1) rows of Q's integer form (~3.6 bytes per value). Cost: decode's bytes; K.Q's work per 64 values and
// query row is one vpdpbusd (row types) or one vpdpbusd, a conversion and an FMA (block types), against 4 FMAs and the
// widening.
#include "attnlab/kernel.hpp"
#include "cpu/target.hpp"

namespace attnlab::ATTN_TARGET_NS::cpu {

const Kernel& decode_with_int8_scores();  // decode.cpp: the Decode kernel with int8 scores

const Kernel& decode_i8() { return decode_with_int8_scores(); }

}  // namespace attnlab::ATTN_TARGET_NS::cpu
