// cuda_flash_bf16: FlashAttention-2's forward on tensor cores - bf16 Q, K, V, mma.sync m16n8k16
// with float32 accumulation and ldmatrix fragment loads (tensor_core.cuh).
//
// Idea (FA-2, Dao 2023, its sm_80 kernel): one block of 4 warps per (batch, kv head, tile of kM =
// 64 query rows), the rows being one kv head's (position, head in group) pairs, position major,
// as cuda_flash's (GQA: a K/V tile in shared memory serves the group's heads). Each warp owns 16
// rows; its Q fragments are loaded once (ldmatrix) and stay in registers. For each 64-key tile of
// the union of the rows' visible intervals (or of the block map's entries for a sparse pattern):
//   1. K and V rows [j0, j0 + 64) go to shared memory as they are (bf16; zeros past the span),
//      double-buffered: the next tile's rows are copied by cp.async (16-byte chunks, when every row
//      is 16-byte aligned; else element by element) while this tile is computed;
//   2. S = Q K^T: per warp 16 x 64 scores, 8 n-tiles of mma (K's fragments by ldmatrix: the keys
//      are B's columns, so K's rows load untransposed), float32 accumulators;
//   3. online softmax in registers (log2 domain: the scores times scale * log2 e in float32): a
//      lane holds 2 rows x 16 keys, the row max and sum over the 4 lanes of a quad (shuffles);
//      softcap and ALiBi (score_mod.hpp) first, then masked scores replaced by -inf (never
//      multiplied); a sink logit joins at the finish (tile_walk.cuh's end_row);
//   4. O += P V: P rounded to bf16 (the l sum stays float32, as the tolerance baseline's), the S
//      accumulators turned into mma A fragments in registers (FA-2's trick: C's layout is A's),
//      V's fragments by ldmatrix.trans. A tile some row does not see whole takes CUDA cores for
//      P V instead (P through shared memory, each output element summing only its row's visible
//      keys): 0 x a NaN/Inf in a V row the row does not see must not reach it, which an mma over
//      the whole tile cannot promise.
// Special values follow include/attnlab/blocks/online_softmax.hpp; fully masked rows give O = 0, LSE = -inf.
// Memory: shared (64 + 2 x 2 x 64) rows x (head_dim bucket + 8) bf16 plus 4 x 16 x 64 floats for a
// masked tile's P (101 KiB at head_dim 128, 61 KiB at 64: two blocks per SM on an H100 at 128);
// registers: Q fragments (d/4 words), the scores (32 floats), O (d/2 floats) per lane. K and V are
// read q_len * group / 64 times per kv head.
// Cost: 4 x visible pairs x d FLOP on the tensor cores (P V's masked tiles on CUDA cores).
// Precision (Arithmetic::Bf16Products): bf16 inputs only; Q K^T and P V multiply bf16 pairs exactly
// into float32 accumulators, P rounded to bf16 - the CPU's flash_bf16 class and tolerance.
// Head dims up to 128 (buckets 64, 128; d_v may differ, the larger picks the bucket).
#include "attnlab/blocks/online_softmax.hpp"
#include "cuda/device.cuh"
#include "cuda/tensor_core.cuh"
#include "cuda/tile_walk.cuh"

namespace attnlab::ATTN_CUDA_NS {
namespace flash_bf16_impl {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kM = 16 * kWarps;  // rows per block: 16 per warp (mma's M)
constexpr int kN = 64;           // keys per tile
constexpr int kNT = kN / 8;      // score n-tiles per warp

template <int D>
struct Config {
  static constexpr int kD = D;           // head_dim bucket (64 or 128): mma's K steps of 16
  static constexpr int kStride = D + 8;  // bf16 per shared row: 16-byte aligned, ldmatrix rows on distinct banks
  static constexpr int kSteps = D / 16;  // k steps of Q K^T
  static constexpr int kOT = D / 8;      // output n-tiles per warp
  static constexpr int64_t kSmemBytes =
      (int64_t{kM} + 4 * kN) * kStride * 2 + int64_t{kWarps} * 16 * kN * static_cast<int64_t>(sizeof(float));
};

// kRows rows of bf16 into shared memory (row stride C::kStride), zeros for absent rows (row(n) ==
// nullptr) and past `dim`. vec (every row 16-byte aligned, dim a multiple of 8): 16-byte cp.async
// copies (zero rows and columns by src-size 0, from `any`, an aligned address), for the caller to
// commit and wait for; else element by element, visible after the next barrier.
template <class C, int kRows, class RowFn>
__device__ __forceinline__ void load_rows(uint16_t* dst, int dim, bool vec, const bf16* any, RowFn row) {
  if (vec) {
    constexpr int kChunks = C::kD / 8;
    for (int e = static_cast<int>(threadIdx.x); e < kRows * kChunks; e += kThreads) {
      const int n = e / kChunks, c = 8 * (e % kChunks);
      const bf16* src = row(n);
      const bool have = src && c < dim;
      cp_async<16>(dst + n * C::kStride + c, have ? src + c : any, have ? 16 : 0);
    }
    return;
  }
  for (int e = static_cast<int>(threadIdx.x); e < kRows * C::kD; e += kThreads) {
    const int n = e / C::kD, c = e % C::kD;
    const bf16* src = row(n);
    dst[n * C::kStride + c] = (src && c < dim) ? src[c].bits : uint16_t{0};
  }
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return static_cast<uint32_t>(to_bf16(lo).bits) | static_cast<uint32_t>(to_bf16(hi).bits) << 16;
}

template <class C>
__global__ void __launch_bounds__(kThreads) flash_bf16_kernel(DeviceArgs a, bool vec) {
  const bf16* qa = static_cast<const bf16*>(a.q);
  const bf16* ka = static_cast<const bf16*>(a.k);
  const bf16* va = static_cast<const bf16*>(a.v);
  uint16_t* qs = dynamic_smem<uint16_t>();
  constexpr int kTileElems = kN * C::kStride;
  uint16_t* ks = qs + kM * C::kStride;  // two buffers of K rows, then two of V rows
  uint16_t* vs = ks + 2 * kTileElems;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, tq = lane % 4;   // the fragment tables' groupID, threadID_in_group
  const int m4 = lane / 8, r8 = lane % 8;  // ldmatrix: this lane's row address
  float* ps = reinterpret_cast<float*>(vs + 2 * kTileElems) + warp * 16 * kN;  // a masked tile's P
  const int64_t b = blockIdx.z, hk = blockIdx.y;
  const int64_t group = a.group();
  const int64_t rows_total = group * a.q_len;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kM;
  const int dim = static_cast<int>(a.head_dim), dim_v = static_cast<int>(a.head_dim_v);
  const MaskSpec mask = a.mask(b);
  const float qk_scale = a.scale * kLog2e;

  load_rows<C, kM>(qs, dim, false, qa, [&](int r) -> const bf16* {
    const int64_t t = t0 + r;
    if (t >= rows_total) return nullptr;
    return qa + a.qs.at(b, hk * group + t % group, t / group);
  });
  __syncthreads();
  // This warp's 16 rows of Q as A fragments, per k step (matrix m4: rows +8 (m4 % 2), columns +8 (m4 / 2)).
  uint32_t qf[C::kSteps][4];
  ATTN_UNROLL
  for (int s = 0; s < C::kSteps; ++s) {
    ldmatrix_x4<false>(qf[s], qs + (warp * 16 + 8 * (m4 % 2) + r8) * C::kStride + 16 * s + 8 * (m4 / 2));
  }

  // Rows g and g + 8 of the warp (half hr): running max (log2 domain) and this lane's share of
  // the sum; O as output n-tiles (tensor_core::mma_c: o[ot][2 hr + x] is row g + 8 hr, column
  // 8 ot + 2 tq + x).
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[C::kOT][4];
  ATTN_UNROLL
  for (int ot = 0; ot < C::kOT; ++ot) o[ot][0] = o[ot][1] = o[ot][2] = o[ot][3] = 0.f;
  const int row_in_block[2] = {warp * 16 + g, warp * 16 + g + 8};

  const bool modifies = a.modifies_scores();
  const auto row_mod = [&](int r) {
    const int64_t t = t0 + r;
    return a.score_mod(mask, hk * group + t % group, t / group, kLog2e);
  };

  const int64_t v = a.sparse ? a.map.variant(b, hk) : 0;
  KeyTiles<kN> tiles(a, mask, v, blockIdx.x, t0, kM);
  // One tile's step on the K and V rows in kt, vt (loaded and visible to the block).
  const auto step = [&](const KeyTile& tile, const uint16_t* kt, const uint16_t* vt) {
    const bool masked = tile.masked;
    // S = Q K^T: n-tile pair np from one ldmatrix (keys +8 (m4 / 2), head_dim columns +8 (m4 % 2)).
    float s[kNT][4];
    ATTN_UNROLL
    for (int nt = 0; nt < kNT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
    ATTN_UNROLL
    for (int k = 0; k < C::kSteps; ++k) {
      ATTN_UNROLL
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t kb[4];
        ldmatrix_x4<false>(kb, kt + (16 * np + 8 * (m4 / 2) + r8) * C::kStride + 16 * k + 8 * (m4 % 2));
        mma_bf16_16x16x16(s[2 * np], s[2 * np + 1], qf[k], kb);
      }
    }
    // Online softmax per row half; s becomes P (bf16-rounded), the sum takes P unrounded.
    uint64_t vis[2] = {~uint64_t{0}, ~uint64_t{0}};
    ATTN_UNROLL
    for (int hr = 0; hr < 2; ++hr) {
      if (masked) vis[hr] = tiles.row_bits(tile, row_in_block[hr]);
      // Softcap and ALiBi (log2 units), before the mask; recomputed per tile rather than held.
      const ScoreMod mod = modifies ? row_mod(row_in_block[hr]) : ScoreMod{};
      float tile_max = -INFINITY;
      ATTN_UNROLL
      for (int nt = 0; nt < kNT; ++nt) {
        ATTN_UNROLL
        for (int x = 0; x < 2; ++x) {
          float v = s[nt][2 * hr + x] * qk_scale;
          if (modifies) v = modified_score(mod, v, tile.j0 + 8 * nt + 2 * tq + x);
          if (masked && !(vis[hr] >> (8 * nt + 2 * tq + x) & 1)) v = -INFINITY;  // replaced, never multiplied
          s[nt][2 * hr + x] = v;
          tile_max = fmaxf(tile_max, v);
        }
      }
      tile_max = group_max<4>(tile_max);
      const float m_new = fmaxf(m[hr], tile_max);
      const float alpha = online_softmax::rescale<online_softmax::Units::Log2>(m[hr], m_new);
      const float sub = online_softmax::subtrahend(m_new);
      float row_sum = 0.f;
      ATTN_UNROLL
      for (int nt = 0; nt < kNT; ++nt) {
        ATTN_UNROLL
        for (int x = 0; x < 2; ++x) {
          const float p = exp2f(s[nt][2 * hr + x] - sub);
          row_sum += p;
          s[nt][2 * hr + x] = to_float(to_bf16(p));
        }
      }
      l[hr] = l[hr] * alpha + row_sum;
      m[hr] = m_new;
      ATTN_UNROLL
      for (int ot = 0; ot < C::kOT; ++ot) o[ot][2 * hr] *= alpha, o[ot][2 * hr + 1] *= alpha;
    }
    if (!masked) {
      // O += P V on the tensor cores: k step kk (16 keys) takes P's n-tiles 2 kk, 2 kk + 1 as A;
      // V's fragments for output n-tiles 2 op, 2 op + 1 by one ldmatrix.trans.
      ATTN_UNROLL
      for (int kk = 0; kk < kN / 16; ++kk) {
        const uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
        ATTN_UNROLL
        for (int op = 0; op < C::kOT / 2; ++op) {
          uint32_t vb[4];
          ldmatrix_x4<true>(vb, vt + (16 * kk + 8 * (m4 % 2) + r8) * C::kStride + 16 * op + 8 * (m4 / 2));
          mma_bf16_16x16x16(o[2 * op], o[2 * op + 1], pa, vb);
        }
      }
      return;
    }
    // A tile some row does not see whole: P through shared memory, each output element summing
    // its row's visible keys only (bf16 x bf16 products, exact in float32, as the mma's).
    ATTN_UNROLL
    for (int nt = 0; nt < kNT; ++nt) {
      ATTN_UNROLL
      for (int i = 0; i < 4; ++i) ps[(g + 8 * (i / 2)) * kN + 8 * nt + 2 * tq + i % 2] = s[nt][i];
    }
    __syncwarp();
    ATTN_UNROLL
    for (int ot = 0; ot < C::kOT; ++ot) {
      ATTN_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int r = g + 8 * (i / 2), col = 8 * ot + 2 * tq + i % 2;
        float acc = o[ot][i];
        ATTN_NO_UNROLL
        for (int n = 0; n < kN; ++n) {
          if (vis[i / 2] >> n & 1) acc = fmaf(ps[r * kN + n], to_float(bf16{vt[n * C::kStride + col]}), acc);
        }
        o[ot][i] = acc;
      }
    }
  };
  // The walk, K/V double-buffered: the next tile's rows are copied (cp.async) while this one is
  // computed; its buffer was last read in the step before, which the barrier ending it closes.
  const auto load = [&](const KeyTile& tile, int buf) {
    const int64_t j0 = tile.j0, end = tile.end;
    load_rows<C, kN>(ks + buf * kTileElems, dim, vec, ka,
                     [&](int n) -> const bf16* { return j0 + n < end ? ka + a.ks.at(b, hk, j0 + n) : nullptr; });
    load_rows<C, kN>(vs + buf * kTileElems, dim_v, vec, va,
                     [&](int n) -> const bf16* { return j0 + n < end ? va + a.vs.at(b, hk, j0 + n) : nullptr; });
  };
  KeyTile cur, next;
  bool have = tiles.next(cur);
  if (have) load(cur, 0);
  cp_async_commit();
  for (int buf = 0; have; buf ^= 1) {
    const bool more = tiles.next(next);
    if (more) load(next, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // this thread's copies of the current tile have landed
    __syncthreads();     // and everyone's
    step(cur, ks + buf * kTileElems, vs + buf * kTileElems);
    __syncthreads();  // the step is done with this buffer (and ps) before it is loaded again
    cur = next;
    have = more;
  }
  cp_async_wait<0>();

  // Normalize and store: a lane writes rows g, g + 8 at its columns; lane tq = 0 the LSE.
  ATTN_UNROLL
  for (int hr = 0; hr < 2; ++hr) {
    const float l_row = group_sum<4>(l[hr]);
    const int64_t t = t0 + row_in_block[hr];
    if (t >= rows_total) continue;
    const RowEnd end = end_row(a, mask, v, b, hk, t, m[hr], l_row, tq == 0);
    ATTN_UNROLL
    for (int ot = 0; ot < C::kOT; ++ot) {
      ATTN_UNROLL
      for (int x = 0; x < 2; ++x) {
        const int col = 8 * ot + 2 * tq + x;
        if (col < dim_v) end.o[col] = o[ot][2 * hr + x] * end.inv;
      }
    }
  }
}

using C64 = Config<64>;
using C128 = Config<128>;

template <class F>
auto with_config(int64_t head_dim, F&& f) {
  if (head_dim <= 64) return f(C64{});
  return f(C128{});
}

// Whether every K and V row starts 16-byte aligned and holds whole 16-byte chunks: the cp.async path.
bool rows_16_byte_aligned(const DeviceArgs& a) {
  const auto ok = [](const void* p, const cuda_impl::Strides& s, int64_t dim) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0 && s.b % 8 == 0 && s.h % 8 == 0 && s.s % 8 == 0 && dim % 8 == 0;
  };
  return ok(a.k, a.ks, a.head_dim) && ok(a.v, a.vs, a.head_dim_v);
}

constexpr int64_t kMaxGridY = 65535, kMaxGridZ = 65535, kMaxGridX = 2147483647;

int64_t scratch_floats(const DeviceArgs&, int) { return 0; }

int64_t smem_bytes(const DeviceArgs& a) {
  return with_config(a.max_dim(), [](auto c) { return decltype(c)::kSmemBytes; });
}

int64_t block_rows(const DeviceArgs&) { return kM; }

const char* unsupported(const DeviceArgs& a) {
  if (a.dtype != DType::BF16) return "bf16 inputs only (tensor-core bf16 products; cuda_flash takes f32, bf16, f16)";
  if (a.max_dim() > 128) return "head_dim or head_dim_v above 128 (buckets 64, 128; cuda_flash runs them)";
  if (a.sparse && kM % a.group() != 0) {
    return "a sparse pattern with q_heads / kv_heads not dividing 64 (the block map has one query tile per block)";
  }
  if (a.kv_heads > kMaxGridY) return "kv_heads above 65535 (grid y)";
  if (a.batch > kMaxGridZ) return "batch above 65535 (grid z)";
  if (ceil_div(a.group() * a.q_len, kM) > kMaxGridX) return "q_heads / kv_heads * q_len too large (grid x)";
  return "";
}

void launch(const DeviceArgs& a, const LaunchEnv& env) {
  with_config(a.max_dim(), [&](auto c) {
    using C = decltype(c);
    const dim3 grid(static_cast<unsigned>(ceil_div(a.group() * a.q_len, kM)), static_cast<unsigned>(a.kv_heads),
                    static_cast<unsigned>(a.batch));
    launch_kernel(flash_bf16_kernel<C>, grid, dim3(kThreads), static_cast<size_t>(C::kSmemBytes), env.stream, a,
                  rows_16_byte_aligned(a));
  });
}

}  // namespace flash_bf16_impl

const cuda_impl::KernelOps flash_bf16_ops = {flash_bf16_impl::scratch_floats, flash_bf16_impl::smem_bytes,
                                             flash_bf16_impl::unsupported, flash_bf16_impl::block_rows,
                                             flash_bf16_impl::launch};

}  // namespace attnlab::ATTN_CUDA_NS
