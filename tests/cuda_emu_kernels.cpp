// The CUDA kernels' device code, compiled as C++ against the host emulation
// (src/cuda/emu.hpp), so tests can run them on machines without a GPU.
// Defines attnlab::cuda_emu::naive_ops and flash_ops (declared in src/cuda/args.hpp) and the
// test-only kernels of tests/cuda_emu.hpp.
#define ATTN_CUDA_EMU 1
#include "cuda/naive.cu"
#include "cuda/flash.cu"
#include "cuda/tensor_core.cuh"

#include <algorithm>
#include <cmath>

#include "cuda/host_args.hpp"
#include "cuda_emu.hpp"

namespace attnlab::test {
namespace {

class EmulatedKernel final : public Kernel {
 public:
  static constexpr int kSms = 1;  // sizes naive's grid: 64 warps, so rows are grid-strided
  EmulatedKernel(std::string name, const cuda_impl::KernelOps& ops) : name_(std::move(name)), ops_(ops) {}
  bool runs_patterns() const override { return ops_.block_rows(cuda_impl::DeviceArgs{}) > 0; }
  bool runs_head_dim_v() const override { return true; }
  std::shared_ptr<const Plan> make_plan(const Problem& p) const override { return cuda_impl::block_plan(p, ops_); }
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return "CUDA device code under host emulation"; }
  Support supports(const Problem& p) const override {
    const char* why = ops_.unsupported(cuda_impl::problem_args(p));
    return *why ? Support::no(why) : Support::yes();
  }
  size_t workspace_bytes(const Problem& p, int) const override {
    return static_cast<size_t>(ops_.scratch_floats(cuda_impl::problem_args(p), kSms)) * sizeof(float);
  }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    // On a GPU, O, LSE and the scratch live in fresh device memory (cudaMalloc: anything):
    // NaN here, so an output row the kernel leaves unwritten, or scratch read before it is
    // written, fails the check instead of passing on what the host buffer happened to hold.
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.q_heads; ++h)
        for (int64_t i = 0; i < p.q_len; ++i) std::fill_n(out.o.row(b, h, i), p.dim_v(), std::nanf(""));
    if (out.lse) std::fill_n(out.lse, p.lse_elems(), std::nanf(""));
    std::fill(ctx.workspace.begin(), ctx.workspace.end(), std::byte{0xff});
    cuda_impl::DeviceArgs a = cuda_impl::device_args(p, in, out);
    std::shared_ptr<const Plan> keep;
    cuda_impl::attach_plan(a, p, ops_, ctx.plan, keep);
    ops_.launch(a, cuda_impl::LaunchEnv{nullptr, kSms, reinterpret_cast<float*>(ctx.workspace.data())});
  }

 private:
  std::string name_;
  const cuda_impl::KernelOps& ops_;
};

}  // namespace

const Kernel& emulated_cuda(const std::string& which) {
  static const EmulatedKernel naive("emu_cuda_naive", cuda_emu::naive_ops);
  static const EmulatedKernel flash("emu_cuda_flash", cuda_emu::flash_ops);
  return which == "naive" ? naive : flash;
}

}  // namespace attnlab::test

// Two tiny kernels that break the barrier rules on purpose, to show the emulation notices.
namespace attnlab::cuda_emu::selftest {

// Each thread reads its neighbour's shared slot without a __syncthreads in between.
__global__ void missing_barrier(float* out) {
  float* s = dynamic_smem<float>();
  s[threadIdx.x] = static_cast<float>(threadIdx.x);
  out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

// The same with the barrier: must always be right.
__global__ void with_barrier(float* out) {
  float* s = dynamic_smem<float>();
  s[threadIdx.x] = static_cast<float>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

// Half of a warp waits at __syncthreads while the other half waits in a shuffle: never completes.
__global__ void divergent_barrier(float* out) {
  float v = static_cast<float>(threadIdx.x);
  if (threadIdx.x % 32 < 16) __syncthreads();
  out[threadIdx.x] = __shfl_xor_sync(kFullMask, v, 16);
}

// Group reductions over 16 lanes, as cuda_flash uses them.
__global__ void group_reductions(float* out) {
  const float v = static_cast<float>(threadIdx.x);
  out[2 * threadIdx.x] = group_max<16>(v);
  out[2 * threadIdx.x + 1] = group_sum<16>(v);
}

// Every lane of the warp shuffles, but the mask names only lanes 0..15.
__global__ void mask_leaves_out_lanes(float* out) {
  out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, static_cast<float>(threadIdx.x), 1);
}

// Lanes 0..15 shuffle among themselves (the others have left), but lane 15 reads lane 16.
__global__ void reads_outside_the_mask(float* out) {
  if (threadIdx.x % 32 >= 16) return;
  out[threadIdx.x] = __shfl_sync(0x0000ffffu, static_cast<float>(threadIdx.x), threadIdx.x % 32 + 1);
}

// Legal: each half-warp shuffles with its own mask.
__global__ void half_warps_with_their_masks(float* out) {
  const unsigned mask = threadIdx.x % 32 < 16 ? 0x0000ffffu : 0xffff0000u;
  out[threadIdx.x] = __shfl_xor_sync(mask, static_cast<float>(threadIdx.x), 1);
}

// Multiplies shared memory that nothing wrote by 0 (as a kernel that loads no padding would).
__global__ void zero_times_unwritten(float* out) { out[threadIdx.x] = 0.f * dynamic_smem<float>()[threadIdx.x]; }

// One m16n8k16 product: each lane's A, B, C fragments gathered from row-major A (16 x 16), B
// (16 x 8: k down), C (16 x 8) by the PTX ISA's tables as written out here (not through
// tensor_core::, so the test reads the tables on its own), D stored per lane: D[lane * 4 + i].
__global__ void mma_one(const uint16_t* A, const uint16_t* B, const float* C, float* D, int leave_lane) {
  const int lane = static_cast<int>(threadIdx.x), g = lane / 4, t = lane % 4;
  if (lane == leave_lane) return;
  const auto pair = [](uint16_t lo, uint16_t hi) {
    return static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
  };
  const uint32_t a[4] = {pair(A[g * 16 + 2 * t], A[g * 16 + 2 * t + 1]),
                         pair(A[(g + 8) * 16 + 2 * t], A[(g + 8) * 16 + 2 * t + 1]),
                         pair(A[g * 16 + 2 * t + 8], A[g * 16 + 2 * t + 9]),
                         pair(A[(g + 8) * 16 + 2 * t + 8], A[(g + 8) * 16 + 2 * t + 9])};
  const uint32_t b[2] = {pair(B[(2 * t) * 8 + g], B[(2 * t + 1) * 8 + g]),
                         pair(B[(2 * t + 8) * 8 + g], B[(2 * t + 9) * 8 + g])};
  const float c[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
  float d[4];
  mma_bf16_16x8x16(d, a, b, c);
  for (int i = 0; i < 4; ++i) D[lane * 4 + i] = d[i];
}

// ldmatrix_x4 of four 8 x 8 b16 matrices M (matrix j's row r at M[j * 64 + r * 8]) put in shared
// memory: out[lane * 4 + j] = the register lane receives of matrix j.
template <bool kTrans>
__global__ void ldmatrix_one(const uint16_t* M, uint32_t* out) {
  uint16_t* s = dynamic_smem<uint16_t>();
  for (int e = static_cast<int>(threadIdx.x); e < 256; e += 32) s[e] = M[e];
  __syncthreads();
  uint32_t r[4];
  ldmatrix_x4<kTrans>(r, s + (threadIdx.x / 8) * 64 + (threadIdx.x % 8) * 8);
  for (int j = 0; j < 4; ++j) out[threadIdx.x * 4 + j] = r[j];
}

// The two together as a FlashAttention-2 kernel uses them: A (16 x 16) row-major and B (16 x 16,
// k down: V's layout) row-major in shared memory, A's fragments by ldmatrix_x4, B's by
// ldmatrix_x4.trans (two n-tiles of 8), two mma: D (16 x 16) = A B, stored row-major.
__global__ void ldmatrix_mma(const uint16_t* A, const uint16_t* B, float* D) {
  uint16_t* s = dynamic_smem<uint16_t>();  // A at 0, B at 256, rows of 16 elements
  for (int e = static_cast<int>(threadIdx.x); e < 512; e += 32) s[e] = e < 256 ? A[e] : B[e - 256];
  __syncthreads();
  const int lane = static_cast<int>(threadIdx.x), m = lane / 8, r = lane % 8;
  // matrix m of A: rows 8 (m % 2) .., columns 8 (m / 2) .. - the order of a[0..3]; of B: k rows
  // 8 (m % 2) .., n columns 8 (m / 2) .. - b of n-tile 0 is {r0, r1}, of n-tile 1 {r2, r3}.
  uint32_t a[4], b[4];
  ldmatrix_x4<false>(a, s + (8 * (m % 2) + r) * 16 + 8 * (m / 2));
  ldmatrix_x4<true>(b, s + 256 + (8 * (m % 2) + r) * 16 + 8 * (m / 2));
  const float zero[4] = {0, 0, 0, 0};
  for (int n = 0; n < 2; ++n) {
    float d[4];
    mma_bf16_16x8x16(d, a, b + 2 * n, zero);
    for (int i = 0; i < 4; ++i) {
      const auto at = tensor_core::mma_c(lane, i);
      D[at.row * 16 + 8 * n + at.col] = d[i];
    }
  }
}

void mma(const uint16_t* A, const uint16_t* B, const float* C, float* D, int leave_lane) {
  launch_kernel(mma_one, dim3(1), dim3(32), 0, nullptr, A, B, C, D, leave_lane);
}
void ldmatrix(const uint16_t* M, uint32_t* out, bool trans) {
  if (trans)
    launch_kernel(ldmatrix_one<true>, dim3(1), dim3(32), 512, nullptr, M, out);
  else
    launch_kernel(ldmatrix_one<false>, dim3(1), dim3(32), 512, nullptr, M, out);
}
void ldmatrix_then_mma(const uint16_t* A, const uint16_t* B, float* D) {
  launch_kernel(ldmatrix_mma, dim3(1), dim3(32), 1024, nullptr, A, B, D);
}

void run(int which, float* out, unsigned threads) {
  void (*const kernels[])(float*) = {
      missing_barrier,       with_barrier,           divergent_barrier,           group_reductions,
      mask_leaves_out_lanes, reads_outside_the_mask, half_warps_with_their_masks, zero_times_unwritten};
  launch_kernel(kernels[which], dim3(1), dim3(threads), threads * sizeof(float), nullptr, out);
}

}  // namespace attnlab::cuda_emu::selftest
