// The CUDA kernels' device code, compiled as C++ against the host emulation
// (src/cuda/emu.hpp), so tests can run them on machines without a GPU.
// Defines attnlab::cuda_emu::naive_ops and flash_ops (declared in src/cuda/args.hpp) and the
// test-only kernels of tests/cuda_emu.hpp.
#define ATTN_CUDA_EMU 1
#include "cuda/naive.cu"
#include "cuda/flash.cu"
#include "cuda/flash_bf16.cu"
#include "cuda/decode.cu"
#include "cuda/tensor_core_selftest.cuh"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

#include "cuda/host_args.hpp"
#include "cuda_emu.hpp"

namespace attnlab::test {
namespace {

class EmulatedKernel final : public Kernel {
 public:
  // A row of src/cuda/kernel_list.hpp: the registry kernel's capabilities; sms: the SM count the
  // launch is sized for (naive's grid: 1 SM = 64 warps, so rows are grid-strided; decode's chunks:
  // an H100's 132, so the keys split as they would there).
  EmulatedKernel(std::string name, const cuda_impl::KernelOps& ops, Capabilities caps, int sms)
      : name_(std::move(name)), ops_(ops), caps_(caps), sms_(sms) {}
  const Capabilities& capabilities() const override { return caps_; }
  std::shared_ptr<const Plan> make_plan(const Problem& p) const override { return cuda_impl::block_plan(p, ops_); }
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return "CUDA device code under host emulation"; }
  Support supports(const Problem& p) const override {
    const char* why = ops_.unsupported(cuda_impl::problem_args(p));
    return *why ? Support::no(why) : Support::yes();
  }
  size_t workspace_bytes(const Problem& p, int) const override {
    return static_cast<size_t>(ops_.scratch_floats(cuda_impl::problem_args(p), sms_)) * sizeof(float);
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
    std::vector<float> head_terms;
    cuda_impl::attach_head_terms(a, p, head_terms);
    ops_.launch(a, cuda_impl::LaunchEnv{nullptr, sms_, reinterpret_cast<float*>(ctx.workspace.data())});
  }

 private:
  std::string name_;
  const cuda_impl::KernelOps& ops_;
  Capabilities caps_;
  int sms_;
};

}  // namespace

const Kernel& emulated_cuda(const std::string& which) {
#define ATTN_EMU_ENTRY(id, description, precision, caps, sms) \
  {#id, EmulatedKernel("emu_cuda_" #id, cuda_emu::id##_ops, caps, sms)},
  static const std::pair<std::string, EmulatedKernel> all[] = {ATTN_CUDA_KERNELS(ATTN_EMU_ENTRY)};
#undef ATTN_EMU_ENTRY
  for (const auto& [id, k] : all)
    if (id == which) return k;
  throw std::invalid_argument("emulated_cuda: no CUDA kernel '" + which + "' in src/cuda/kernel_list.hpp");
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

// ldmatrix given a row address 2 bytes past a 16-byte boundary (a GPU's fault; here a report).
__global__ void ldmatrix_misaligned(float* out) {
  uint32_t r[4];
  ldmatrix_x4<false>(r, dynamic_smem<uint16_t>() + 1 + 8 * (threadIdx.x % 32));
  out[threadIdx.x] = static_cast<float>(r[0]);
}

// cp.async: thread t copies 16 bytes (floats 4t .. 4t + 3 of a source) into shared memory and
// reads its neighbour's copy. `how`: 0 waits and syncs (always right), 1 syncs without waiting
// (wrong where a copy had not landed), 2 copies from a misaligned source, 3 never waits.
alignas(16) float g_copy_source[4 * 256 + 4];
void cp_async_neighbour(float* out, int how) {
  float* s = dynamic_smem<float>();
  const unsigned t = threadIdx.x, n = blockDim.x;
  cp_async<16>(s + 4 * t, g_copy_source + 4 * t + (how == 2 ? 1 : 0), 16);
  cp_async_commit();
  if (how == 0) cp_async_wait<0>();
  __syncthreads();
  out[t] = s[4 * ((t + 1) % n)];
  if (how == 1) cp_async_wait<0>();
}
__global__ void cp_async_waited(float* out) { cp_async_neighbour(out, 0); }
__global__ void cp_async_not_waited(float* out) { cp_async_neighbour(out, 1); }
__global__ void cp_async_misaligned(float* out) { cp_async_neighbour(out, 2); }
__global__ void cp_async_never_waited(float* out) { cp_async_neighbour(out, 3); }

// The tensor-core self-test kernels (src/cuda/tensor_core_selftest.cuh) on host memory.
void mma(const uint16_t* A, const uint16_t* B, const float* C, float* D, int leave_lane) {
  tc_selftest::mma(A, B, C, D, leave_lane);
}
void ldmatrix(const uint16_t* M, uint32_t* out, bool trans) { tc_selftest::ldmatrix(M, out, trans); }
void ldmatrix_then_mma(const uint16_t* A, const uint16_t* B, float* D) { tc_selftest::ldmatrix_then_mma(A, B, D); }

void run(int which, float* out, unsigned threads) {
  void (*const kernels[])(float*) = {
      missing_barrier,       with_barrier,           divergent_barrier,           group_reductions,
      mask_leaves_out_lanes, reads_outside_the_mask, half_warps_with_their_masks, zero_times_unwritten,
      ldmatrix_misaligned,   cp_async_waited,        cp_async_not_waited,         cp_async_misaligned,
      cp_async_never_waited};
  for (int i = 0; i < 4 * 256 + 4; ++i) g_copy_source[i] = static_cast<float>(i);
  launch_kernel(kernels[which], dim3(1), dim3(threads), 4 * threads * sizeof(float), nullptr, out);
}

}  // namespace attnlab::cuda_emu::selftest
