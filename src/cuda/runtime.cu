// Host runtime of the CUDA kernels: finding the device, keeping device buffers, copying,
// launching and timing with CUDA events. No kernel code here (see naive.cu, flash.cu).
//
// Why a cache of device buffers: Session::run must not allocate in steady state, and
// cudaMalloc/cudaFree cost milliseconds and synchronize the device. Buffers grow to the
// largest problem seen and are released at exit or by release(); each is an RAII owner, so an
// exception anywhere frees nothing twice and leaks nothing. One mutex serializes runs: the
// buffers, stream and events are shared.
// Errors: every runtime call is checked; a failure becomes std::runtime_error("CUDA error in
// <call>: <cudaErrorName>: <text>"), after the stream is drained so no copy still reads or
// writes host memory the caller is about to free.
#include <cuda_runtime.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/runtime.hpp"

namespace attnlab::cuda_dev {
namespace {

std::string error_text(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error so the next run starts clean
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " + error_text(e));
  }
}

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

int fp32_lanes_per_sm(int major, int minor) {
  if (major == 8 && minor == 0) return 64;  // A100: 64 FP32 units per SM
  return 128;                               // sm_86/87/89, sm_90 and later
}

// Dense bf16 FLOP per SM per clock on the tensor cores with float32 accumulation (mma / wgmma):
// A100 312 TFLOP/s = 108 SMs x 1.41 GHz x 2048; H100 SXM 989 = 132 x 1.83 GHz x 4096 (datasheets);
// A10/A40/L40S-class sm_86/89 1024 (GeForce parts accumulate float32 at half that).
int bf16_tensor_flop_per_sm_clock(int major, int minor) {
  if (major == 8 && minor == 0) return 2048;
  if (major >= 9) return 4096;
  return 1024;
}

struct Probe {
  std::string reason;  // empty: usable
  cuda::DeviceInfo info;
};

Probe probe_device() {
  Probe p;
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    // Without a driver this is cudaErrorInsufficientDriver, not cudaErrorNoDevice.
    cudaGetLastError();
    p.reason = "no CUDA device (" + std::string(cudaGetErrorString(e)) + ")";
    return p;
  }
  if (count == 0) {
    p.reason = "no CUDA device (cudaGetDeviceCount found none)";
    return p;
  }
  cudaDeviceProp prop{};
  if (cudaError_t e = cudaGetDeviceProperties(&prop, 0); e != cudaSuccess) {
    cudaGetLastError();
    p.reason = "no CUDA device (cudaGetDeviceProperties: " + std::string(cudaGetErrorString(e)) + ")";
    return p;
  }
  auto attr = [](cudaDeviceAttr a) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, a, 0) != cudaSuccess) {
      cudaGetLastError();
      v = 0;
    }
    return v;
  };
  cuda::DeviceInfo& d = p.info;
  d.name = prop.name;
  d.cc_major = prop.major;
  d.cc_minor = prop.minor;
  d.sm_count = prop.multiProcessorCount;
  d.clock_ghz = attr(cudaDevAttrClockRate) * 1e-6;  // kHz
  d.fp32_lanes_per_sm = fp32_lanes_per_sm(d.cc_major, d.cc_minor);
  d.fp32_peak_tflops = d.sm_count * d.fp32_lanes_per_sm * 2.0 * d.clock_ghz * 1e-3;
  d.bf16_tensor_peak_tflops = d.sm_count * bf16_tensor_flop_per_sm_clock(d.cc_major, d.cc_minor) * d.clock_ghz * 1e-3;
  d.mem_bandwidth_gbs =
      2.0 * attr(cudaDevAttrMemoryClockRate) * 1e3 * (attr(cudaDevAttrGlobalMemoryBusWidth) / 8.0) * 1e-9;
  d.global_mem_bytes = static_cast<long long>(prop.totalGlobalMem);
  d.smem_per_block_optin = attr(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  if (d.cc_major < 8) {
    // The binary holds sm_80 and sm_90 code (+ sm_90 PTX); older GPUs cannot run it.
    p.reason = "no supported CUDA device (" + d.name + " is compute capability " + std::to_string(d.cc_major) + "." +
               std::to_string(d.cc_minor) + "; this build needs 8.0 or newer)";
  }
  return p;
}

const Probe& probe() {
  static const Probe p = probe_device();
  return p;
}

// One owned device allocation, grown on demand.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }
  void reset() {
    if (ptr_) cudaFree(ptr_);  // at exit the runtime may be gone already: nothing to report
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <class T>
  T* get(size_t count, const char* what) {
    const size_t bytes = count * sizeof(T);
    if (bytes > bytes_) {
      reset();
      if (cudaError_t e = cudaMalloc(&ptr_, bytes); e != cudaSuccess) {
        ptr_ = nullptr;
        cudaGetLastError();
        throw std::runtime_error(std::string("CUDA error in cudaMalloc of ") + mib(static_cast<double>(bytes)) +
                                 " for " + what + ": " + error_text(e));
      }
      bytes_ = bytes;
    }
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class Event {
 public:
  Event() { check(cudaEventCreate(&e_), "cudaEventCreate"); }
  ~Event() { cudaEventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_{};
};

class Stream {
 public:
  Stream() { check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_{};
};

struct Resources {
  Stream stream;
  Event start, copied_in, computed, timed_start, timed_end, copied_out;
  DeviceBuffer q, k, v, o, lse, kv_lens, scratch, table;
  DeviceBuffer map_start, map_entries, map_bits, map_empty;  // a sparse pattern's block map
  DeviceBuffer alibi, sinks;                                 // per query head (score modifications)
  void release_buffers() {
    for (DeviceBuffer* b : {&q, &k, &v, &o, &lse, &kv_lens, &scratch, &table, &map_start, &map_entries, &map_bits,
                            &map_empty, &alibi, &sinks}) {
      b->reset();
    }
  }
};

std::mutex g_mutex;
std::unique_ptr<Resources>& resources_slot() {
  static std::unique_ptr<Resources> r;
  return r;
}

float elapsed_ms(const Event& a, const Event& b) {
  float ms = 0.f;
  check(cudaEventElapsedTime(&ms, a.get(), b.get()), "cudaEventElapsedTime");
  return ms;
}

// Drains the stream when a run leaves by an exception.
struct DrainOnExit {
  cudaStream_t s;
  bool armed = true;
  ~DrainOnExit() {
    if (armed) {
      cudaStreamSynchronize(s);
      cudaGetLastError();
    }
  }
};

}  // namespace

const std::string& unavailable_reason() { return probe().reason; }

std::optional<cuda::DeviceInfo> info() {
  if (!probe().reason.empty()) return std::nullopt;
  return probe().info;
}

void release() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (auto& r = resources_slot()) r->release_buffers();
}

void run(const cuda_impl::KernelOps& ops, const cuda_impl::DeviceArgs& host, const Extents& ext, cuda::Timing& timing,
         int timed_launches) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const Probe& pr = probe();
  if (!pr.reason.empty()) throw std::runtime_error(pr.reason);
  check(cudaSetDevice(0), "cudaSetDevice");
  auto& slot = resources_slot();
  if (!slot) slot = std::make_unique<Resources>();
  Resources& r = *slot;
  const cudaStream_t s = r.stream.get();

  const int64_t smem = ops.smem_bytes(host);
  if (smem > pr.info.smem_per_block_optin) {
    throw std::runtime_error("the kernel needs " + std::to_string(smem) +
                             " bytes of shared memory per block for head_dim " + std::to_string(host.max_dim()) + "; " +
                             pr.info.name + " allows " + std::to_string(pr.info.smem_per_block_optin));
  }

  cuda_impl::DeviceArgs d = host;
  const size_t in_size = static_cast<size_t>(dtype_bytes(host.dtype));  // Q, K, V as stored
  const size_t kv_size = static_cast<size_t>(host.kv_unit_bytes());     // (a quantized cache: bytes)
  unsigned char* dq = r.q.get<unsigned char>(static_cast<size_t>(ext.q) * in_size, "Q");
  unsigned char* dk = r.k.get<unsigned char>(static_cast<size_t>(ext.k) * kv_size, "K");
  unsigned char* dv = r.v.get<unsigned char>(static_cast<size_t>(ext.v) * kv_size, "V");
  d.q = dq;
  d.k = dk;
  d.v = dv;
  d.o = r.o.get<float>(ext.o, "O");
  d.lse = host.lse ? r.lse.get<float>(ext.lse, "LSE") : nullptr;
  int64_t* dlens = host.kv_lens ? r.kv_lens.get<int64_t>(host.batch, "kv_lens") : nullptr;
  d.kv_lens = dlens;
  const int64_t scratch = ops.scratch_floats(host, pr.info.sm_count);
  cuda_impl::LaunchEnv env{s, pr.info.sm_count, scratch > 0 ? r.scratch.get<float>(scratch, "scratch") : nullptr};

  DrainOnExit drain{s};
  const size_t f = sizeof(float);
  check(cudaEventRecord(r.start.get(), s), "cudaEventRecord");
  check(cudaMemcpyAsync(dq, host.q, static_cast<size_t>(ext.q) * in_size, cudaMemcpyHostToDevice, s),
        "cudaMemcpy Q to device");
  check(cudaMemcpyAsync(dk, host.k, static_cast<size_t>(ext.k) * kv_size, cudaMemcpyHostToDevice, s),
        "cudaMemcpy K to device");
  check(cudaMemcpyAsync(dv, host.v, static_cast<size_t>(ext.v) * kv_size, cudaMemcpyHostToDevice, s),
        "cudaMemcpy V to device");
  size_t table_bytes = 0;
  if (host.table) {  // a paged cache's block table
    table_bytes = static_cast<size_t>(host.batch * host.table_len) * sizeof(int32_t);
    int32_t* dt = r.table.get<int32_t>(static_cast<size_t>(host.batch * host.table_len), "block table");
    check(cudaMemcpyAsync(dt, host.table, table_bytes, cudaMemcpyHostToDevice, s), "cudaMemcpy block table to device");
    d.table = dt;
  }
  if (dlens) {
    check(cudaMemcpyAsync(dlens, host.kv_lens, static_cast<size_t>(host.batch) * sizeof(int64_t),
                          cudaMemcpyHostToDevice, s),
          "cudaMemcpy kv_lens to device");
  }
  size_t head_bytes = 0;  // the score modifications' per-head slopes and sink logits
  const auto copy_heads = [&](DeviceBuffer& buf, const float* src, const char* what) -> const float* {
    if (!src) return nullptr;
    float* dst = buf.get<float>(static_cast<size_t>(host.q_heads), what);
    const size_t bytes = static_cast<size_t>(host.q_heads) * sizeof(float);
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s), (std::string("cudaMemcpy ") + what).c_str());
    head_bytes += bytes;
    return dst;
  };
  d.alibi = copy_heads(r.alibi, host.alibi, "ALiBi slopes");
  d.sinks = copy_heads(r.sinks, host.sinks, "sink logits");
  size_t map_bytes = 0;
  if (host.sparse) {
    // The block map (built on the host by the plan), copied with the inputs.
    const auto copy = [&](DeviceBuffer& buf, const auto* src, int64_t n, const char* what) {
      using T = std::remove_cv_t<std::remove_pointer_t<decltype(src)>>;
      T* dst = buf.get<T>(static_cast<size_t>(n), what);
      if (n > 0) {
        check(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(T), cudaMemcpyHostToDevice, s),
              (std::string("cudaMemcpy ") + what + " to device").c_str());
      }
      map_bytes += static_cast<size_t>(n) * sizeof(T);
      return dst;
    };
    d.map.start = copy(r.map_start, host.map.start, host.map.n_start, "block map starts");
    d.map.entries = copy(r.map_entries, host.map.entries, host.map.n_entries, "block map entries");
    d.map.bits = copy(r.map_bits, host.map.bits, host.map.n_bits, "block map words");
    d.map.row_empty = copy(r.map_empty, host.map.row_empty, host.map.n_empty, "block map empty rows");
  }
  check(cudaEventRecord(r.copied_in.get(), s), "cudaEventRecord");
  ops.launch(d, env);
  check(cudaGetLastError(), "kernel launch");
  check(cudaEventRecord(r.computed.get(), s), "cudaEventRecord");
  if (timed_launches > 0) {
    // Queued while the first launch still runs, so the device goes from one to the next with
    // no host gap; each rewrites the same O and LSE.
    check(cudaEventRecord(r.timed_start.get(), s), "cudaEventRecord");
    for (int i = 0; i < timed_launches; ++i) ops.launch(d, env);
    check(cudaGetLastError(), "kernel launch (timed)");
    check(cudaEventRecord(r.timed_end.get(), s), "cudaEventRecord");
  }
  size_t d2h = 0;
  if (ext.o_dense) {
    check(cudaMemcpyAsync(host.o, d.o, static_cast<size_t>(ext.o) * f, cudaMemcpyDeviceToHost, s),
          "cudaMemcpy O to host");
  } else {
    // O's rows are interleaved with memory that is not O: copy row blocks, leave the rest.
    const cuda_impl::RowBlockCopy blk = cuda_impl::o_row_blocks(host);
    const size_t pitch = static_cast<size_t>(blk.pitch) * f;
    for (int64_t b = 0; b < host.batch; ++b) {
      for (int64_t h = 0; h < host.q_heads; ++h) {
        const int64_t off = host.os.at(b, h, 0);
        check(cudaMemcpy2DAsync(host.o + off, pitch, d.o + off, pitch, static_cast<size_t>(blk.width) * f,
                                static_cast<size_t>(blk.rows), cudaMemcpyDeviceToHost, s),
              "cudaMemcpy2D O to host");
      }
    }
  }
  d2h += static_cast<size_t>(ext.o_dense ? ext.o : host.batch * host.q_heads * host.q_len * host.head_dim_v) * f;
  if (d.lse) {
    check(cudaMemcpyAsync(host.lse, d.lse, static_cast<size_t>(ext.lse) * f, cudaMemcpyDeviceToHost, s),
          "cudaMemcpy LSE to host");
    d2h += static_cast<size_t>(ext.lse) * f;
  }
  check(cudaEventRecord(r.copied_out.get(), s), "cudaEventRecord");
  // Kernel faults (illegal address, ...) surface here.
  check(cudaEventSynchronize(r.copied_out.get()), "kernel execution or copy back");
  drain.armed = false;

  timing.h2d_ms = elapsed_ms(r.start, r.copied_in);
  timing.first_launch_ms = elapsed_ms(r.copied_in, r.computed);
  timing.launches = timed_launches;
  timing.kernel_ms =
      timed_launches > 0 ? elapsed_ms(r.timed_start, r.timed_end) / timed_launches : timing.first_launch_ms;
  timing.d2h_ms = elapsed_ms(timed_launches > 0 ? r.timed_end : r.computed, r.copied_out);
  timing.h2d_bytes = static_cast<double>(
      static_cast<size_t>(ext.q) * in_size + static_cast<size_t>(ext.k + ext.v) * kv_size +
      (dlens ? static_cast<size_t>(host.batch) * sizeof(int64_t) : 0) + map_bytes + table_bytes + head_bytes);
  timing.d2h_bytes = static_cast<double>(d2h);
}

namespace {

// Every thread sums its grid-strided 16-byte loads, four in flight; nothing is written unless the
// sum is a value a zeroed buffer never gives (so the loads are not dead code).
__global__ void read_probe(const float4* __restrict__ src, size_t n, float* sink) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float acc = 0.f;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const float4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    acc += ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w)) + ((c.x + c.y) + (c.z + c.w)) +
           ((d.x + d.y) + (d.z + d.w));  // (every element: 16-byte loads, not narrowed ones)
  }
  for (; i < n; i += stride) acc += (src[i].x + src[i].y) + (src[i].z + src[i].w);
  if (acc == 12345.f) *sink = acc;
}
__global__ void copy_probe(const float4* __restrict__ src, float4* __restrict__ dst, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = src[i];
}

}  // namespace

cuda::Bandwidth measure_bandwidth(double bytes, int reps) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const Probe& pr = probe();
  if (!pr.reason.empty()) throw std::runtime_error(pr.reason);
  check(cudaSetDevice(0), "cudaSetDevice");
  const size_t n = static_cast<size_t>(bytes) / sizeof(float4);
  DeviceBuffer src, dst, sink;
  float4* s = src.get<float4>(n, "bandwidth source");
  float4* d = dst.get<float4>(n, "bandwidth destination");
  float* k = sink.get<float>(1, "bandwidth sink");
  check(cudaMemset(s, 0, n * sizeof(float4)), "cudaMemset");
  Event a, b;
  const dim3 grid(static_cast<unsigned>(pr.info.sm_count * 8)), block(256);
  const auto best_ms = [&](auto launch) {
    launch();  // warm-up
    float best = 0.f;
    for (int r = 0; r < reps; ++r) {
      check(cudaEventRecord(a.get()), "cudaEventRecord");
      launch();
      check(cudaEventRecord(b.get()), "cudaEventRecord");
      check(cudaEventSynchronize(b.get()), "bandwidth probe");
      const float ms = elapsed_ms(a, b);
      best = r == 0 || ms < best ? ms : best;
    }
    return static_cast<double>(best);
  };
  const double total = static_cast<double>(n * sizeof(float4));
  cuda::Bandwidth bw;
  bw.bytes = total;
  bw.read_gbs = total / (best_ms([&] { read_probe<<<grid, block>>>(s, n, k); }) * 1e-3) * 1e-9;
  bw.copy_gbs = 2 * total / (best_ms([&] { copy_probe<<<grid, block>>>(s, d, n); }) * 1e-3) * 1e-9;
  check(cudaGetLastError(), "bandwidth probe launch");
  return bw;
}

}  // namespace attnlab::cuda_dev
