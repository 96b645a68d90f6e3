// attnlab cuda: the CUDA device (or why there is none) and, with --time, kernel-only timings
// of the CUDA kernels from CUDA events (cuda::last_timing), with the copies reported apart.
// TFLOP/s = Problem::flops() / kernel time; "% fp32" is against the device's FP32 (non-tensor)
// peak, sm_count * FP32 lanes * 2 * clock. Each point is verified first on sampled rows. The
// kernel time is the mean of back-to-back launches between two events (cuda::time_launches): no
// host launch gap, no per-launch set-up; the median over --reps such runs is reported.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>

#include "attnlab/cuda.hpp"
#include "attnlab/kernel.hpp"
#include "attnlab/npy.hpp"
#include "attnlab/verify.hpp"
#include "bench/stats.hpp"
#include "common.hpp"

namespace attnlab::cli {

namespace {

struct CudaArgs {
  bool time = false;
  std::string impl = "cuda_flash,cuda_naive";
  std::string seq = "512,1024,2048,4096,8192";
  std::string head_dim = "64,128";
  int64_t head_dim_v = 0;  // 0 = head_dim
  std::string gqa = "1,4";
  int64_t batch = 2, q_heads = 16;
  bool no_causal = false;
  int reps = 5;
  int launches = 0;  // back-to-back launches per timed run; 0 = enough for ~20 ms (1 to 50)
  int verify_rows = 64;
  int64_t naive_max_seq = 4096;
  std::string csv;
};

using bench::median;  // src/bench/stats.hpp: the one median the lab reports

int run_timing(const CudaArgs& a) {
  const Support status = cuda::device_status();
  if (!status) throw InvalidInput("cuda --time: needs a CUDA device; " + status.reason);
  const cuda::DeviceInfo info = *cuda::device_info();
  if (a.reps < 1) throw InvalidInput("reps: " + std::to_string(a.reps) + " is not allowed; allowed: >= 1");
  if (a.launches < 0) {
    throw InvalidInput("launches: " + std::to_string(a.launches) + " is not allowed; allowed: >= 1, or 0 (auto)");
  }
  std::vector<const Kernel*> kernels;
  for (const auto& name : CLI::detail::split(a.impl, ',')) {
    const Kernel& k = kernel_or_throw(name);
    if (!cuda::is_cuda_kernel(k))
      throw InvalidInput("impl: '" + name + "' is not a CUDA kernel; allowed: cuda_naive, cuda_flash");
    kernels.push_back(&k);
  }
  std::printf("device: %s\n", info.describe().c_str());
  std::printf("%-11s %-44s %10s %8s %9s %9s %9s %8s %7s %s\n", "kernel", "problem", "kernel_ms", "launches", "h2d_ms",
              "d2h_ms", "TFLOP/s", "%fp32", "verify", "");
  std::ostringstream csv;
  csv << "kernel,batch,q_heads,kv_heads,q_len,kv_len,head_dim,head_dim_v,causal,flops,kernel_ms,launches,h2d_ms,"
         "d2h_ms,tflops,fp32_peak_tflops,fp32_fraction,verified\n";
  bool all_ok = true;
  for (int64_t d : parse_int_list("head-dim", a.head_dim))
    for (int64_t g : parse_int_list("gqa", a.gqa))
      for (int64_t s : parse_int_list("seq", a.seq)) {
        Problem p;
        p.batch = a.batch, p.q_heads = a.q_heads, p.kv_heads = a.q_heads / std::max<int64_t>(g, 1);
        p.q_len = s, p.kv_len = s, p.head_dim = d;
        p.head_dim_v = a.head_dim_v == d ? 0 : a.head_dim_v;
        p.causal = a.no_causal ? CausalAlign::None : CausalAlign::BottomRight;
        p.validate();
        Tensors t = random_tensors(p, 1);
        const Agreement ag = prepare_agreement(p, t.inputs, sample_rows(p, static_cast<size_t>(a.verify_rows), 3));
        for (const Kernel* k : kernels) {
          char shape[96];
          std::snprintf(shape, sizeof shape, "b%lld h%lld/%lld s%lld d%lld/%lld%s", (long long)p.batch,
                        (long long)p.q_heads, (long long)p.kv_heads, (long long)s, (long long)d, (long long)p.dim_v(),
                        a.no_causal ? "" : " causal");
          if (k == &cuda::naive() && s > a.naive_max_seq) continue;
          const KernelCheck c = check_kernel(*k, p, t.inputs, ag, 1);
          all_ok &= c.verdict != Verdict::Fail;
          Session session(*k, p, 1);
          session.run(t.inputs, t.outputs);  // warm-up (buffers, module load)
          const double first_ms = std::max(cuda::last_timing()->kernel_ms, 1e-3);
          const int launches =
              a.launches > 0 ? a.launches : std::clamp(static_cast<int>(std::ceil(20.0 / first_ms)), 1, 50);
          std::vector<double> kms, h2d, d2h;
          for (int r = 0; r < a.reps; ++r) {
            const cuda::Timing tm = cuda::time_launches(session, t.inputs, t.outputs, launches);
            kms.push_back(tm.kernel_ms), h2d.push_back(tm.h2d_ms), d2h.push_back(tm.d2h_ms);
          }
          const double ms = median(kms);
          const double tflops = p.flops() / (ms * 1e-3) * 1e-12;
          const double frac = info.fp32_peak_tflops > 0 ? tflops / info.fp32_peak_tflops : 0;
          std::printf("%-11s %-44s %10.3f %8d %9.3f %9.3f %9.2f %7.1f%% %7s %s\n", std::string(k->name()).c_str(),
                      shape, ms, launches, median(h2d), median(d2h), tflops, 100 * frac, to_string(c.verdict),
                      c.reason.c_str());
          std::fflush(stdout);
          csv << k->name() << "," << p.batch << "," << p.q_heads << "," << p.kv_heads << "," << s << "," << s << ","
              << d << "," << p.dim_v() << "," << (a.no_causal ? 0 : 1) << "," << p.flops() << "," << ms << ","
              << launches << "," << median(h2d) << "," << median(d2h) << "," << tflops << "," << info.fp32_peak_tflops
              << "," << frac << "," << to_string(c.verdict) << "\n";
          // Whole after every point: a run stopped by a time limit keeps what it measured.
          if (!a.csv.empty()) write_file_atomic(a.csv, csv.str());
        }
      }
  if (!a.csv.empty()) write_file_atomic(a.csv, csv.str());
  return all_ok ? 0 : 1;
}

}  // namespace

Command add_cuda(CLI::App& app) {
  auto args = std::make_shared<CudaArgs>();
  CLI::App* sub =
      app.add_subcommand("cuda", "the CUDA device (or why none is usable); --time: kernel-only CUDA-event timings");
  sub->add_flag("--time", args->time, "verify and time the CUDA kernels over a grid (needs a device)");
  sub->add_option("--impl", args->impl, "CUDA kernels, comma-separated");
  sub->add_option("--seq", args->seq, "q_len = kv_len values, comma-separated");
  sub->add_option("--head-dim", args->head_dim, "head dims, comma-separated");
  sub->add_option("--head-dim-v", args->head_dim_v, "head dim of V and O at every point (default: each --head-dim)");
  sub->add_option("--gqa", args->gqa, "query heads per kv head, comma-separated (1 = MHA)");
  sub->add_option("--batch", args->batch, "batch");
  sub->add_option("--q-heads", args->q_heads, "query heads");
  sub->add_flag("--no-causal", args->no_causal, "no mask (default: bottom-right causal)");
  sub->add_option("--reps", args->reps, "timed runs per point (median reported), after one warm-up");
  sub->add_option("--launches", args->launches,
                  "back-to-back launches per timed run, between two events (0 = auto: ~20 ms, 1 to 50)");
  sub->add_option("--verify-rows", args->verify_rows, "rows checked against the float64 reference per point");
  sub->add_option("--naive-max-seq", args->naive_max_seq, "skip cuda_naive above this sequence length");
  sub->add_option("--csv", args->csv, "also write the table as CSV here");
  return {sub, [args] {
            if (args->time) return run_timing(*args);
            const Support s = cuda::device_status();
            if (!s) {
              std::printf("CUDA: unavailable: %s\n", s.reason.c_str());
              return 0;
            }
            std::printf("CUDA: %s\n", cuda::device_info()->describe().c_str());
            return 0;
          }};
}

}  // namespace attnlab::cli
