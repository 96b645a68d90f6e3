// cuda_flash: FlashAttention-2 style forward pass in float32 on CUDA cores (no tensor cores).
//
// Idea (FA-2, Dao 2023): one thread block per (batch, kv head, tile of kM query rows). The
// rows of a tile are the (query position, query head) pairs of ONE kv head's group, position
// major (row t -> position t / G, head hk * G + t % G), so with GQA a K/V tile staged in shared
// memory serves all G query heads that read it, and the rows of a tile share few positions
// (their visible intervals stay close). For each kN-key tile of the union of the rows' visible
// intervals (MaskSpec::rows: tiles outside it are never loaded - causal and window skipping):
//   1. the block loads K and V rows [j0, j0 + kN) into shared memory (zeros past the span);
//   2. S = Q K^T: a 16 x 16 thread grid, thread (ty, tx) owning rows ty*kRM.. and keys tx + 16c
//      (kRM x kRN scores in registers, Q and K read from shared memory as float4);
//   3. online softmax in registers: per-row max over the 16 lanes of a row (shuffles), rescale
//      of the running sum and output by exp2(m_old - m_new); only tiles that cut some row's
//      interval apply the mask, and there a masked score is replaced (never multiplied) so
//      NaN/Inf in masked K cannot leak; special values follow include/attnlab/blocks/online_softmax.hpp
//      (no row is skipped because of its max);
//   4. P goes to shared memory and O += P V, each thread owning kRM rows x head_dim/16 columns;
//      on a masked tile a row multiplies only the V rows of its own visible keys.
// Sparse patterns (include/attnlab/pattern.hpp): make_plan builds the block map on the host with
// one query tile per block (br = kM / G, so G must divide kM; outside the timed region) and
// runtime.cu copies it with the inputs; a block visits only its map entries' 64-key tiles, in
// kN-key steps, full ones unmasked and partial ones masked by each row's 64-bit word - the same
// select and P V rule as a tile an interval cuts (an interval becomes a word, key_bits).
// Q is pre-scaled by scale * log2(e) once, so the softmax runs on exp2 (FA's softmax.h trick);
// LSE = m * ln 2 + log(l). Fully masked rows (empty interval): O = 0, LSE = -inf. Softcap and ALiBi
// (score_mod.hpp) modify a tile's scores in log2 units before the mask; a sink logit joins at the
// finish (tile_walk.cuh's end_row).
// Memory: shared (kM + kN) * (D + 4) + kN * D + kM * (kN + pad) floats, <= 98 KiB for every
// head-dim bucket (so it also runs on sm_86/89 parts with 99 KiB), nothing in global memory
// beyond Q, K, V, O, LSE (and a pattern's block map): O(N) extra memory. K and V are read q_len*G/kM times per kv head.
// Cost: 4 * visible pairs * D FLOP; per 4-wide k step a thread issues kRM + kRN float4 shared
// loads for 4 * kRM * kRN FMAs, so it is FMA-bound in principle, less in practice: no
// cp.async double buffering (tile loads stall the block; 2 blocks per SM hide part of it),
// float4 global loads only when rows are 16-byte aligned, 8 warps per block.
// Head dims are padded to the next bucket (32, 64, 96, 128, 256, 512): d = 80 pays for 96.
// Precision: Q, K, V stored as float32, bf16 or f16 are widened exactly to float32 as the
// tiles are staged in shared memory (16-bit tiles take the element-wise load path); float32
// compute.
// Expected: well under FA-2's tensor-core numbers; a fraction of the FP32 peak (measured
// numbers go in the results of scripts/gpu_check.sh, none exist yet).
#include <type_traits>

#include "attnlab/blocks/online_softmax.hpp"
#include "cuda/device.cuh"
#include "cuda/tile_walk.cuh"

namespace attnlab::ATTN_CUDA_NS {
namespace flash_impl {

constexpr int kThreads = 256;
constexpr int kTX = 16;  // threads across the keys of a score tile (and across head_dim)
constexpr int kTY = 16;  // threads across the rows

// Row length of the P tile such that the two row groups of a warp (rows ty*kRM and
// (ty+1)*kRM) land 16 banks apart: P stores are conflict-free.
constexpr int p_row_floats(int rm, int n) {
  for (int p = n;; ++p) {
    if ((rm * p) % 32 == 16) return p;
  }
}

template <int D, int M, int N>
struct Config {
  static constexpr int kD = D;  // head_dim bucket (a multiple of 16)
  static constexpr int kM = M;  // rows per block
  static constexpr int kN = N;  // keys per tile
  static constexpr int kRM = M / kTY;
  static constexpr int kRN = N / kTX;
  static constexpr int kCols = D / kTX;
  static constexpr int kQK = D + 4;  // Q, K row stride: float4 aligned, conflict-free float4 reads
  static constexpr int kPN = p_row_floats(kRM, N);
  static constexpr int64_t kSmemFloats = int64_t{M} * kQK + int64_t{N} * kQK + int64_t{N} * D + int64_t{M} * kPN;
  static_assert(M % kTY == 0 && N % kTX == 0 && D % kTX == 0, "tile shape");
};

// One score tile step over keys [j0, j0 + n_keys). kMasked: some row does not see every key of
// the tile; row_bits(row of the block) gives the keys it sees (bit n: key j0 + n), so each
// score is checked against them and P * V skips the others. With `modifies`, row_mod(row of the
// block) gives the row's softcap and ALiBi (log2 units), applied before the mask.
template <class C, bool kMasked, class RowBits, class RowMod>
__device__ __forceinline__ void tile_step(const float* qs, const float* ks, const float* vs, float* ps, int tx, int ty,
                                          int dim4, int64_t j0, int n_keys, const RowBits& row_bits, bool modifies,
                                          const RowMod& row_mod, float (&m)[C::kRM], float (&l)[C::kRM],
                                          float (&acc)[C::kRM][C::kCols]) {
  // S = Q K^T for this thread's kRM x kRN scores (log2 domain: Q carries scale * log2 e).
  float s[C::kRM][C::kRN];
  ATTN_UNROLL
  for (int r = 0; r < C::kRM; ++r) {
    ATTN_UNROLL
    for (int c = 0; c < C::kRN; ++c) s[r][c] = 0.f;
  }
  for (int d = 0; d < dim4; d += 4) {
    float4 qv[C::kRM], kv[C::kRN];
    ATTN_UNROLL
    for (int r = 0; r < C::kRM; ++r) qv[r] = *reinterpret_cast<const float4*>(qs + (ty * C::kRM + r) * C::kQK + d);
    ATTN_UNROLL
    for (int c = 0; c < C::kRN; ++c) kv[c] = *reinterpret_cast<const float4*>(ks + (tx + kTX * c) * C::kQK + d);
    ATTN_UNROLL
    for (int r = 0; r < C::kRM; ++r) {
      ATTN_UNROLL
      for (int c = 0; c < C::kRN; ++c) {
        float t = s[r][c];
        t = fmaf(qv[r].x, kv[c].x, t);
        t = fmaf(qv[r].y, kv[c].y, t);
        t = fmaf(qv[r].z, kv[c].z, t);
        t = fmaf(qv[r].w, kv[c].w, t);
        s[r][c] = t;
      }
    }
  }
  if (modifies) {  // (uniform in the block; recomputed per tile, as row_bits, rather than held)
    ATTN_UNROLL
    for (int r = 0; r < C::kRM; ++r) {
      const ScoreMod mod = row_mod(ty * C::kRM + r);
      ATTN_UNROLL
      for (int c = 0; c < C::kRN; ++c) s[r][c] = modified_score(mod, s[r][c], j0 + tx + kTX * c);
    }
  }
  // Online softmax, one row at a time; the 16 lanes of a row hold identical m and alpha.
  // Special values: include/attnlab/blocks/online_softmax.hpp (fmaxf may drop a NaN score; its p
  // is NaN all the same). Masked tiles keep each row's visible keys (bits) for P V.
  uint64_t vis[C::kRM];
  ATTN_UNROLL
  for (int r = 0; r < C::kRM; ++r) {
    vis[r] = ~uint64_t{0};
    if (kMasked) {
      // Recomputed here rather than kept in registers for the whole kernel (fewer spills).
      vis[r] = row_bits(ty * C::kRM + r);
      ATTN_UNROLL
      for (int c = 0; c < C::kRN; ++c) {
        if (!(vis[r] >> (tx + kTX * c) & 1)) s[r][c] = -INFINITY;  // replaced, never multiplied
      }
    }
    float tile_max = -INFINITY;
    ATTN_UNROLL
    for (int c = 0; c < C::kRN; ++c) tile_max = fmaxf(tile_max, s[r][c]);
    tile_max = group_max<kTX>(tile_max);
    const float m_new = fmaxf(m[r], tile_max);
    const float alpha = online_softmax::rescale<online_softmax::Units::Log2>(m[r], m_new);
    const float sub = online_softmax::subtrahend(m_new);
    float row_sum = 0.f;
    ATTN_UNROLL
    for (int c = 0; c < C::kRN; ++c) {
      const float p = exp2f(s[r][c] - sub);
      row_sum += p;
      ps[(ty * C::kRM + r) * C::kPN + tx + kTX * c] = p;
    }
    l[r] = l[r] * alpha + row_sum;  // this thread's share; summed over the row's lanes at the end
    m[r] = m_new;
    ATTN_UNROLL
    for (int c = 0; c < C::kCols; ++c) acc[r][c] *= alpha;
  }
  __syncthreads();  // P complete
  // O += P V over the tile's keys that exist (n_keys <= kN).
  for (int n = 0; n < n_keys; ++n) {
    float pv[C::kRM], vv[C::kCols];
    ATTN_UNROLL
    for (int r = 0; r < C::kRM; ++r) pv[r] = ps[(ty * C::kRM + r) * C::kPN + n];
    ATTN_UNROLL
    for (int c = 0; c < C::kCols; ++c) vv[c] = vs[n * C::kD + tx + kTX * c];
    ATTN_UNROLL
    for (int r = 0; r < C::kRM; ++r) {
      ATTN_UNROLL
      for (int c = 0; c < C::kCols; ++c) {
        if (kMasked) {
          // Only the row's own visible keys: 0 * NaN/Inf in a V row it does not see would
          // leak, while a visible key with p = 0 multiplies as in the reference.
          if (vis[r] >> n & 1) acc[r][c] = fmaf(pv[r], vv[c], acc[r][c]);
        } else {
          acc[r][c] = fmaf(pv[r], vv[c], acc[r][c]);
        }
      }
    }
  }
}

// Copies kRows rows of head_dim elements (E: float, bf16 or f16, widened exactly), times
// `scale`, into a shared float tile with row stride `stride`, zero-filling absent rows
// (row(n) == nullptr) and the columns past head_dim. With vec4 (float rows, every row 16-byte
// aligned, head_dim % 4 == 0) consecutive threads load consecutive float4s: 16-byte
// coalesced loads and a quarter of the index arithmetic.
template <int kRows, int kD, class E, class RowFn>
__device__ __forceinline__ void load_tile(float* dst, int stride, int dim, bool vec4, float scale, RowFn row) {
  if constexpr (std::is_same_v<E, float>) {
    if (vec4) {
      constexpr int kD4 = kD / 4;
      for (int e = threadIdx.x; e < kRows * kD4; e += kThreads) {
        const int n = e / kD4, c = (e % kD4) * 4;
        const float* src = row(n);
        float4 x = {0.f, 0.f, 0.f, 0.f};
        if (src && c < dim) {
          x = *reinterpret_cast<const float4*>(src + c);
          x.x *= scale, x.y *= scale, x.z *= scale, x.w *= scale;
        }
        *reinterpret_cast<float4*>(dst + n * stride + c) = x;
      }
      return;
    }
  }
  for (int e = threadIdx.x; e < kRows * kD; e += kThreads) {
    const int n = e / kD, c = e % kD;
    const E* src = row(n);
    dst[n * stride + c] = (src && c < dim) ? to_float(src[c]) * scale : 0.f;
  }
}

// Whether every row of a float view starts 16-byte aligned and holds whole float4s.
__device__ __forceinline__ bool rows_are_float4(const void* base, const cuda_impl::Strides& s, int dim) {
  return dim % 4 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0 && s.b % 4 == 0 && s.h % 4 == 0 && s.s % 4 == 0;
}

// E: the storage type of Q, K, V (float, bf16, f16), widened exactly into the shared tiles.
template <class C, class E>
__global__ void __launch_bounds__(kThreads, 2) flash_kernel(DeviceArgs a) {
  const E* qa = static_cast<const E*>(a.q);
  const E* ka = static_cast<const E*>(a.k);
  const E* va = static_cast<const E*>(a.v);
  float* qs = dynamic_smem<float>();
  float* ks = qs + C::kM * C::kQK;
  float* vs = ks + C::kN * C::kQK;
  float* ps = vs + C::kN * C::kD;
  const int tx = threadIdx.x % kTX, ty = threadIdx.x / kTX;
  const int64_t b = blockIdx.z, hk = blockIdx.y;
  const int64_t group = a.group();
  const int64_t rows_total = group * a.q_len;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * C::kM;
  const int dim = static_cast<int>(a.head_dim), dim_v = static_cast<int>(a.head_dim_v);
  const int dim4 = (dim + 3) & ~3;
  const MaskSpec mask = a.mask(b);

  // Q tile, pre-scaled; rows past the problem and columns past head_dim are zero.
  load_tile<C::kM, C::kD, E>(qs, C::kQK, dim, rows_are_float4(a.q, a.qs, dim), a.scale * kLog2e,
                             [&](int r) -> const E* {
                               const int64_t t = t0 + r;
                               if (t >= rows_total) return nullptr;
                               return qa + a.qs.at(b, hk * group + t % group, t / group);
                             });
  const bool k_vec4 = rows_are_float4(a.k, a.ks, dim), v_vec4 = rows_are_float4(a.v, a.vs, dim_v);

  // This thread's rows: running max (log2 domain) and sum, output accumulator.
  float m[C::kRM], l[C::kRM], acc[C::kRM][C::kCols];
  ATTN_UNROLL
  for (int r = 0; r < C::kRM; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
    ATTN_UNROLL
    for (int c = 0; c < C::kCols; ++c) acc[r][c] = 0.f;
  }

  // Row r of the block's score modification (log2 units: Q carries scale * log2 e).
  const bool modifies = a.modifies_scores();
  const auto row_mod = [&](int r) {
    const int64_t t = t0 + r;
    return a.score_mod(mask, hk * group + t % group, t / group, kLog2e);
  };

  // Key tile [j0, j0 + kN): K and V rows up to `end` (zeros past it: never read, but never
  // NaN either), then the step, masked by row_bits when `masked`.
  const auto visit = [&](int64_t j0, int64_t end, bool masked, const auto& row_bits) {
    __syncthreads();  // the previous tile's P V is done with ks, vs, ps (and Q is stored)
    load_tile<C::kN, C::kD, E>(ks, C::kQK, dim, k_vec4, 1.f,
                               [&](int n) -> const E* { return j0 + n < end ? ka + a.ks.at(b, hk, j0 + n) : nullptr; });
    load_tile<C::kN, C::kD, E>(vs, C::kD, dim_v, v_vec4, 1.f,
                               [&](int n) -> const E* { return j0 + n < end ? va + a.vs.at(b, hk, j0 + n) : nullptr; });
    __syncthreads();
    const int n_keys = end - j0 < C::kN ? static_cast<int>(end - j0) : C::kN;
    if (!masked) {
      tile_step<C, false>(qs, ks, vs, ps, tx, ty, dim4, j0, n_keys, row_bits, modifies, row_mod, m, l, acc);
    } else {
      tile_step<C, true>(qs, ks, vs, ps, tx, ty, dim4, j0, n_keys, row_bits, modifies, row_mod, m, l, acc);
    }
  };
  const int64_t v = a.sparse ? a.map.variant(b, hk) : 0;
  for_each_key_tile<C::kN>(a, mask, v, blockIdx.x, t0, C::kM, visit);

  // Normalize and store; the 16 lanes of a row each own head_dim/16 columns.
  ATTN_UNROLL
  for (int r = 0; r < C::kRM; ++r) {
    const float l_row = group_sum<kTX>(l[r]);
    const int64_t t = t0 + ty * C::kRM + r;
    if (t >= rows_total) continue;
    // (A fully masked row - by the interval, or the map for a pattern: O = 0, LSE = -inf.)
    const RowEnd end = end_row(a, mask, v, b, hk, t, m[r], l_row, tx == 0);
    ATTN_UNROLL
    for (int c = 0; c < C::kCols; ++c) {
      const int col = tx + kTX * c;
      if (col < dim_v) end.o[col] = acc[r][c] * end.inv;
    }
  }
}

// Tile shapes per head-dim bucket: shared memory <= 98 KiB, accumulators <= 32 floats/thread.
using C32 = Config<32, 64, 64>;
using C64 = Config<64, 64, 64>;
using C96 = Config<96, 64, 32>;
using C128 = Config<128, 64, 32>;
using C256 = Config<256, 32, 16>;
using C512 = Config<512, 16, 16>;

// Calls f(Config{}) with the bucket of head_dim (of the wider of head_dim and head_dim_v).
template <class F>
auto with_config(int64_t head_dim, F&& f) {
  if (head_dim <= 32) return f(C32{});
  if (head_dim <= 64) return f(C64{});
  if (head_dim <= 96) return f(C96{});
  if (head_dim <= 128) return f(C128{});
  if (head_dim <= 256) return f(C256{});
  return f(C512{});
}

constexpr int64_t kMaxGridY = 65535, kMaxGridZ = 65535, kMaxGridX = 2147483647;

int64_t scratch_floats(const DeviceArgs&, int) { return 0; }

int64_t smem_bytes(const DeviceArgs& a) {
  return with_config(a.max_dim(),
                     [](auto c) { return decltype(c)::kSmemFloats * static_cast<int64_t>(sizeof(float)); });
}

int64_t block_rows(const DeviceArgs& a) {
  return with_config(a.max_dim(), [](auto c) { return int64_t{decltype(c)::kM}; });
}

const char* unsupported(const DeviceArgs& a) {
  if (a.max_dim() > 512) return "head_dim or head_dim_v above 512 (the largest tile bucket; cuda_naive runs them)";
  if (a.sparse && block_rows(a) % a.group() != 0) {
    return "a sparse pattern with q_heads / kv_heads not dividing the block's rows (64 up to "
           "head_dim 128, 32 up to 256, 16 up to 512): the block map has one query tile per block";
  }
  if (a.kv_heads > kMaxGridY) return "kv_heads above 65535 (grid y)";
  if (a.batch > kMaxGridZ) return "batch above 65535 (grid z)";
  const int64_t tiles =
      with_config(a.max_dim(), [&](auto c) { return ceil_div(a.group() * a.q_len, decltype(c)::kM); });
  if (tiles > kMaxGridX) return "q_heads / kv_heads * q_len too large (grid x)";
  return "";
}

void launch(const DeviceArgs& a, const LaunchEnv& env) {
  with_config(a.max_dim(), [&](auto c) {
    using C = decltype(c);
    const dim3 grid(static_cast<unsigned>(ceil_div(a.group() * a.q_len, C::kM)), static_cast<unsigned>(a.kv_heads),
                    static_cast<unsigned>(a.batch));
    const size_t smem = static_cast<size_t>(C::kSmemFloats * sizeof(float));
    switch (a.dtype) {
      case DType::BF16: launch_kernel(flash_kernel<C, bf16>, grid, dim3(kThreads), smem, env.stream, a); break;
      case DType::F16: launch_kernel(flash_kernel<C, f16>, grid, dim3(kThreads), smem, env.stream, a); break;
      case DType::F32: launch_kernel(flash_kernel<C, float>, grid, dim3(kThreads), smem, env.stream, a); break;
    }
  });
}

}  // namespace flash_impl

const cuda_impl::KernelOps flash_ops = {flash_impl::scratch_floats, flash_impl::smem_bytes, flash_impl::unsupported,
                                        flash_impl::block_rows, flash_impl::launch};

}  // namespace attnlab::ATTN_CUDA_NS
