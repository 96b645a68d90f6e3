// cuda_naive: the textbook GPU baseline. One warp per query row, the row's scores in global
// memory.
//
// Idea: warp w takes rows w, w + W, ... (grid-stride over the batch * q_heads * q_len rows).
// For its row it walks the visible keys [lo, hi) of the shared interval rule with the 32 lanes
// taking every 32nd key: pass 1 writes s_j = scale * q.k_j (then softcap and ALiBi, score_mod.hpp)
// to a global scratch row and finds the max; pass 2 turns the scratch row into exp(s_j - max)
// and sums it; pass 3 has the lanes split head_dim and accumulate sum_j p_j * v_j, and the finish
// adds the head's sink logit (online_softmax::finish). The scores round as the textbook's do (no
// fused multiply-add, device.cuh's mul_rn/add_rn): the float32 tolerance is a multiple of the
// textbook's realized error, and at huge scores a fused rounding alone measured 4.6x it on an
// H200 (results/2026-12-04-gpu_check). Masked keys are never read (no NaN leaks);
// NaN/Inf in visible keys follow include/attnlab/blocks/online_softmax.hpp, as in the reference.
// Memory: the scratch is (resident warps) x kv_len floats, not batch*heads*q_len*kv_len: the
// grid is sized to the warps the GPU can hold (sm_count * 64), so it stays O(kv_len) per SM.
// Cost: every row rereads all its keys' K and V from L2/HBM (no reuse across rows), each lane
// reads a different K row (uncoalesced), and the scores make a round trip through memory:
// expect a few percent of the FP32 peak. It is the yardstick cuda_flash is measured against.
#include "attnlab/blocks/online_softmax.hpp"
#include "cuda/device.cuh"

namespace attnlab::ATTN_CUDA_NS {
namespace naive_impl {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kResidentWarpsPerSm = 64;  // 2048 threads per SM on sm_80 / sm_90

// E: the storage type of Q, K, V (float, bf16, f16), widened exactly where read.
template <class E>
__global__ void __launch_bounds__(kThreads) naive_kernel(DeviceArgs a, float* scratch, int64_t warps) {
  const E* qa = static_cast<const E*>(a.q);
  const E* ka = static_cast<const E*>(a.k);
  const E* va = static_cast<const E*>(a.v);
  const int lane = threadIdx.x % 32;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  float* s = scratch + warp * a.kv_len;
  const int64_t rows = a.batch * a.q_heads * a.q_len;
  for (int64_t row = warp; row < rows; row += warps) {
    const int64_t i = row % a.q_len;
    const int64_t h = (row / a.q_len) % a.q_heads;
    const int64_t b = row / (a.q_len * a.q_heads);
    const int64_t hk = h / a.group();
    const MaskSpec mask = a.mask(b);
    const Interval iv = mask.row(i);
    const E* q = qa + a.qs.at(b, h, i);
    const ScoreMod mod = a.score_mod(mask, h, i, 1.f);

    float m = -INFINITY;
    for (int64_t j = iv.lo + lane; j < iv.hi; j += 32) {
      const E* k = ka + a.ks.at(b, hk, j);
      float dot = 0.f;
      for (int64_t d = 0; d < a.head_dim; ++d) dot = add_rn(dot, mul_rn(to_float(q[d]), to_float(k[d])));
      s[j] = mod(a.scale * dot, j);
      m = fmaxf(m, s[j]);
    }
    m = group_max<32>(m);  // fmaxf drops NaN: their p is NaN all the same (online_softmax.hpp)
    const float sub = online_softmax::subtrahend(m);
    float l = 0.f;
    for (int64_t j = iv.lo + lane; j < iv.hi; j += 32) {  // empty when the row is masked
      const float p = expf(s[j] - sub);
      s[j] = p;
      l += p;
    }
    l = group_sum<32>(l);
    __syncwarp();  // every lane's p_j visible to every lane
    // A fully masked row: O = 0 (LSE -inf, or the sink logit's).
    const online_softmax::Finish fin = row_finish<online_softmax::Units::Natural>(iv.empty(), m, l, a.sink(h, 1.f));
    float* o = a.o + a.os.at(b, h, i);
    for (int64_t d = lane; d < a.head_dim_v; d += 32) {
      float acc = 0.f;
      for (int64_t j = iv.lo; j < iv.hi; ++j) acc += s[j] * to_float(va[a.vs.at(b, hk, j) + d]);
      o[d] = acc * fin.out_scale;
    }
    if (lane == 0 && a.lse) a.lse[a.lse_index(b, h, i)] = fin.lse;
    __syncwarp();  // the scratch row is rewritten by the next row
  }
}

int64_t grid_warps(const DeviceArgs& a, int sm_count) {
  const int64_t rows = a.batch * a.q_heads * a.q_len;
  const int64_t resident = static_cast<int64_t>(sm_count) * kResidentWarpsPerSm;
  return ceil_div(rows < resident ? rows : resident, kWarpsPerBlock) * kWarpsPerBlock;
}

int64_t scratch_floats(const DeviceArgs& a, int sm_count) { return grid_warps(a, sm_count) * a.kv_len; }
int64_t smem_bytes(const DeviceArgs&) { return 0; }
const char* unsupported(const DeviceArgs& a) {
  return a.sparse ? "a sparse pattern (cuda_flash runs them; cuda_naive takes interval masks only)" : "";
}

int64_t block_rows(const DeviceArgs&) { return 0; }  // no block map: no patterns

void launch(const DeviceArgs& a, const LaunchEnv& env) {
  const int64_t warps = grid_warps(a, env.sm_count);
  const dim3 grid(static_cast<unsigned>(warps / kWarpsPerBlock));
  switch (a.dtype) {
    case DType::BF16:
      launch_kernel(naive_kernel<bf16>, grid, dim3(kThreads), 0, env.stream, a, env.scratch, warps);
      break;
    case DType::F16:
      launch_kernel(naive_kernel<f16>, grid, dim3(kThreads), 0, env.stream, a, env.scratch, warps);
      break;
    case DType::F32:
      launch_kernel(naive_kernel<float>, grid, dim3(kThreads), 0, env.stream, a, env.scratch, warps);
      break;
  }
}

}  // namespace naive_impl

const cuda_impl::KernelOps naive_ops = {naive_impl::scratch_floats, naive_impl::smem_bytes, naive_impl::unsupported,
                                        naive_impl::block_rows, naive_impl::launch};

}  // namespace attnlab::ATTN_CUDA_NS
