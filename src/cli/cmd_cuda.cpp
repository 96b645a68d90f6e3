// attnlab cuda: the CUDA device (or why there is none) and, with --time, kernel-only timings
// of the CUDA kernels from CUDA events (cuda::last_timing), with the copies reported apart.
// TFLOP/s = Problem::flops() / kernel time; "% fp32" is against the device's FP32 (non-tensor)
// peak, sm_count * FP32 lanes * 2 * clock, "% bf16 tc" against its dense bf16 tensor-core peak;
// GB/s = Problem::bytes_moved() / kernel time, "% read" against the device memory's read
// bandwidth measured at the start (cuda::measure_bandwidth; also --bandwidth alone): the unit
// decode is bound by. Each point is verified first on sampled rows. The
// kernel time is the mean of back-to-back launches between two events (cuda::time_launches): no
// host launch gap, no per-launch set-up; the median over --reps such runs is reported.
// The grid is the point schema's (the sweep's axis flags: --q-len, --head-dim, --gqa-groups,
// --causal=false, --window, --dtype, ... each a list), and the CSV's point columns are the
// schema's fields, as results.csv writes them.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>

#include "attnlab/cuda.hpp"
#include "attnlab/kernel.hpp"
#include "attnlab/npy.hpp"
#include "attnlab/verify.hpp"
#include "bench/sweep/experiment.hpp"
#include "common.hpp"
#include "peaks/stats.hpp"

namespace attnlab::cli {

namespace {

struct CudaArgs {
  bool time = false;
  bool bandwidth = false;
  std::string impl = "cuda_flash,cuda_naive";
  AxisFlags axes;  // the schema's size, mask and setting axes, each replacing its default below
  int reps = 5;
  int launches = 0;  // back-to-back launches per timed run; 0 = enough for ~20 ms (1 to 50)
  int verify_rows = 64;
  int64_t naive_max_seq = 4096;
  std::string csv;
};

// The default grid (prefill, q_len = kv_len, causal), as experiment keys.
nlohmann::json default_grid() {
  return {{"batch", 2},
          {"q_heads", 16},
          {"gqa_groups", {1, 4}},
          {"q_len", {512, 1024, 2048, 4096, 8192}},
          {"head_dim", {64, 128}},
          {"causal", true},
          {"threads", 1}};
}

using peaks::median;  // src/peaks/stats.hpp: the one median the lab reports

int run_timing(const CudaArgs& a) {
  if (a.reps < 1) throw InvalidInput("reps: " + std::to_string(a.reps) + " is not allowed; allowed: >= 1");
  if (a.launches < 0) {
    throw InvalidInput("launches: " + std::to_string(a.launches) + " is not allowed; allowed: >= 1, or 0 (auto)");
  }
  std::vector<std::string> cuda_kernels;
  for (const Kernel* k : registry()) {
    if (cuda::is_cuda_kernel(*k)) cuda_kernels.emplace_back(k->name());
  }
  nlohmann::json doc = default_grid();
  doc["description"] = "attnlab cuda --time";
  doc["implementations"] = CLI::detail::split(a.impl, ',');
  bench::override_keys(doc, a.axes.as_experiment_keys());
  const bench::Experiment e = bench::parse_experiment(doc, "cuda --time", cuda_kernels);
  const std::vector<bench::GridPoint> grid = bench::expand(e, 1);  // bad flags are errors before the device's
  const Support status = cuda::device_status();
  if (!status) throw InvalidInput("cuda --time: needs a CUDA device; " + status.reason);
  const cuda::DeviceInfo info = *cuda::device_info();
  std::printf("device: %s\n", info.describe().c_str());
  const cuda::Bandwidth bw = cuda::measure_bandwidth();
  std::printf("memory: read %.0f GB/s, copy %.0f GB/s (measured, best of 5 over %.0f MiB)\n", bw.read_gbs, bw.copy_gbs,
              bw.bytes / (1024.0 * 1024.0));
  std::printf("%-58s %10s %8s %9s %9s %9s %7s %7s %8s %6s %7s %s\n", "point", "kernel_ms", "launches", "h2d_ms",
              "d2h_ms", "TFLOP/s", "%fp32", "%bf16tc", "GB/s", "%read", "verify", "");
  std::ostringstream csv;
  csv << "kernel";
  for (const schema::PointField& f : schema::point_fields()) csv << ',' << f.name;
  csv << ",flops,kernel_ms,launches,h2d_ms,d2h_ms,tflops,fp32_peak_tflops,fp32_fraction,bf16_tensor_peak_tflops,"
         "tensor_fraction,bytes,gbytes_per_s,read_gbs,read_fraction,verified\n";
  bool all_ok = true;
  for (const bench::GridPoint& g : grid) {
    const Problem& p = g.problem;
    const Kernel& k = kernel_or_throw(g.kernel);
    if (&k == &cuda::naive() && p.q_len > a.naive_max_seq) continue;
    Tensors t = random_tensors(p, 1);
    const Agreement ag = prepare_agreement(p, t.inputs, sample_rows(p, static_cast<size_t>(a.verify_rows), 3));
    const KernelCheck c = check_kernel(k, p, t.inputs, ag, 1);
    all_ok &= c.verdict != Verdict::Fail;
    Session session(k, p, 1);
    session.run(t.inputs, t.outputs);  // warm-up (buffers, module load)
    const double first_ms = std::max(cuda::last_timing()->kernel_ms, 1e-3);
    const int launches = a.launches > 0 ? a.launches : std::clamp(static_cast<int>(std::ceil(20.0 / first_ms)), 1, 50);
    std::vector<double> kms, h2d, d2h;
    for (int r = 0; r < a.reps; ++r) {
      const cuda::Timing tm = cuda::time_launches(session, t.inputs, t.outputs, launches);
      kms.push_back(tm.kernel_ms), h2d.push_back(tm.h2d_ms), d2h.push_back(tm.d2h_ms);
    }
    const double ms = median(kms);
    const double tflops = p.flops() / (ms * 1e-3) * 1e-12;
    const double frac = info.fp32_peak_tflops > 0 ? tflops / info.fp32_peak_tflops : 0;
    const double tc = info.bf16_tensor_peak_tflops > 0 ? tflops / info.bf16_tensor_peak_tflops : 0;
    const double gbs = p.bytes_moved() / (ms * 1e-3) * 1e-9, read = bw.read_gbs > 0 ? gbs / bw.read_gbs : 0;
    const schema::PointView view{g.kernel, p, g.threads, "", ""};
    std::printf("%-58s %10.3f %8d %9.3f %9.3f %9.2f %6.1f%% %6.1f%% %8.0f %5.0f%% %7s %s\n",
                schema::describe_point(view, g.kernel).c_str(), ms, launches, median(h2d), median(d2h), tflops,
                100 * frac, 100 * tc, gbs, 100 * read, to_string(c.verdict), c.reason.c_str());
    std::fflush(stdout);
    csv << g.kernel;
    for (const schema::PointField& f : schema::point_fields()) csv << ',' << f.value(view);
    for (const double x :
         {p.flops(), ms, static_cast<double>(launches), median(h2d), median(d2h), tflops, info.fp32_peak_tflops, frac,
          info.bf16_tensor_peak_tflops, tc, p.bytes_moved(), gbs, bw.read_gbs, read})
      csv << ',' << schema::csv_number(x);
    csv << ',' << to_string(c.verdict) << "\n";
    // Whole after every point: a run stopped by a time limit keeps what it measured.
    if (!a.csv.empty()) write_file_atomic(a.csv, csv.str());
  }
  if (!a.csv.empty()) write_file_atomic(a.csv, csv.str());
  return all_ok ? 0 : 1;
}

}  // namespace

Command add_cuda(CLI::App& app) {
  auto args = std::make_shared<CudaArgs>();
  CLI::App* sub =
      app.add_subcommand("cuda", "the CUDA device (or why none is usable); --time: kernel-only CUDA-event timings");
  sub->add_flag("--time", args->time,
                "verify and time the CUDA kernels over a grid (needs a device); the grid's flags are the sweep's "
                "axes, lists allowed (default: --batch 2 --q-heads 16 --gqa-groups 1,4 --q-len "
                "512,1024,2048,4096,8192 --head-dim 64,128 --causal)");
  sub->add_flag("--bandwidth", args->bandwidth,
                "measure the device memory's read and copy bandwidth (needs a device; --time does it too)");
  sub->add_option("--impl", args->impl, "CUDA kernels, comma-separated");
  args->axes.add_to(
      *sub, {schema::AxisKind::Size, schema::AxisKind::Mask, schema::AxisKind::Score, schema::AxisKind::Setting});
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
            if (args->bandwidth) {
              const cuda::Bandwidth bw = cuda::measure_bandwidth();
              std::printf("memory: read %.0f GB/s, copy %.0f GB/s (measured, best of 5 over %.0f MiB)\n", bw.read_gbs,
                          bw.copy_gbs, bw.bytes / (1024.0 * 1024.0));
            }
            return 0;
          }};
}

}  // namespace attnlab::cli
