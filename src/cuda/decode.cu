// cuda_decode: split-KV decode (FlashDecoding) - a few new query rows against a long KV cache, on
// CUDA cores, over the lab's cache layouts: K and V stored as f32, bf16 or f16, or quantized
// (kv_quant.hpp: q8_0, q4_0, u8, u4, fp8), contiguous or paged (block tables).
//
// Idea (FlashDecoding, Dao et al. 2023; the CPU decode's plan, src/cpu/kernels/decode.cpp): one query row
// per head leaves nothing to spread over the SMs but the keys. A block of 4 warps takes one (batch,
// kv head, key chunk) and every query row of the kv head's group - up to 16 rows of the q_len x
// group (position major) a kv head has; more rows take more blocks - so each K/V byte is read once
// per 16 rows. Per 32-key tile of the chunk (within the union of its rows' intervals):
//   1. the tile's K and V rows are copied as stored (the layout's raw bytes: scales and codes) into
//      shared memory by cp.async, in 16-, 8- or 4-byte pieces (the widest every row start allows),
//      double-buffered: the next tile's copies are in flight while this one is computed;
//   2. scores: lane n of warp w takes key n for rows w, w + 4, w + 8, w + 12 (Q in shared memory,
//      float32, zeros past head_dim), reading K's values by the layout's rule (kv_read.hpp's value(),
//      the CPU's rule; f32 and 16-bit rows 16 bytes at a time);
//   3. online softmax per row across the warp (a row's 32 keys are the warp's lanes; log2 units),
//      after softcap and ALiBi (score_mod.hpp), keys the row does not see -inf (never multiplied);
//   4. O += P V: each thread owns a 16-byte piece of V's columns for some of the rows and adds only
//      the keys a row sees (0 x a NaN/Inf in a V row the row does not see never happens).
// Each block leaves per row an unnormalized state (acc, max m, sum l) in device scratch; a second
// kernel, one warp per output row, merges the row's chunks exactly, in chunk order - the CPU decode's
// merge: M = max_c m_c, w_c = 2^(m_c - M), L = sum_c w_c l_c (double), O = sum_c w_c acc_c / L,
// LSE = (M + log2 L) ln 2 (online_softmax.hpp) - skipping the chunks the row sees no key of (never
// weighted by 0), so NaN/Inf reach O and LSE as in the reference; an empty interval gives O = 0,
// LSE = -inf (a property of the mask, never of the arithmetic). The head's sink logit joins once, at
// the merge's finish (online_softmax::finish; an empty row's LSE is then the logit).
// Chunks: the longest power of two up to 4096 keys, at least 128, that still gives 4 blocks per SM.
// Memory: shared Q (16 x head_dim floats) + 2 x 32 raw K rows + 2 x 32 raw V rows (each padded to 16
// bytes, + 16 so neighbouring rows start on other banks) + P (16 x 32 floats) + the rows' score
// modifications (256 B): 29 KiB for a bf16 cache at d 128, 146 KiB for f32 at d 256; scratch: rows x
// chunks x (d_v + 2) floats.
// Cost: K and V bytes read once per 16 rows (Problem::kv_bytes() when group x q_len <= 16), 4 x d
// FLOP per (row, key): memory-bound at decode's row counts.
// Precision: the cache's values as its read rule gives them (f32, bf16, f16 widened exactly;
// quantized rows dequantized per value), float32 products and sums: Arithmetic::F32, as the CPU decode.
// The scores' dot products round each product and sum on its own, in head_dim order (device.cuh's
// mul_rn/add_rn: the textbook's scores, as cuda_naive's): a fused one differs from the tolerance
// baseline by more than its multiple at scores ~1e4 (Extreme.HugeScores: 1.0016x the tolerance
// with fmaf), and the second instruction is free in a kernel bound by reading the cache.
// Limits: q_len <= 16, head_dim and head_dim_v <= 256, no sparse patterns.
#include "attnlab/blocks/kv_read.hpp"
#include "attnlab/blocks/online_softmax.hpp"
#include "cuda/device.cuh"

namespace attnlab::ATTN_CUDA_NS {
namespace decode_impl {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kT = 32;  // keys per tile: one per lane in the scores
constexpr int kR = 16;  // query rows per block
constexpr int kRowsPerWarp = kR / kWarps;
constexpr int64_t kMaxQLen = 16, kMaxDim = 256;
constexpr int kOutFloats = kR * static_cast<int>(kMaxDim) / kThreads;  // O per thread (32 floats)

// The split of one problem, made on the host (it sizes the launch and the scratch) and read by
// both kernels.
struct Split {
  int64_t rows = 0;       // group x q_len rows per (batch, kv head): row t is position t / group
  int64_t row_tiles = 0;  // blocks per chunk: ceil(rows / kR)
  int64_t chunk_keys = 0, chunks = 0;
  int64_t k_pitch = 0, v_pitch = 0;                      // a stored K / V row's shared-memory pitch
  int64_t d_pad = 0;                                     // Q's row in shared memory: head_dim rounded up to 8
  int64_t v_cols = 0;                                    // the partial state's O columns: whole pieces of V
  int copy = 0;                                          // cp.async piece (16, 8, 4 bytes); 0: copied by plain loads
  ATTN_HD int64_t stride() const { return v_cols + 2; }  // a partial state: acc, then m, l
  ATTN_HD int64_t partial(const DeviceArgs& a, int64_t b, int64_t hk, int64_t t, int64_t c) const {
    return (((b * a.kv_heads + hk) * rows + t) * chunks + c) * stride();
  }
};

__host__ __device__ constexpr int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Whether a row with interval iv sees a key of chunk [c_lo, c_hi): the one rule for which chunks a
// row's state is written in and merged from.
__device__ __forceinline__ bool sees(const Interval& iv, int64_t c_lo, int64_t c_hi) {
  return (iv.lo > c_lo ? iv.lo : c_lo) < (iv.hi < c_hi ? iv.hi : c_hi);
}

// Reading a row of K or V out of shared memory, a piece (kPer values) at a time; values past the
// row's dim are 0 (the copies zero-fill a row's tail to 16 bytes).
template <class E>
struct ReadWide {  // f32, bf16, f16: one 16-byte load per piece
  static constexpr int kPer = 16 / static_cast<int>(sizeof(E));
  __device__ __forceinline__ static void piece(const DeviceArgs&, const std::byte* row, int64_t p, int64_t,
                                               float (&x)[kPer]) {
    const float4 w = reinterpret_cast<const float4*>(row)[p];
    E e[kPer];
    static_assert(sizeof(e) == sizeof(w));
    memcpy(e, &w, sizeof(w));
    ATTN_UNROLL
    for (int k = 0; k < kPer; ++k) x[k] = to_float(e[k]);
  }
};
struct ReadQuantized {  // the layout's read rule, value by value
  static constexpr int kPer = 8;
  __device__ __forceinline__ static void piece(const DeviceArgs& a, const std::byte* row, int64_t p, int64_t dim,
                                               float (&x)[kPer]) {
    ATTN_UNROLL
    for (int k = 0; k < kPer; ++k) {
      const int64_t c = p * kPer + k;
      x[k] = c < dim ? kv_read::value(a.kv, row, c, a.kv_scale) : 0.f;
    }
  }
};

__device__ __forceinline__ float load_q(const DeviceArgs& a, int64_t at) {
  switch (a.dtype) {
    case DType::BF16: return to_float(static_cast<const bf16*>(a.q)[at]);
    case DType::F16: return to_float(static_cast<const f16*>(a.q)[at]);
    default: return static_cast<const float*>(a.q)[at];
  }
}

// Rows [j0, j0 + kT) (those below `end`) of K or V, kv head hk of sequence b, as stored, into dst
// (pitch bytes apart): w-byte cp.async pieces up to the row's 16-byte tail (zero-filled past the
// row and for absent rows), or plain byte loads when w is 0. One loop for every width, only the
// copy instruction switched (a loop per width, inlined at each call, made 300 KB kernels).
__device__ __forceinline__ void copy_rows(int w, std::byte* dst, int pitch, int bytes, const void* base,
                                          const cuda_impl::Strides& s, const DeviceArgs& a, int64_t b, int64_t hk,
                                          int64_t j0, int64_t end) {
  const auto* src0 = static_cast<const std::byte*>(base);
  const int64_t unit = a.kv_unit_bytes();
  const int piece = w > 0 ? w : 1;
  const int pieces = static_cast<int>(round_up(bytes, 16)) / piece;
  for (int e = static_cast<int>(threadIdx.x); e < kT * pieces; e += kThreads) {
    const int n = e / pieces, off = (e % pieces) * piece;
    const int64_t j = j0 + n;
    const int have = j < end ? (bytes - off < piece ? (bytes - off > 0 ? bytes - off : 0) : piece) : 0;
    const std::byte* src = have > 0 ? src0 + a.kv_row_at(s, b, hk, j) * unit + off : src0;
    std::byte* to = dst + n * pitch + off;
    switch (w) {
      case 16: cp_async<16>(to, src, have); break;
      case 8: cp_async<8>(to, src, have); break;
      case 4: cp_async<4>(to, src, have); break;
      default: *to = have > 0 ? *src : std::byte{0};
    }
  }
}

template <class R>
__global__ void __launch_bounds__(kThreads) decode_split(DeviceArgs a, Split sp, float* partial) {
  constexpr int kPer = R::kPer;
  constexpr int kRowsO = kOutFloats / kPer;  // P V rows per thread at most
  auto* smem = dynamic_smem<std::byte>();
  float* qs = reinterpret_cast<float*>(smem);
  std::byte* kbuf = smem + kR * sp.d_pad * 4;
  std::byte* vbuf = kbuf + 2 * kT * sp.k_pitch;
  float* ps = reinterpret_cast<float*>(vbuf + 2 * kT * sp.v_pitch);
  float* alpha_s = ps + kR * kT;
  auto* mod_s = reinterpret_cast<ScoreMod*>(alpha_s + kR);  // per row: softcap and ALiBi (log2 units)
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int64_t b = blockIdx.z, hk = blockIdx.y;
  const int64_t chunk = blockIdx.x / sp.row_tiles, r0 = (blockIdx.x % sp.row_tiles) * kR;
  const int64_t group = a.group();
  const int nrows = static_cast<int>(sp.rows - r0 < kR ? sp.rows - r0 : kR);
  const MaskSpec mask = a.mask(b);
  const int64_t c_lo = chunk * sp.chunk_keys;
  const int64_t c_hi = c_lo + sp.chunk_keys < mask.kv_len ? c_lo + sp.chunk_keys : mask.kv_len;
  // The keys of this block: its chunk within the union of its rows' intervals. None: no row of the
  // block sees the chunk, and the merge skips it.
  const Interval span = mask.rows(r0 / group, (r0 + nrows - 1) / group + 1);
  const int64_t lo = span.lo > c_lo ? span.lo : c_lo, hi = span.hi < c_hi ? span.hi : c_hi;
  if (lo >= hi) return;
  const auto interval = [&](int r) { return r < nrows ? mask.row((r0 + r) / group) : Interval{0, 0}; };

  for (int64_t e = tid; e < kR * sp.d_pad; e += kThreads) {
    const int64_t r = e / sp.d_pad, c = e % sp.d_pad, t = r0 + r;
    qs[e] = r < nrows && c < a.head_dim ? load_q(a, a.qs.at(b, hk * group + t % group, t / group) + c) : 0.f;
  }
  const int kp = static_cast<int>(sp.k_pitch), vp = static_cast<int>(sp.v_pitch);
  const auto load = [&](int64_t j0, int buf) {
    copy_rows(sp.copy, kbuf + buf * kT * kp, kp, static_cast<int>(a.k_row_bytes), a.k, a.ks, a, b, hk, j0, hi);
    copy_rows(sp.copy, vbuf + buf * kT * vp, vp, static_cast<int>(a.v_row_bytes), a.v, a.vs, a, b, hk, j0, hi);
  };

  // The softmax rows of this warp (w, w + 4, ...): max and this lane's share of the sum.
  float m[kRowsPerWarp], l[kRowsPerWarp];
  Interval iv_s[kRowsPerWarp];
  ATTN_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr) m[rr] = -INFINITY, l[rr] = 0.f, iv_s[rr] = interval(warp + kWarps * rr);
  // The P V share of this thread: V piece pv for rows rg, rg + groups, ... (threads past
  // groups x pieces idle).
  const int64_t pieces_v = sp.v_cols / kPer, groups = kThreads / pieces_v;
  const int64_t pv = tid % pieces_v, rg = tid / pieces_v;
  float o[kRowsO][kPer];
  Interval iv_o[kRowsO];
  ATTN_UNROLL
  for (int rr = 0; rr < kRowsO; ++rr) {
    ATTN_UNROLL
    for (int k = 0; k < kPer; ++k) o[rr][k] = 0.f;
    const int64_t r = rg + groups * rr;
    iv_o[rr] = rg < groups && r < nrows ? interval(static_cast<int>(r)) : Interval{0, 0};
  }
  const float qk_scale = a.scale * kLog2e;
  // The rows' modifications, read from shared memory: computed in the loop they took 26-30 more
  // registers at sm_90 for the 16-bit and quantized caches (128 -> 154-156, 168 -> 198: a block
  // less per SM).
  const bool modifies = a.modifies_scores();
  if (modifies && tid < kR) {
    const int64_t t = r0 + tid;
    mod_s[tid] = a.score_mod(mask, hk * group + t % group, t / group, kLog2e);
  }

  load(lo, 0);
  cp_async_commit();
  int buf = 0;
  for (int64_t j0 = lo; j0 < hi; j0 += kT, buf ^= 1) {
    if (j0 + kT < hi) load(j0 + kT, buf ^ 1);  // that buffer was last read before the barrier ending the last step
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const std::byte* kt = kbuf + buf * kT * sp.k_pitch;
    const std::byte* vt = vbuf + buf * kT * sp.v_pitch;
    // Scores of key j0 + lane against this warp's rows.
    float s[kRowsPerWarp] = {};
    for (int64_t p = 0; p < ceil_div(a.head_dim, kPer); ++p) {  // (never past the row's 16-byte tail)
      float x[kPer];
      R::piece(a, kt + lane * sp.k_pitch, p, a.head_dim, x);
      ATTN_UNROLL
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        if (warp + kWarps * rr >= nrows) break;  // (uniform in the warp: GQA 4 at q_len 1 has one row per warp)
        const float* q = qs + (warp + kWarps * rr) * sp.d_pad + p * kPer;
        ATTN_UNROLL
        for (int k = 0; k < kPer; ++k) s[rr] = add_rn(s[rr], mul_rn(q[k], x[k]));  // (unfused: see below)
      }
    }
    const int64_t j = j0 + lane;
    ATTN_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp + kWarps * rr;
      if (r >= nrows) continue;  // (the whole warp)
      const bool vis = j < hi && iv_s[rr].lo <= j && j < iv_s[rr].hi;
      float x = s[rr] * qk_scale;
      if (modifies) x = mod_s[r](x, j);  // softcap and ALiBi (log2 units), before the mask
      x = vis ? x : -INFINITY;           // replaced, never multiplied
      const float m_new = fmaxf(m[rr], group_max<32>(x));
      const float alpha = online_softmax::rescale<online_softmax::Units::Log2>(m[rr], m_new);
      const float p = vis ? exp2f(x - online_softmax::subtrahend(m_new)) : 0.f;
      l[rr] = l[rr] * alpha + p;
      m[rr] = m_new;
      ps[r * kT + lane] = p;
      if (lane == 0) alpha_s[r] = alpha;
    }
    __syncthreads();
    // O += P V over the keys each row sees.
    ATTN_UNROLL
    for (int rr = 0; rr < kRowsO; ++rr) {
      if (iv_o[rr].empty()) continue;
      const float alpha = alpha_s[rg + groups * rr];
      ATTN_UNROLL
      for (int k = 0; k < kPer; ++k) o[rr][k] *= alpha;
    }
    if (rg < groups) {
      const int n_end = static_cast<int>(hi - j0 < kT ? hi - j0 : kT);
      for (int n = 0; n < n_end; ++n) {
        float x[kPer];
        R::piece(a, vt + n * sp.v_pitch, pv, a.head_dim_v, x);
        ATTN_UNROLL
        for (int rr = 0; rr < kRowsO; ++rr) {
          if (!(iv_o[rr].lo <= j0 + n && j0 + n < iv_o[rr].hi)) continue;
          const float p = ps[(rg + groups * rr) * kT + n];
          ATTN_UNROLL
          for (int k = 0; k < kPer; ++k) o[rr][k] = fmaf(p, x[k], o[rr][k]);
        }
      }
    }
    __syncthreads();  // the step is done with this buffer, ps and alpha_s
  }
  cp_async_wait<0>();

  // The partial states of the rows that see this chunk.
  ATTN_UNROLL
  for (int rr = 0; rr < kRowsO; ++rr) {
    if (!sees(iv_o[rr], c_lo, c_hi)) continue;
    float* dst = partial + sp.partial(a, b, hk, r0 + rg + groups * rr, chunk) + pv * kPer;
    ATTN_UNROLL
    for (int k = 0; k < kPer; ++k) dst[k] = o[rr][k];
  }
  ATTN_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp + kWarps * rr;
    if (r >= nrows) continue;
    const float l_row = group_sum<32>(l[rr]);
    if (lane == 0 && sees(iv_s[rr], c_lo, c_hi)) {
      float* dst = partial + sp.partial(a, b, hk, r0 + r, chunk) + sp.v_cols;
      dst[0] = m[rr];
      dst[1] = l_row;
    }
  }
}

// One warp per output row (b, h, i): its chunks' states merged in chunk order.
__global__ void __launch_bounds__(kThreads) decode_merge(DeviceArgs a, Split sp, const float* partial) {
  constexpr int kCols = static_cast<int>(kMaxDim) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= a.batch * a.q_heads * a.q_len) return;  // (whole warps)
  const int64_t i = row % a.q_len, h = row / a.q_len % a.q_heads, b = row / (a.q_len * a.q_heads);
  const int64_t group = a.group(), hk = h / group, t = i * group + h % group;
  const MaskSpec mask = a.mask(b);
  const Interval iv = mask.row(i);
  const float* first = partial + sp.partial(a, b, hk, t, 0);
  const auto chunk_sees = [&](int64_t c) {
    const int64_t c_lo = c * sp.chunk_keys;
    return sees(iv, c_lo, c_lo + sp.chunk_keys < mask.kv_len ? c_lo + sp.chunk_keys : mask.kv_len);
  };
  float big_m = -INFINITY;
  bool any = false;
  for (int64_t c = 0; c < sp.chunks; ++c) {
    if (!chunk_sees(c)) continue;
    const float mc = first[c * sp.stride() + sp.v_cols];
    big_m = big_m < mc ? mc : big_m;  // (std::max's order: a NaN state never becomes the max, as on the CPU)
    any = true;
  }
  float* o = a.o + a.os.at(b, h, i);
  const float sink = a.sink(h, kLog2e);
  if (!any) {  // the mask leaves the row no key: O = 0, LSE = -inf or the sink logit
    for (int64_t c = lane; c < a.head_dim_v; c += 32) o[c] = 0.f;
    if (lane == 0 && a.lse)
      a.lse[a.lse_index(b, h, i)] = online_softmax::finish<online_softmax::Units::Log2>(true, 0.f, 1.0, sink).lse;
    return;
  }
  float acc[kCols] = {};
  double big_l = 0.0;
  for (int64_t c = 0; c < sp.chunks; ++c) {
    if (!chunk_sees(c)) continue;
    const float* pc = first + c * sp.stride();
    const float w = online_softmax::rescale<online_softmax::Units::Log2>(pc[sp.v_cols], big_m);
    big_l += static_cast<double>(w) * pc[sp.v_cols + 1];
    ATTN_UNROLL
    for (int k = 0; k < kCols; ++k) {
      if (lane + 32 * k < a.head_dim_v) acc[k] = fmaf(w, pc[lane + 32 * k], acc[k]);
    }
  }
  const online_softmax::Finish fin = row_finish<online_softmax::Units::Log2>(false, big_m, big_l, sink);
  ATTN_UNROLL
  for (int k = 0; k < kCols; ++k) {
    if (lane + 32 * k < a.head_dim_v) o[lane + 32 * k] = acc[k] * fin.out_scale;
  }
  if (lane == 0 && a.lse) a.lse[a.lse_index(b, h, i)] = fin.lse;
}

template <class F>
auto with_reader(const DeviceArgs& a, F&& f) {
  if (a.kv != KvDType::Same) return f(ReadQuantized{});
  if (a.dtype == DType::BF16) return f(ReadWide<bf16>{});
  if (a.dtype == DType::F16) return f(ReadWide<f16>{});
  return f(ReadWide<float>{});
}

// The split; sm_count sizes the chunks (4 blocks per SM where the keys allow).
Split split_of(const DeviceArgs& a, int sm_count) {
  Split sp;
  sp.rows = a.group() * a.q_len;
  sp.row_tiles = ceil_div(sp.rows, kR);
  const int64_t blocks_per_chunk = a.batch * a.kv_heads * sp.row_tiles;
  sp.chunk_keys = 4096;
  while (sp.chunk_keys > 128 && blocks_per_chunk * ceil_div(a.kv_len, sp.chunk_keys) < 4 * int64_t{sm_count}) {
    sp.chunk_keys /= 2;
  }
  sp.chunks = ceil_div(a.kv_len > 0 ? a.kv_len : 1, sp.chunk_keys);
  sp.k_pitch = round_up(a.k_row_bytes, 16) + 16;  // (+ 16: neighbouring rows start on other banks)
  sp.v_pitch = round_up(a.v_row_bytes, 16) + 16;
  sp.d_pad = round_up(a.head_dim, 8);
  const int per = with_reader(a, [](auto r) { return decltype(r)::kPer; });
  sp.v_cols = round_up(a.head_dim_v, per);
  // The widest piece every row start is a multiple of (base addresses and byte strides).
  const int64_t unit = a.kv_unit_bytes();
  int64_t all = 0;
  for (const int64_t x : {a.ks.b, a.ks.h, a.ks.s, a.vs.b, a.vs.h, a.vs.s}) all |= x * unit;
  all |= static_cast<int64_t>(reinterpret_cast<uintptr_t>(a.k) | reinterpret_cast<uintptr_t>(a.v));
  sp.copy = all % 16 == 0 ? 16 : all % 8 == 0 ? 8 : all % 4 == 0 ? 4 : 0;
  return sp;
}

int64_t smem_bytes(const DeviceArgs& a) {
  const Split sp = split_of(a, 1);  // (the chunks do not change it)
  return kR * sp.d_pad * 4 + 2 * kT * (sp.k_pitch + sp.v_pitch) + kR * kT * 4 + kR * 4 +
         kR * static_cast<int64_t>(sizeof(ScoreMod));
}

int64_t scratch_floats(const DeviceArgs& a, int sm_count) {
  const Split sp = split_of(a, sm_count);
  return a.batch * a.kv_heads * sp.rows * sp.chunks * sp.stride();
}

int64_t block_rows(const DeviceArgs&) { return 0; }  // no sparse patterns

const char* unsupported(const DeviceArgs& a) {
  if (a.q_len > kMaxQLen)
    return "q_len above 16: cuda_decode splits the keys of a few new query rows; cuda_flash runs prefill";
  if (a.max_dim() > kMaxDim) return "head_dim or head_dim_v above 256";
  if (a.sparse) return "a sparse pattern (cuda_flash and cuda_flash_bf16 run them)";
  if (a.kv_heads > 65535) return "kv_heads above 65535 (grid y)";
  if (a.batch > 65535) return "batch above 65535 (grid z)";
  return "";
}

void launch(const DeviceArgs& a, const LaunchEnv& env) {
  const Split sp = split_of(a, env.sm_count);
  const dim3 grid(static_cast<unsigned>(sp.chunks * sp.row_tiles), static_cast<unsigned>(a.kv_heads),
                  static_cast<unsigned>(a.batch));
  with_reader(a, [&](auto r) {
    launch_kernel(decode_split<decltype(r)>, grid, dim3(kThreads), static_cast<size_t>(smem_bytes(a)), env.stream, a,
                  sp, env.scratch);
  });
  const int64_t rows = a.batch * a.q_heads * a.q_len;
  launch_kernel(decode_merge, dim3(static_cast<unsigned>(ceil_div(rows, kWarps))), dim3(kThreads), 0, env.stream, a, sp,
                static_cast<const float*>(env.scratch));
}

}  // namespace decode_impl

const cuda_impl::KernelOps decode_ops = {decode_impl::scratch_floats, decode_impl::smem_bytes, decode_impl::unsupported,
                                         decode_impl::block_rows, decode_impl::launch};

}  // namespace attnlab::ATTN_CUDA_NS
