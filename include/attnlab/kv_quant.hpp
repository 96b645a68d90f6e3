// Quantized KV caches: the byte layouts CPU inference runtimes store K and V in, and the one
// rule per layout for writing (quantize_row, kv_quant.cpp) and reading (kv_read.hpp, inline) a
// cache row. Every kernel that reads a quantized cache, the float64 reference and the textbook
// baseline read it by that one rule (flash and decode in registers per target,
// src/cpu/simd/kv_load.hpp, the same values), so agreement is judged on the dequantized K/V with
// the float32 tolerance.
//
// A cache row is one (batch, kv head, token) row of head_dim values:
//   q8_0      ggml's block_q8_0: per 32 values an f16 scale d and 32 int8 q; x = d * q.
//             34 bytes per 32 values. Written by quantize_row_q8_0_ref's rule: d = amax / 127,
//             q = roundf(x / d) (0 when d = 0).
//   q4_0      ggml's block_q4_0: per 32 values an f16 scale d and 16 bytes; byte j holds value j
//             in its low nibble and value j + 16 in its high one; x = d * (nibble - 8). 18 bytes
//             per 32 values. Written by quantize_row_q4_0_ref's rule: m = the value of largest
//             magnitude, d = m / -8, nibble = min(15, (int8)(x / d + 8.5)).
//             A cache llama.cpp wrote (--cache-type-k q8_0 / q4_0) reads as it is.
//   u8, u4    per row a float32 scale and a float32 zero point, then the values (u4: two per
//             byte, the even one in the low nibble); x = (q - zp) * scale. Written
//             asymmetrically over the row's range (OpenVINO's CPU KV cache, per token and head):
//             scale = (max - min) / 255 (15), 1 for a constant row; zp = -min / scale;
//             q = clamp(round(x / scale + zp), 0, 255 (15)). 8 + d (8 + d / 2) bytes.
//   fp8_e4m3  OCP FP8 E4M3 (no infinities, max 448) and E5M2 (IEEE-like, max 57344), one byte
//   fp8_e5m2  per value, times a per-tensor float32 scale (vLLM's fp8 cache; the lab writes
//             scale 1, vLLM's default without calibration). Written by rounding x / scale to
//             nearest even, saturating finite values past the maximum (E4M3 also saturates
//             infinities); NaN stays NaN.
// Special values: a NaN or Inf among a q8_0 / q4_0 block's values or a u8 / u4 row's values is
// written as a NaN scale (ggml writes Inf for Inf: either way the block reads back as NaN);
// a scale of 0 is an all-zero block, as ggml's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attnlab/dtype.hpp"

namespace attnlab {

// How K and V are stored: as Q's dtype (Same), or in one of the quantized layouts above.
enum class KvDType : uint8_t { Same, Q8_0, Q4_0, U8, U4, Fp8E4M3, Fp8E5M2 };

const char* to_string(KvDType t);                   // "dtype", "q8_0", "q4_0", "u8", "u4", "fp8_e4m3", "fp8_e5m2"
KvDType parse_kv_dtype(const std::string& text);    // throws InvalidInput naming the allowed names
const std::vector<KvDType>& quantized_kv_dtypes();  // every type but Same, in the order above

// Values per block along head_dim (32 for q8_0 / q4_0; 1 for the others: any head_dim).
int64_t kv_block_values(KvDType t);
// Bytes of one cache row of `dim` values (dim a multiple of kv_block_values(t)).
int64_t kv_row_bytes(KvDType t, int64_t dim);

// One row: `dim` floats -> kv_row_bytes(t, dim) bytes, and back. `tensor_scale` is the fp8
// types' per-tensor scale (ignored by the others).
void quantize_row(KvDType t, const float* x, int64_t dim, std::byte* out, float tensor_scale = 1.0f);
void dequantize_row(KvDType t, const std::byte* row, int64_t dim, float* y, float tensor_scale = 1.0f);
// A cache row as a cache of kv_dtype `t` over inputs of `dtype` stores it: quantize_row for a
// quantized cache, else the values rounded to `dtype` (nearest even; float32 copied) - where a
// runtime appends a token (generate's cache, the Python module's write_kv). load_row reads it back.
void store_row(KvDType t, DType dtype, const float* x, int64_t dim, std::byte* out, float tensor_scale = 1.0f);
void load_row(KvDType t, DType dtype, const std::byte* row, int64_t dim, float* y, float tensor_scale = 1.0f);

// Q for integer K.Q (Arithmetic::Int8Products, decode_i8) over the caches with integer codes
// (kv_int_dot: q8_0, q4_0, u8, u4). A Q row is rounded to int8 per block of q_block_values
// values - 32 for q8_0 / q4_0, matching K's blocks (ggml's Q8_0 with a float32 scale); the whole
// row for u8 / u4, whose one scale and zero point per K row fold through sum(q) - symmetrically:
// scale = amax / 127, q = roundf(x / scale), 0 when the scale is 0; |q| <= 127. The value Q
// then multiplies is q * scale. A row holding a NaN or an Inf has no such rounding (returns false,
// q and scales unspecified): it is multiplied unrounded, in float32. The kernel and the tolerance
// baseline (verify.cpp) both round by this one function.
bool kv_int_dot(KvDType t);
int64_t q_block_values(KvDType t, int64_t dim);
bool round_q_row(KvDType t, const float* x, int64_t dim, int8_t* q, float* scales);
// The rounding itself, per block of `block` values (round_q_row with its block size).
bool round_int8(const float* x, int64_t dim, int64_t block, int8_t* q, float* scales);

// decode_i8's P.V on an integer cache (Arithmetic::Int8Products): per query row, 64-key tile the
// row sees whole, and V scale block (the row for u8 / u4, each 32 values for q8_0 / q4_0), the
// weights w_j = p_j x key j's V scale are rounded against the largest |w| of the tile, wmax:
// code_j = nearbyint(w_j x (L / wmax)) (float32, half to even), then clamped to [0, L] or [-L, L];
// w_j then multiplies as code_j x (wmax / L), the quantum. L = 255 for the types whose V scales are
// >= 0 (u8, u4, q8_0: the codes are unsigned bytes), 127 with a sign for q4_0 (its d = m / -8 takes
// either sign). wmax = 0: codes 0, quantum 0. false when a w is NaN or Inf, negative for the
// unsigned codes (a q8_0 block another writer stored with d < 0), or all below FLT_MIN x L (L / wmax
// overflows): that tile multiplies in float32. Rounding against the tile's own largest weight makes the codes
// independent of the running max the weights are taken against (a common factor cancels), so the tolerance baseline
// (verify.cpp) rounds its own P by this rule and gets the kernel's codes. The kernel (every
// target, bit for bit: src/cpu/simd/int8_dot.hpp) and the baseline both use it.
bool p_codes_signed(KvDType t);
bool round_p_tile(const float* w, int64_t n, bool is_signed, int32_t* codes, float* quantum);

// flash_int8's K (SageAttention's smoothing, Arithmetic::Int8Products on a dense problem): a
// (batch, kv head)'s key rows minus their mean over the sequence's keys [0, kv_len of the batch
// entry) - every score of a query row then moves by the same q.mean, which softmax does not see
// (the LSE does: the kernel adds it back to each score) - each rounded to int8 per row by round_int8. key_mean: the
// mean, summed in double and rounded to float once; false when a value is NaN or Inf (the head then multiplies in
// float32). n = 0: the mean is 0. rows: n rows of dim floats, ld apart. round_smoothed_key: x - mean in float32, then
// round_int8 over the row; K then multiplies as mean + q * scale; false when x - mean overflows (the head multiplies in
// float32). The kernel and the tolerance baseline (verify.cpp) both use these two. ATTN_I8_SMOOTH=0 in the environment
// (comparisons: what smoothing buys) makes key_mean's mean 0 for the kernel and the baseline alike; int8_smoothing()
// says whether it is on.
bool int8_smoothing();
bool key_mean(const float* rows, int64_t ld, int64_t n, int64_t dim, float* mean);
bool round_smoothed_key(const float* x, const float* mean, int64_t dim, int8_t* q, float* scale);

// flash_int8's V (Arithmetic::Int8Products on a dense problem; SageAttention2's per-channel V): a
// (batch, kv head)'s n value rows rounded to int8 per channel over the sequence's keys: scale_c =
// max_j |v_jc| / 127, code_jc by round_int8's per-value rule; V then multiplies as code_jc x scale_c.
// rows: n rows of dv floats, ld apart; codes: n x dv, row-major. false when a value is NaN or Inf
// (the head's P.V stays float32). The kernel and the tolerance baseline (verify.cpp) both use it.
bool round_v_channels(const float* rows, int64_t ld, int64_t n, int64_t dv, int8_t* codes, float* scales);

// The OCP FP8 conversions (exact decode; encode rounds to nearest even, saturating as above).
float fp8_e4m3_to_float(uint8_t b);
float fp8_e5m2_to_float(uint8_t b);
uint8_t float_to_fp8_e4m3(float x);
uint8_t float_to_fp8_e5m2(float x);

}  // namespace attnlab
