// One target's table (src/cpu/dispatch/target.hpp): its SIMD kernels, the loops `attnlab peak` times
// at its vector width, and its vector math for the tests. Compiled once per target.
#include "cpu/dispatch/target.hpp"

#include <cstring>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>

#include "attnlab/problem.hpp"

#include "cpu/simd/int8_dot.hpp"
#include "cpu/simd/microkernel.hpp"
#include "cpu/simd/page_bound.hpp"
#include "cpu/simd/vec_math.hpp"

namespace attnlab::ATTN_TARGET_NS {

// ATTN_SIMD_KERNEL_LIST: X(simd) X(threaded) ... from CMake's ATTN_SIMD_KERNELS.
namespace cpu {
#define X(name) const Kernel& name();
ATTN_SIMD_KERNEL_LIST
#undef X
}  // namespace cpu

namespace {

using simd::Batch;
using simd::kLanes;

// Independent chains acc = acc * a + c: FMA latency (4-5 cycles) x 2 pipes needs 8-10 in
// flight; 16 with 32 vector registers, 12 with 16 (plus the two constants, no spills).
constexpr int kFmaChains = simd::kVectorRegisters >= 32 ? 16 : 12;
// exp buffer: 2 x 8 KiB in and out, L1-resident, so the loop measures the exp itself.
constexpr size_t kExpElems = 2048;

// Start values and coefficients the compiler cannot see: with constants it proves a chain
// that starts at its fixed point (1 * 0.999999 + 1e-6 rounds to 1) constant and drops it,
// so one chain of 16 (AVX-512) was never computed and the peak came out 1/15 too high.
volatile float g_fma_start = 1.0f, g_fma_a = 0.999999f, g_fma_c = 1e-6f;

// kFmaChains chains, `iters` rounds; the result is returned so the compiler must compute
// it; a just below 1 keeps the values finite and normal.
__attribute__((noinline)) float fma_chains(int64_t iters) {
  Batch acc[kFmaChains];
  const float start = g_fma_start;
  for (int j = 0; j < kFmaChains; ++j) acc[j] = Batch(start + 0.001f * static_cast<float>(j));
  const Batch a(g_fma_a), c(g_fma_c);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int j = 0; j < kFmaChains; ++j) acc[j] = simd::fma(acc[j], a, c);
  }
  Batch s = acc[0];
  for (int j = 1; j < kFmaChains; ++j) s += acc[j];
  return simd::reduce_sum(s);
}

// Sum of data[0, count) with 4 vector accumulators.
__attribute__((noinline)) float stream_sum(const float* data, size_t count) {
  Batch s0(0.f), s1(0.f), s2(0.f), s3(0.f);
  for (size_t i = 0; i < count; i += 4 * kLanes) {
    s0 += Batch::load_aligned(data + i);
    s1 += Batch::load_aligned(data + i + kLanes);
    s2 += Batch::load_aligned(data + i + 2 * kLanes);
    s3 += Batch::load_aligned(data + i + 3 * kLanes);
  }
  return simd::reduce_sum((s0 + s1) + (s2 + s3));
}

// `rounds` passes of out = exp2(in) over kExpElems elements (the kernels' exp).
__attribute__((noinline)) float exp_rounds(const float* in, float* out, int64_t rounds) {
  for (int64_t r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < kExpElems; i += kLanes) simd::exp2(Batch::load_aligned(in + i)).store_aligned(out + i);
  }
  float s = 0;
  for (size_t i = 0; i < kExpElems; i += 97) s += out[i];
  return s;
}

// vpdpbusd chains acc += u x s (four byte products per 32-bit lane), as the FMA chains: its latency
// (~5 cycles) x up to 2 per cycle. Bytes 1 and 1: the sums stay far from int32 overflow.
// Built where the floor has the integer vectors (kI8VnniBuilt); elsewhere no chains.
constexpr int kI8Chains = simd::kI8VnniBuilt ? kFmaChains : 0;
__attribute__((noinline)) float i8_chains(int64_t iters) {
  if constexpr (simd::kI8VnniBuilt) {
    static volatile int one = 0x01010101;  // a value the compiler cannot see (as g_fma_a)
    using simd::i8_detail::IVec;
    IVec acc[kFmaChains];
    const IVec x = simd::i8_detail::bcast32(one);
    for (int j = 0; j < kI8Chains; ++j) acc[j] = simd::i8_detail::bcast32(j);
    for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
      for (int j = 0; j < kI8Chains; ++j) acc[j] = simd::i8_detail::dot4<true>(acc[j], x, x);
    }
    float s = 0;
    for (int j = 0; j < kI8Chains; ++j) s += simd::reduce_sum(simd::i8_detail::to_float(acc[j]));
    return s;
  } else {
    return static_cast<float>(iters);
  }
}

template <Batch (*F)(Batch)>
void map_n(const float* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) F(Batch::load_unaligned(in + i)).store_unaligned(out + i);
  if (i < n)
    simd::store_partial(out + i, F(simd::load_partial(in + i, static_cast<int>(n - i))), static_cast<int>(n - i));
}

// TestProbes::i8_score: score_rows_i8 on one key (its other lanes repeat it: computed, never read).
template <KvDType T, bool Vnni>
float i8_score_on(bool words, const float* q, int64_t d, const std::byte* k) {
  const simd::I8Layout l(d);
  constexpr int64_t kRow = simd::I8Layout(Problem::kMaxHeadDim).row;
  alignas(64) std::byte row[2 * kRow];  // the row and score_rows_i8's zero row
  if (!simd::pack_i8_row(T, q, l, 1.f, row)) return std::numeric_limits<float>::quiet_NaN();
  const auto rows = simd::Rows<simd::Quant<T>>::strided(reinterpret_cast<const simd::Quant<T>*>(k), 0, 1);
  alignas(64) float s[simd::kTileKeys] = {};
  simd::NoStep none;
  if constexpr (simd::kI8Vector) {
    if (words) {
      alignas(64) std::byte pre[simd::key_words_bytes(T, Problem::kMaxHeadDim)];
      simd::prep_k_words<T, Vnni>(l, rows, 1, pre);
      simd::score_rows_i8<1, T, Vnni>(row, l.row, row + l.row, l, rows, 0, 1, s, none, pre);
      return s[0];
    }
  }
  simd::score_rows_i8<1, T, Vnni>(row, l.row, row + l.row, l, rows, 0, 1, s, none);
  return s[0];
}
template <KvDType T>
float i8_score_as(bool unit, bool words, const float* q, int64_t d, const std::byte* k) {
  return unit ? i8_score_on<T, true>(words, q, d, k) : i8_score_on<T, false>(words, q, d, k);
}
float i8_score(KvDType t, bool unit, bool words, const float* q, int64_t d, const std::byte* k) {
  switch (t) {
    case KvDType::Q8_0: return i8_score_as<KvDType::Q8_0>(unit, words, q, d, k);
    case KvDType::Q4_0: return i8_score_as<KvDType::Q4_0>(unit, words, q, d, k);
    case KvDType::U8: return i8_score_as<KvDType::U8>(unit, words, q, d, k);
    case KvDType::U4: return i8_score_as<KvDType::U4>(unit, words, q, d, k);
    default: return std::numeric_limits<float>::quiet_NaN();
  }
}

}  // namespace

// The name of what this object was compiled for (ATTN_NATIVE builds: what -march=native enabled):
// the floor's target.
constexpr const char* kIsa = simd::kIsaName;

const TargetTable& target_table() {
  static const Kernel* const kernels[] = {
#define X(name) &cpu::name(),
      ATTN_SIMD_KERNEL_LIST
#undef X
  };
  static const TargetTable t{
      .isa = kIsa,
      .lanes = kLanes,
      .kernels = kernels,
      .kernel_count = static_cast<int>(std::size(kernels)),
      .peak =
          {
              .fma_chain_count = kFmaChains,
              .fma_chains = fma_chains,
              .stream_sum = stream_sum,
              .exp_elems = kExpElems,
              .exp_rounds = exp_rounds,
              .i8_unit = simd::kI8Unit,
              .i8_chain_count = kI8Chains,
              .i8_chains = simd::kI8VnniBuilt ? i8_chains : nullptr,
          },
      .probes = {
          .exp2_n = map_n<simd::exp2>,
          .exp_n = map_n<simd::exp>,
          .exp2_nonpositive_n = map_n<simd::exp2_nonpositive>,
          .tanh_n = map_n<simd::tanh>,
          .reduce_sum = [](const float* v) { return simd::reduce_sum(Batch::load_unaligned(v)); },
          .reduce_max = [](const float* v) { return simd::reduce_max(Batch::load_unaligned(v)); },
          .transpose_sum =
              [](const float* rows, float* out) {
                Batch r[kLanes];
                for (int i = 0; i < kLanes; ++i) r[i] = Batch::load_unaligned(rows + i * kLanes);
                simd::transpose_sum(r).store_unaligned(out);
              },
          .load_partial = [](const float* p, int n, float fill,
                             float* vec) { simd::load_partial(p, n, fill).store_unaligned(vec); },
          .store_partial = [](float* p, float value, int n) { simd::store_partial(p, Batch(value), n); },
          .keep_bits = [](const float* v, uint32_t bits, float fill,
                          float* out) { simd::keep_bits(Batch::load_unaligned(v), bits, fill).store_unaligned(out); },
          .tile_keys = simd::kTileKeys,
          .block_keys = simd::kBlockKeys,
          .pack_k_transposed =
              [](const float* k_rows, int64_t ldk, int nk, int64_t d, float* kt) {
                simd::pack_k_transposed(simd::Rows<float>::strided(k_rows, ldk, nk), nk, d, kt);
              },
          .kv_row = simd::read_kv_row,
          .round_int8_row = simd::round_int8_row,
          .round_v_rows = simd::round_v_rows,
          .page_scores = simd::page_scores,
          .round_p_row =
              [](const float* p, const float* sc, bool is_signed, uint8_t* codes, float* quantum) {
                alignas(64) float pa[simd::kTileKeys], sa[simd::kTileKeys];  // the kernel's rows are aligned
                std::memcpy(pa, p, sizeof pa);
                std::memcpy(sa, sc, sizeof sa);
                simd::PCodes<1> pc;
                simd::Batch bad(0.f);
                const bool ok = is_signed ? simd::round_p_block<1, true>(pa, sa, nullptr, 0, pc, bad)
                                          : simd::round_p_block<1, false>(pa, sa, nullptr, 0, pc, bad);
                if (!ok || simd::bad_weights(bad)) return false;
                std::memcpy(codes, pc.code[0][0], static_cast<size_t>(simd::kTileKeys));
                *quantum = pc.quantum[0][0];
                return true;
              },
          .i8_score = i8_score,
          .i8_score_unit = simd::kI8ScoreUnit,
      },
  };
  return t;
}

}  // namespace attnlab::ATTN_TARGET_NS
