// What one compiled target (include/attnlab/isa.hpp) hands to the rest of the lab.
//
// The per-target sources (CMake's ATTN_TARGET_SOURCES: the SIMD kernels of ATTN_SIMD_KERNELS,
// src/cpu/engine/tiles.cpp, src/cpu/dispatch/target.cpp and the headers in src/cpu/simd/) are compiled once per target,
// each time with that target's flags and with ATTN_TARGET_NS set to its name, and all their code lives in namespace
// attnlab::<target>
// - so the inline functions of the shared headers get distinct symbols per target, and the linker never swaps an
// AVX-512 copy into code that runs on an AVX2 CPU. Everything else is built for the baseline; it reaches a target only
// through the table below (src/cpu/dispatch/isa.cpp finds the tables): the target's kernels, its peak loops and its
// test probes, each their own part. tests/checks/check_isa_symbols.py checks the linked binaries: no function outside
// attnlab::<target> uses that target's instructions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attnlab/kv_quant.hpp"

namespace attnlab {

class Kernel;

// Measurement loops for `attnlab peak` (src/peaks/peak.cpp), at the target's width.
struct PeakLoops {
  int fma_chain_count;                                   // independent FMA chains
  float (*fma_chains)(int64_t iters);                    // fma_chain_count chains x iters FMAs
  float (*stream_sum)(const float* data, size_t count);  // count: multiple of 4 * lanes, 64-byte aligned
  size_t exp_elems;                                      // elements per exp round (L1-resident)
  float (*exp_rounds)(const float* in, float* out, int64_t rounds);
  // The int8 dot-product unit the int8 kernels of this target sum with (vpdpbusd: its ISA name,
  // int8_dot.hpp's kI8Unit; "" and nullptr where the target has none): i8_chain_count chains x
  // iters instructions of 8 x lanes integer ops (4 multiply-adds per 32-bit lane).
  const char* i8_unit;
  int i8_chain_count;
  float (*i8_chains)(int64_t iters);
};

// Test probes (tests/kernels/test_simd_math.cpp, tests/kernels/test_flash.cpp): the building blocks of
// src/cpu/simd/ on plain arrays; a "vector" is `lanes` floats.
struct TestProbes {
  void (*exp2_n)(const float* in, float* out, size_t n);  // element-wise, any n
  void (*exp_n)(const float* in, float* out, size_t n);
  void (*exp2_nonpositive_n)(const float* in, float* out, size_t n);
  void (*tanh_n)(const float* in, float* out, size_t n);
  float (*reduce_sum)(const float* vec);
  float (*reduce_max)(const float* vec);
  void (*transpose_sum)(const float* rows, float* out);  // rows: lanes vectors
  void (*load_partial)(const float* p, int n, float fill, float* vec);
  void (*store_partial)(float* p, float value, int n);
  void (*keep_bits)(const float* vec, uint32_t bits, float fill, float* out);
  int tile_keys;   // flash's keys per tile (kTileKeys)
  int block_keys;  // keys per register block (kBlockKeys): Kt is [dp][block_keys] per block
  void (*pack_k_transposed)(const float* k_rows, int64_t ldk, int nk, int64_t d, float* kt);
  // A quantized cache row of d values read as the tile engine reads it (kv_load.hpp's load_at per
  // whole vector, load_partial_at for the tail), into out[0..d).
  void (*kv_row)(KvDType t, const std::byte* row, int64_t d, float* out);
  // flash_int8's vector rounding of one row (int8_dot.hpp: round_int8_row), round_int8's rule.
  bool (*round_int8_row)(const float* x, int64_t n, int8_t* q, float* scale);
  // flash_int8's vector rounding of V per channel (int8_dot.hpp: round_v_rows), round_v_channels' rule.
  bool (*round_v_rows)(const float* rows, int64_t ld, int64_t n, int64_t dv, int8_t* codes, float* scales);
  // Query-aware sparse decode's page scorer (page_bound.hpp; kv_summary.hpp's PageScorer): the
  // reference's bits.
  void (*page_scores)(const float* split, int64_t group, int64_t d, const float* summary, int64_t pages, float* best);
  // decode_i8's rounding of one row's P times V's scales over a 64-key tile (int8_dot.hpp:
  // round_p_row), round_p_tile's rule: codes as bytes (signed: int8), the quantum.
  bool (*round_p_row)(const float* p, const float* sc, bool is_signed, uint8_t* codes, float* quantum);
  // decode_i8's score of Q row q (d floats, rounded by its rule) against K row k of a q8_0, q4_0,
  // u8 or u4 cache (int8_dot.hpp: score_rows_i8 on one key), through the target's dot-product
  // unit i8_score_unit (vpdpbusd / sdot: only where the CPU runs it; "" on scalar) or without it
  // (vpmaddubsw; the rule elsewhere); words: from the tile's words (prep_k_words, as tasks of 2 panels
  // or more score; the integer vectors only), else from the K rows. NaN when Q does not round.
  float (*i8_score)(KvDType t, bool unit, bool words, const float* q, int64_t d, const std::byte* k);
  const char* i8_score_unit;
};

struct TargetTable {
  const char* isa;  // "scalar", "avx2", "avx512", "neon" (native builds: what is enabled)
  int lanes;        // floats per vector
  // The SIMD kernels of this target, in ladder order: CMake's ATTN_SIMD_KERNELS (each NAME
  // is src/cpu/NAME.cpp, defining attnlab::<target>::cpu::NAME()), the same list in every
  // target; the registry makes one entry of each, with a variant per target.
  const Kernel* const* kernels;
  int kernel_count;
  PeakLoops peak;
  TestProbes probes;
};

// The avx512_bf16 object (CMakeLists.txt, src/cpu/dispatch/target_bf16.cpp): x86-64-v4 plus AVX512_BF16,
// built beside the dispatch targets of an x86-64 build for the kernels that need bf16 dot
// products. Not a dispatch target: the other SIMD kernels have no variant for it.
// Its kernels' isa() labels: flash_bf16 needs AVX512_BF16, flash_amx AMX-BF16 too, flash_int8_amx
// AMX-INT8 as well.
inline constexpr const char* kBf16Isa = "avx512_bf16";
inline constexpr const char* kAmxIsa = "amx_bf16";
inline constexpr const char* kAmxInt8Isa = "amx_int8";  // flash_int8_amx: AMX-INT8 and AMX-BF16
struct Bf16Table {
  const Kernel* flash_bf16;
  const Kernel* flash_amx;
  const Kernel* flash_int8_amx;
  int dot_chain_count;                 // independent vdpbf16ps chains
  float (*dot_chains)(int64_t iters);  // dot_chain_count chains x iters vdpbf16ps (64 FLOP each)
  // iters rounds of kAmxTiles independent TDPBF16PS (16 x 16 x 32 products, 16384 FLOP each);
  // the caller has the AMX permission (flash_amx's available()).
  int amx_tiles;
  float (*amx_rounds)(int64_t iters);
  // The same with TDPBSSD (16 x 16 x 64 int8 products, 32768 ops each; flash_int8_amx's scores).
  float (*amx_int8_rounds)(int64_t iters);
};

}  // namespace attnlab
