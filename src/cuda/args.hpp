// What a CUDA kernel receives: raw pointers, strides and the problem's scalars, in one POD
// passed by value to the device (no Problem, no std::vector, nothing host-only). The mask is
// rebuilt per batch entry with the shared MaskSpec (include/attnlab/blocks/interval.hpp), so the GPU
// applies exactly the visible-interval rule the CPU kernels and the reference use.
#pragma once

#include <cstdint>

#include "attnlab/dtype.hpp"
#include "attnlab/blocks/interval.hpp"
#include "attnlab/blocks/kv_page.hpp"
#include "attnlab/blocks/score_mod.hpp"
#include "attnlab/kv_quant.hpp"
#include "cuda/kernel_list.hpp"

namespace attnlab::cuda_impl {

// Element strides of a (batch, heads, seq, head_dim) view; head_dim is contiguous.
struct Strides {
  int64_t b = 0, h = 0, s = 0;
  ATTN_HD int64_t at(int64_t bi, int64_t hi, int64_t si) const { return bi * b + hi * h + si * s; }
};

// A sparse pattern's block map (include/attnlab/pattern.hpp) as raw arrays, built on the host
// with one query tile per thread block (cuda_flash: br = rows per block / G, so the map's rows
// rr = r * G + g are the block's rows t - t0). Host pointers until runtime.cu copies them.
struct BlockMapView {
  const int64_t* start = nullptr;  // entries of (variant, query tile) t: [start[t], start[t + 1])
  const BlockEntry* entries = nullptr;
  const uint64_t* bits = nullptr;
  const uint8_t* row_empty = nullptr;  // per (variant, query row, g)
  int64_t query_tiles = 0, variants_b = 1, variants_h = 1;
  int64_t n_start = 0, n_entries = 0, n_bits = 0, n_empty = 0;  // element counts, for the copies

  ATTN_HD int64_t variant(int64_t b, int64_t hk) const { return block_variant(variants_b, variants_h, b, hk); }
};

struct DeviceArgs {
  // Q, K, V in their storage dtype (float, bf16 or f16 elements; strides in elements): the
  // kernels are instantiated per dtype and widen each element exactly where they load it.
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  DType dtype = DType::F32;
  float* o = nullptr;
  float* lse = nullptr;              // nullptr: LSE not wanted; else (batch, q_heads, q_len)
  const int64_t* kv_lens = nullptr;  // nullptr: every batch entry has kv_len keys
  Strides qs, ks, vs, os;
  int64_t batch = 0, q_heads = 0, kv_heads = 0, q_len = 0, kv_len = 0, head_dim = 0;
  int64_t head_dim_v = 0;  // of V and O (Problem::dim_v())
  CausalAlign causal = CausalAlign::None;
  int64_t window_left = -1, window_right = -1;
  float scale = 1.f;    // the effective softmax scale (1/sqrt(head_dim) unless given)
  bool sparse = false;  // a sparse pattern (Problem::sparse()): the kernel follows `map`
  BlockMapView map;     // set by device_args() from the plan when sparse
  // A quantized cache (Problem::kv_dtype; cuda_decode reads it): k and v are rows of bytes (their
  // strides in bytes), q float32; kv_scale the fp8 layouts' per-tensor scale.
  KvDType kv = KvDType::Same;
  float kv_scale = 1.f;
  // A paged cache (Problem::kv_block): k and v are the pool, table (batch x table_len block ids)
  // says where each sequence's rows are (kv_page.hpp's rule). Host pointer until runtime.cu copies it.
  const int32_t* table = nullptr;
  int64_t table_len = 0, kv_block = 0;
  int64_t k_row_bytes = 0, v_row_bytes = 0;  // one stored K / V row (Problem::kv_row_bytes)
  // The score modifications (Problem::score_mod, blocks/score_mod.hpp): softcap c (0: none), and per
  // query head its ALiBi slope and sink logit (nullptr: none), resolved on the host by attach_head_terms
  // (host_args.hpp). Host pointers until runtime.cu copies them.
  float softcap = 0.f;
  const float* alibi = nullptr;
  const float* sinks = nullptr;

  ATTN_HD int64_t group() const { return q_heads / kv_heads; }
  // The wider of head_dim and head_dim_v: what a tile's columns must hold.
  ATTN_HD int64_t max_dim() const { return head_dim > head_dim_v ? head_dim : head_dim_v; }
  ATTN_HD MaskSpec mask(int64_t b) const {
    return MaskSpec{q_len, kv_lens ? kv_lens[b] : kv_len, causal, window_left, window_right};
  }
  // Whether the scores are modified (softcap or ALiBi; a sink logit changes only the finish).
  ATTN_HD bool modifies_scores() const { return softcap > 0.f || alibi; }
  // Row i of query head h (mask: its batch entry's): its ScoreMod in units of `unit` per natural
  // unit (log2 e for kernels whose scores carry scale * log2 e; c tanh(s / c) scales with them).
  ATTN_HD ScoreMod score_mod(const MaskSpec& mask, int64_t h, int64_t i, float unit) const {
    return {softcap * unit, alibi ? alibi[h] * unit : 0.f, mask.pos(i)};
  }
  // Head h's sink logit in units of `unit` (-inf: none).
  ATTN_HD float sink(int64_t h, float unit) const { return sinks ? sinks[h] * unit : -INFINITY; }
  ATTN_HD int64_t lse_index(int64_t b, int64_t h, int64_t i) const { return (b * q_heads + h) * q_len + i; }
  // Bytes per stride unit of K and V: 1 for a quantized cache, else the element's.
  ATTN_HD int64_t kv_unit_bytes() const { return kv != KvDType::Same ? 1 : dtype_bytes(dtype); }
  // Where K's or V's row j of sequence b, kv head h starts, in stride units (contiguous or paged).
  ATTN_HD int64_t kv_row_at(const Strides& s, int64_t b, int64_t h, int64_t j) const {
    if (!table) return s.at(b, h, j);
    const PageSlot at = page_slot(table, table_len, kv_block, b, j);
    return s.at(at.block, h, at.slot);
  }
};

// How a launch is placed: the stream (a cudaStream_t, opaque here), the SM count that sizes
// grid-stride launches, and a device scratch buffer of scratch_floats() floats.
struct LaunchEnv {
  void* stream = nullptr;
  int sm_count = 1;
  float* scratch = nullptr;
};

// One CUDA kernel's entry points. Defined by each kernel file (src/cuda/naive.cu, flash.cu),
// once compiled by nvcc (namespace cuda_dev) and, for the host emulation used by the tests,
// once compiled as C++ (namespace cuda_emu).
struct KernelOps {
  // Floats of device scratch the launch needs (0: none).
  int64_t (*scratch_floats)(const DeviceArgs& a, int sm_count);
  // Dynamic shared memory per block in bytes (0: none); the device must allow it.
  int64_t (*smem_bytes)(const DeviceArgs& a);
  // Empty when the kernel computes this problem, else why not (grid limits and the like).
  const char* (*unsupported)(const DeviceArgs& a);
  // Query rows (position, head-in-group pairs) per thread block when the kernel runs sparse
  // patterns by the block map (its plan is build_block_map(p, block_rows / G)); 0: it runs none.
  int64_t (*block_rows)(const DeviceArgs& a);
  // Enqueues the kernel; errors are reported by the caller (cudaGetLastError).
  void (*launch)(const DeviceArgs& a, const LaunchEnv& env);
};

// How O comes back when its view is not dense: per (batch, head), one 2-D copy of `rows` rows of
// `width` floats, `pitch` floats apart. With one row the seq stride is never used (the view check
// allows any value, 0 included), and a 2-D copy needs pitch >= width: the pitch is then the width.
struct RowBlockCopy {
  int64_t pitch = 0, width = 0, rows = 0;
};
inline RowBlockCopy o_row_blocks(const DeviceArgs& a) {
  return {a.q_len > 1 ? a.os.s : a.head_dim_v, a.head_dim_v, a.q_len};
}

}  // namespace attnlab::cuda_impl

// Each kernel of kernel_list.hpp's list, compiled by nvcc (cuda_dev) and as C++ for the emulator (cuda_emu).
#define ATTN_CUDA_OPS_DECL(id, ...) extern const cuda_impl::KernelOps id##_ops;
namespace attnlab::cuda_dev {
ATTN_CUDA_KERNELS(ATTN_CUDA_OPS_DECL)
}  // namespace attnlab::cuda_dev

namespace attnlab::cuda_emu {
ATTN_CUDA_KERNELS(ATTN_CUDA_OPS_DECL)
}  // namespace attnlab::cuda_emu
#undef ATTN_CUDA_OPS_DECL
