// flash_int8: flash (src/cpu/kernels/flash.cpp: the same tasks, tiles, online softmax, masks and sparse
// patterns, through the same tile engine) with Q.K^T as exact int32 dot products of int8 codes -
// SageAttention's recipe on the CPU.
//
// Idea. Once per run, every (batch, kv head)'s keys are smoothed - K minus its mean over the
// sequence's keys: what is left to round is the part that tells keys apart, not a large channel
// they all share; every score of a query row moves by the same q.mean, which the softmax would
// not see but the LSE does, so the score epilogue adds it back (an FMA where a multiply was) -
// and rounded to int8 per key (key_mean,
// round_smoothed_key: kv_quant.hpp), packed as K^T words of 4 codes per 64-key tile
// (src/cpu/simd/int8_dot.hpp). Each task rounds its Q rows to int8 per row (round_q_row) into
// panel words; GEMM 1 is then vpdpbusd (AVX512-VNNI on avx512, AVX-VNNI on avx2: 4 byte products
// per 32-bit lane per instruction, 4x the lanes of a float32 FMA) on whole register blocks,
// each score scaled once by its row's and its key's scale; without VNNI vpmaddubsw + vpmaddwd
// (ATTN_NO_VNNI=1 forces it), the scalar rule on scalar and neon. The softmax is flash's, float32.
// P.V in integers where vpdpbusd runs (SageAttention2's P and V, on the int8 unit): V is rounded
// once per run per channel (round_v_channels: kv_quant.hpp) into value tiles of 4-key words, and
// on every tile a panel sees whole each row's P is rounded to u8 codes against the tile's largest
// weight (round_p_tile, decode_i8's rule), the codes times V's codes summed exactly in int32 and
// scaled once per tile by the row's quantum and the channel's scale (int8_dot.hpp: pv_tile_u8).
// Partial tiles, heads whose V holds NaN or Inf, and CPUs without VNNI (vpmaddubsw's int16 pairs
// would overflow at 255 x 127) multiply P.V in float32 on V as stored; ATTN_I8_PV=0 forces that.
// vpdpbusd runs at 4x the FMA rate on Zen 4 (`attnlab peak`), and P.V in float32 had been half of
// flash_int8's time: 1.66x at 8/8, d 128, 4096 (results/2026-12-06-int8_pv).
// Arithmetic: Int8Products (kernel.hpp) - held to 4x the textbook's error on the Q and K it
// multiplies (Q rounded, K = mean + rounded remainder) with P and V rounded as above on every
// tile the row sees whole (verify.cpp reads all through the same functions), plus float32's
// floor; the error against the unrounded inputs is what the agreement reports. A head whose keys
// hold NaN or Inf, or a task whose Q rows do, multiplies in float32 (rounding would turn them
// into numbers): special values reach O as the reference says.
// Memory: flash's per-thread tiles, plus per thread the task's Q words (R x d bytes) and 2 R
// floats; shared, the rounded keys: per (batch, kv head) ceil(kv_len / 64) tiles of 64 (d + 8)
// bytes and d floats of mean (~1/4 of K); with integer P.V the rounded values, 64 d_v bytes per
// tile and d_v floats of scales (~1/4 of V).
// Cost: flash's, with both GEMMs at the int8 unit's rate (`attnlab peak`), plus one pass over K
// and V per run (mean and rounding: O(kv_len d), against O(q_len kv_len d)), one over each task's
// Q, and P's rounding per row and whole tile (a max, a division, 64 conversions).
//
// flash_int8_amx: the same kernel, but every key tile that all rows of a task see whole goes
// through the AMX tile unit 32 query rows at a time (flash_amx's blocks, src/cpu/simd/isa/amx.hpp):
// S by TDPBSSD on the same codes (signed x signed: no +128 correction; the key tiles' word rows
// are whole 64-byte tile rows), the float32 softmax on 32 rows, then P and V rounded to bf16 for
// TDPBF16PS (V rounded and packed once per run, with flash_amx's structure: 32-row blocks over
// four tiles per softmax step, the causal diagonal and window edges there too when their V is
// finite; src/cpu/engine/tiles.cpp amx_prepacked_tiles) - float32 P.V was two thirds of flash_int8's
// time, and this CPU's vdpbf16ps runs at half its FMA rate. Other partial tiles run flash_int8's
// panels.
// Arithmetic: Int8Bf16Products - the baseline also rounds P and V to bf16, with bf16's floor.
// Built only in the avx512_bf16 object (with AMX-INT8); needs the OS's AMX tile state.
#include <string>

#include "attnlab/kernel.hpp"
#include "attnlab/pattern.hpp"
#include "cpu/simd/isa/object.hpp"
#include "cpu/simd/tiles.hpp"

namespace attnlab::ATTN_TARGET_NS::cpu {
Support amx_permission();  // src/cpu/kernels/flash_bf16.cpp (the avx512_bf16 object's)
namespace {

// amx: flash_int8_amx (the avx512_bf16 object only), else flash_int8.
class FlashInt8 final : public Kernel {
 public:
  explicit FlashInt8(bool amx) : amx_(amx) {}
  std::string_view name() const override { return amx_ ? "flash_int8_amx" : "flash_int8"; }
  std::string_view description() const override {
    return amx_ ? "flash_int8 with every whole (unmasked) key tile on the AMX tile unit, 32 query rows at a time: "
                  "TDPBSSD on the int8 codes, float32 softmax, P and V rounded to bf16 for TDPBF16PS; partial "
                  "tiles as flash_int8"
                : "flash with Q.K^T in int8 (SageAttention's recipe): K smoothed by its mean and rounded per key "
                  "once per run, Q per row, exact int32 sums (vpdpbusd where the CPU has VNNI), float32 softmax; "
                  "with VNNI P.V in integers too (P to u8 per row and whole tile, V to int8 per channel)";
  }
  std::string_view precision() const override {
    return amx_ ? "f32 in; Q per row and K - mean per key to int8, int32 K.Q; f32 softmax; P and V to bf16 on "
                  "whole tiles"
                : "f32 in; Q per row and K - mean per key to int8, int32 K.Q; f32 softmax; with VNNI P to u8 and V to "
                  "int8 per channel, int32 P.V on whole tiles";
  }
  Support available() const override {
    if constexpr (simd::kBf16Object) {
      if (amx_) return amx_permission();
    }
    return Support::yes();
  }
  const Capabilities& capabilities() const override {
    // (the AMX tiles hold unscaled scores: no score modifications there)
    static constexpr Capabilities kVector{
        .patterns = true, .head_dim_v = true, .score_mods = true, .arithmetic = Arithmetic::Int8Products};
    static constexpr Capabilities kAmx{
        .patterns = true, .head_dim_v = true, .arithmetic = Arithmetic::Int8Bf16Products};
    return amx_ ? kAmx : kVector;
  }
  Support supports(const Problem& p) const override {
    const std::string me(name());
    if (p.dtype != DType::F32) {
      return Support::no("dtype: " + me + " rounds float32 inputs, not " + to_string(p.dtype) +
                         "; run it with --dtype f32 (flash_bf16 and flash_amx take bf16)");
    }
    if (p.kv_quantized() || p.kv_paged()) {
      return Support::no("kv_dtype / kv_block: " + me +
                         " rounds a dense float32 K itself; a quantized or paged cache runs through flash "
                         "(decode_i8 for int8 scores over q8_0, q4_0, u8 and u4)");
    }
    if (p.dilation > 1) {
      return Support::no("dilation " + std::to_string(p.dilation) + ": " + me +
                         "'s key tiles are the sequence's own; flash runs a dilated window as strided phases");
    }
    if (gathered_columns(p) > 0) {
      return Support::no("pattern: global columns are gathered into one tile of copied rows, which " + me +
                         "'s rounded key tiles do not hold; flash runs it");
    }
    return Support::yes();
  }

  size_t workspace_bytes(const Problem& p, int threads) const override {
    if (!supports(p)) return 0;
    const simd::Tiling t = tiling(p);
    return t.shared_bytes() + t.bytes * static_cast<size_t>(threads);
  }
  std::shared_ptr<const Plan> make_plan(const Problem& p) const override { return simd::prefill_plan(p, tiling(p)); }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    simd::run_prefill(p, in, out, ctx, tiling(p), amx_ ? "flash_int8_amx" : "flash_int8");
  }

 private:
  simd::Tiling tiling(const Problem& p) const { return simd::make_tiling(p, 0, false, amx_, false, true); }
  bool amx_;
};

}  // namespace

const Kernel& flash_int8() {
  static const FlashInt8 k(false);
  return k;
}

// (the avx512_bf16 object's table lists it; the other objects compile it unused)
const Kernel& flash_int8_amx() {
  static const FlashInt8 k(true);
  return k;
}

}  // namespace attnlab::ATTN_TARGET_NS::cpu
