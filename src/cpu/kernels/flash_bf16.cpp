// flash_bf16 and flash_amx, the bf16-product kernels.
// flash_bf16: flash (src/cpu/kernels/flash.cpp: the same tasks, tiles, online softmax, masks and sparse
// patterns, through the same tile engine) with both GEMMs on AVX512_BF16's vdpbf16ps, which
// multiplies pairs of bf16 values into float32 lanes: 32 products per instruction against the
// float32 FMA's 16 (src/cpu/simd/isa/avx512_bf16.hpp).
//
// Idea. The inputs are bf16 already (--dtype bf16), so Q.K^T needs no rounding at all: Q rows
// are packed as bf16 pairs, unscaled (the float32 scores are scaled by scale * log2 e when they
// leave the registers), and K^T as the transpose of K's rows read as 32-bit words (each word a
// pair along d). The softmax is float32 as in flash; then P is rounded to bf16 (nearest even)
// for P.V, with V packed per tile as pairs of keys. The row sums l add the unrounded P.
// Flash's wide steps (4 whole tiles every row sees: 256 keys per softmax step, their V pairs
// side by side, one pv_pairs over the 128 key pairs): 1.11-1.13x (results/2026-12-06-prefill_levers);
// P rounded to bf16 pairs inside the step's exp pass (the same bits, one pass fewer) 1.02-1.04x, and
// every head's K^T and V pairs packed once per run, shared by its query tiles, instead of per task
// (flash's shared K^T: prepare_kt) 1.03-1.04x (results/2026-12-06-prefill_levers-2).
// Memory: flash's per-thread tiles plus four 32 x d word V tiles and 6 x 128 words of P pairs;
// shared (the engine's Br, several query tiles per head, no sparse pattern, <= 64 MiB): every head's
// K^T and V pairs, K and V's own size in bf16.
// Cost: flash's 4 d FLOP per visible pair at the vdpbf16ps rate (`attnlab peak`: 0.49x the
// float32 FMA peak on the AMX Xeon measured, ~1.9x on Zen 5), plus packing
// V per tile (one pass over the tile's V, 1/R of GEMM 2's loads) and rounding P (one convert
// per 32 scores).
// Precision: the products are exact (8-bit significands) and accumulate in float32 (vdpbf16ps
// rounds to nearest even and flushes denormals); the only rounding flash does not do is P to
// bf16 (relative 2^-9 per weight), which the tolerance baseline reproduces (verify.hpp:
// Arithmetic::Bf16Products).
//
// flash_amx: the same kernel, but every key tile that all rows of a task see whole (no mask
// inside it: everything but the diagonal tiles of causal and the edges of windows and patterns)
// goes through the AMX tile unit, 32 query rows at a time (src/cpu/simd/isa/amx.hpp): S and P.V by
// TDPBF16PS on the same pair layouts (~16x the float32 FMA rate per core), the softmax in
// float32 vectors on 32 rows. Every head's K^T and V pairs are packed once per run, before the
// tasks, and a task's whole tiles run row block by row block, four tiles per softmax step
// (src/cpu/engine/tiles.cpp: amx_prepacked_tiles). A masked tile of the causal diagonal or a window's
// edge runs there too when its V is finite (checked in the packing: P = 0 times a finite V adds
// nothing); other partial tiles (sparse patterns' holes, a V with NaN or Inf) run flash_bf16's
// panels. Br is at most 64. Same arithmetic, so the same tolerance.
// Linux grants a process the AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM),
// which `available` makes once.
// Memory (flash_amx): flash_bf16's, with the row state for R rounded up to 32 rows, scores and P
// for 32 rows x 256 keys, plus Q rows as words (R x d / 2 words); shared: the packed tiles,
// batch x kv_heads x (kv_len / 64) x (64 d + 32 d_v words + 64 bytes) - K and V's own size in
// bf16.
// Built only in the avx512_bf16 object (x86-64-v4 + AVX512_BF16 + AMX-BF16, CMakeLists.txt);
// `available` says why not on a CPU without the instructions.
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "attnlab/kernel.hpp"
#include "cpu/simd/tiles.hpp"

namespace attnlab::ATTN_TARGET_NS::cpu {

// Linux: ask for the AMX tile data state once per process (every thread then has it). Also
// flash_int8_amx's (src/cpu/kernels/flash_int8.cpp).
Support amx_permission() {
#if defined(__linux__)
  static const long rc = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */);
  if (rc == 0) return Support::yes();
  return Support::no("the OS refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)");
#else
  return Support::no("AMX tile state is only requested on Linux");
#endif
}

namespace {

// amx: flash_amx, else flash_bf16.
class FlashBf16 final : public Kernel {
 public:
  explicit FlashBf16(bool amx) : amx_(amx) {}
  std::string_view name() const override { return amx_ ? "flash_amx" : "flash_bf16"; }
  std::string_view description() const override {
    return amx_ ? "flash_bf16 with the whole (unmasked) key tiles on the AMX tile unit (TDPBF16PS), 32 query rows "
                  "at a time; partial tiles as flash_bf16; bf16 inputs only"
                : "flash with bf16 dot products (AVX512_BF16 vdpbf16ps): Q.K^T and P.V on bf16 pairs, float32 "
                  "accumulators and online softmax, P rounded to bf16; bf16 inputs only";
  }
  std::string_view precision() const override { return "bf16 in only; bf16 products, f32 accumulate, P to bf16"; }
  Support available() const override { return amx_ ? amx_permission() : Support::yes(); }
  Support supports(const Problem& p) const override {
    if (p.dtype != DType::BF16) {
      return Support::no(std::string("dtype: ") + std::string(name()) + " computes on bf16 inputs only, not " +
                         to_string(p.dtype) + "; run with --dtype bf16 (float inputs are rounded to bf16 on load)");
    }
    return simd::alibi_support(p, name());
  }
  size_t workspace_bytes(const Problem& p, int threads) const override {
    if (p.dtype != DType::BF16) return 0;  // not supported (make_tiling would refuse it)
    const simd::Tiling t = tiling(p);
    return t.shared_bytes() + t.bytes * static_cast<size_t>(threads);
  }
  const Capabilities& capabilities() const override {
    // flash_amx's tiles hold unscaled scores (the scale folded into the softmax): no score modifications.
    static constexpr Capabilities k{
        .patterns = true, .head_dim_v = true, .score_mods = true, .arithmetic = Arithmetic::Bf16Products};
    static constexpr Capabilities kAmx{.patterns = true, .head_dim_v = true, .arithmetic = Arithmetic::Bf16Products};
    return amx_ ? kAmx : k;
  }
  std::shared_ptr<const Plan> make_plan(const Problem& p) const override { return simd::prefill_plan(p, tiling(p)); }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    simd::run_prefill(p, in, out, ctx, tiling(p), amx_ ? "flash_amx" : "flash_bf16");
  }

 private:
  simd::Tiling tiling(const Problem& p) const { return simd::make_tiling(p, 0, true, amx_); }
  bool amx_;
};

}  // namespace

const Kernel& flash_bf16() {
  static const FlashBf16 k(false);
  return k;
}

const Kernel& flash_amx() {
  static const FlashBf16 k(true);
  return k;
}

}  // namespace attnlab::ATTN_TARGET_NS::cpu
