// attnlab run: one kernel on Q, K, V from .npy files; writes O and LSE as .npy.
#include <chrono>
#include <cstdio>
#include <iostream>

#include "attnlab/kernel.hpp"
#include "bench/bench_point.hpp"
#include "io.hpp"

namespace attnlab::cli {

namespace {
struct RunArgs {
  std::string impl, q, k, v, out, lse;
  MaskFlags mask;
  IsaFlag isa;
};
}  // namespace

Command add_run(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* sub = app.add_subcommand("run", "run one kernel on .npy inputs, write O (and LSE) as .npy");
  sub->add_option("--impl", args->impl, "kernel name (see attnlab list)")->required();
  sub->add_option("--q", args->q, "Q .npy (float32/float64, C order)")->required();
  sub->add_option("--k", args->k, "K .npy")->required();
  sub->add_option("--v", args->v, "V .npy")->required();
  sub->add_option("--out", args->out, "O .npy to write (float32, Q's shape)")->required();
  sub->add_option("--lse", args->lse, "LSE .npy to write (float32, (batch, q_heads, q_len))");
  args->mask.add_to(*sub);
  args->isa.add_to(*sub, false);
  return {sub, [args] {
            args->isa.apply();
            const Kernel& kernel = kernel_or_throw(args->impl);
            LoadedInputs li = load_inputs(args->q, args->k, args->v, args->mask);
            const Problem& p = li.problem;
            warn_nonfinite(li);
            Session session(kernel, p, args->mask.thread_count());
            Tensors out = allocate_outputs(p);
            const auto t0 = std::chrono::steady_clock::now();
            session.run(li.inputs, out.outputs);
            const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            const bool bhsd = p.layout == Layout::BHSD;
            write_npy(args->out, out.o.get(),
                      bhsd ? std::vector<int64_t>{p.batch, p.q_heads, p.q_len, p.dim_v()}
                           : std::vector<int64_t>{p.batch, p.q_len, p.q_heads, p.dim_v()});
            if (!args->lse.empty()) write_npy(args->lse, out.lse.get(), {p.batch, p.q_heads, p.q_len});
            std::printf("%s: %s\n", bench::kernel_label(kernel).c_str(), p.describe().c_str());
            std::printf("time %.3f ms, %.2f GFLOP/s, %d thread(s), workspace %.1f KiB\n", secs * 1e3,
                        p.flops() / secs * 1e-9, session.threads(), session.workspace_bytes() / 1024.0);
            return 0;
          }};
}

}  // namespace attnlab::cli
