// The CUDA side of the lab as the rest of the code sees it (plain C++: usable in every build).
//
// cuda_naive, cuda_flash, cuda_flash_bf16 and cuda_decode are ordinary registry kernels:
// Session::run copies Q, K, V (and kv_lens, a block table) to the device, runs the kernel, copies O
// (and LSE) back, and returns when the results are on the host. Device buffers are kept between runs and grown when a
// larger problem comes (so run() allocates nothing in steady state); release_device_memory() frees them.
//
// Timing for benchmarks: the wall time of Session::run includes the copies. Every run records
// CUDA-event times of its three phases; last_timing() returns those of the most recent run in
// this process:
//   h2d_ms     host-to-device copies of Q, K, V, kv_lens (pageable host memory)
//   kernel_ms  the kernel alone (events around the launch; what TFLOP/s should be computed from)
//   d2h_ms     device-to-host copies of O and LSE
// In a Google Benchmark loop (with ->UseManualTime()):
//   session.run(in, out);
//   if (auto t = cuda::last_timing(); t && cuda::is_cuda_kernel(session.kernel()))
//     state.SetIterationTime(t->kernel_ms * 1e-3);
// and FP32 fractions against device_info()->fp32_peak_tflops, not the CPU's peak.
// `attnlab cuda --time` prints (and --csv writes) such kernel-only timings directly.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace attnlab {
class Kernel;  // attnlab/kernel.hpp (not included: this header is also compiled by nvcc)
struct Support;
class Session;
struct Inputs;
struct Outputs;
}  // namespace attnlab

namespace attnlab::cuda {

// Kernel::isa() of the CUDA kernels: their % of peak is against the GPU (peaks/peak.hpp).
inline constexpr const char* kIsa = "cuda";

// The CUDA kernels in ladder order (src/cuda/kernel_list.hpp's rows; the registry lists them
// last), and each by name for direct use.
const std::vector<const Kernel*>& kernels();
const Kernel& naive();
const Kernel& flash();
const Kernel& flash_bf16();  // tensor cores: bf16 inputs, head dims <= 128 (src/cuda/flash_bf16.cu)
const Kernel& decode();      // split-KV decode over f32/16-bit/quantized, paged caches (src/cuda/decode.cu)

// Whether the CUDA kernels can run here: yes, or "built without CUDA ..." /
// "no CUDA device (<CUDA runtime error text>)" / "no supported CUDA device (...)".
Support device_status();
// True for the kernels of this file (the ones last_timing() describes).
bool is_cuda_kernel(const Kernel& k);

struct DeviceInfo {
  std::string name;                // e.g. "NVIDIA H200"
  int cc_major = 0, cc_minor = 0;  // compute capability
  int sm_count = 0;
  double clock_ghz = 0;         // peak SM clock
  int fp32_lanes_per_sm = 0;    // 64 on sm_80 (A100), 128 on sm_86+ and sm_90 (H100/H200)
  double fp32_peak_tflops = 0;  // sm_count * lanes * 2 FLOP (FMA) * clock: the non-tensor peak
  // Dense bf16 products with float32 accumulation on the tensor cores: sm_count * FLOP per SM per
  // clock (2048 sm_80, 4096 sm_90, 1024 other sm_8x) * clock (runtime.cu's table). At the clock the
  // device reports (H100/H200: 1.98 GHz) this is 8% above NVIDIA's datasheet 989 TFLOP/s (1.83 GHz).
  double bf16_tensor_peak_tflops = 0;
  double mem_bandwidth_gbs = 0;  // nominal: 2 * memory clock * bus width
  long long global_mem_bytes = 0;
  int smem_per_block_optin = 0;  // bytes of dynamic shared memory a block may opt in to
  std::string describe() const;  // one line for reports
};
// The device the kernels run on (device 0), when device_status() is yes.
std::optional<DeviceInfo> device_info();

struct Timing {
  double h2d_ms = 0, kernel_ms = 0, d2h_ms = 0;
  double h2d_bytes = 0, d2h_bytes = 0;
  double first_launch_ms = 0;  // the run's one launch, from the copies' end (may include the host's launch gap)
  int launches = 0;            // back-to-back launches kernel_ms is the mean of (0: kernel_ms is the first launch's)
};
// Times of the most recent CUDA kernel run in this process (nullopt before the first).
std::optional<Timing> last_timing();

// For benchmarks: s.run(in, out) of a CUDA kernel's session (copies in, one launch, O and LSE back
// into `out`), with `launches` more launches back to back between two CUDA events after the
// first: Timing::kernel_ms is their mean, without the host's launch gap or per-launch set-up.
// Throws InvalidInput for a session of another kernel or launches < 1; what Session::run throws
// otherwise. Also last_timing() afterwards.
Timing time_launches(Session& s, const Inputs& in, const Outputs& out, int launches);

// The device memory's bandwidth, measured on it: a read kernel (16-byte loads summed, nothing
// written) and a copy kernel (bytes read + bytes written) over buffers of `bytes`, far larger than
// any L2; the best of `reps` runs, each timed by CUDA events. What the decode kernels' GB/s are
// read against (the nominal figure of DeviceInfo is a datasheet product). Throws
// std::runtime_error where no device is usable.
struct Bandwidth {
  double read_gbs = 0, copy_gbs = 0;
  double bytes = 0;  // per buffer
};
Bandwidth measure_bandwidth(double bytes = 1024.0 * 1024 * 1024, int reps = 5);

// Frees the cached device buffers (they are also freed at exit).
void release_device_memory();

}  // namespace attnlab::cuda
