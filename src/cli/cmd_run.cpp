// attnlab run: one kernel on Q, K, V from .npy files; writes O and LSE as .npy. With --backward,
// its backward pass on dO: writes dQ, dK, dV (O and LSE from its own forward, or given).
#include <chrono>
#include <cstdio>
#include <iostream>

#include "attnlab/auto.hpp"
#include "attnlab/backward.hpp"
#include "attnlab/kernel.hpp"
#include "bench/sweep/bench_point.hpp"
#include "io.hpp"

namespace attnlab::cli {

namespace {
struct RunArgs {
  std::string impl, q, k, v, out, lse;
  std::string arithmetic;  // with --impl auto: "native" (default), "f32" or "int8"
  bool backward = false;
  std::string d_o, o_in, dq, dk, dv;
  MaskFlags mask;
  IsaFlag isa;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// (batch, heads, seq, dim) in the problem's layout.
std::vector<int64_t> shape_of(const Problem& p, int64_t heads, int64_t seq, int64_t dim) {
  return p.layout == Layout::BHSD ? std::vector<int64_t>{p.batch, heads, seq, dim}
                                  : std::vector<int64_t>{p.batch, seq, heads, dim};
}

// A float32/float64 file of exactly this shape (named by its option in errors).
NpyArray read_shaped(const std::string& option, const std::string& path, const std::vector<int64_t>& want,
                     const std::string& what) {
  NpyArray a = read_npy(path);
  if (a.is16()) throw InvalidInput(option + ": " + path + " holds 16-bit data; allowed: float32 or float64");
  if (a.shape != want) {
    throw InvalidInput(option + ": " + path + " has shape " + shape_text(a.shape) + "; allowed: " + shape_text(want) +
                       " (" + what + ")");
  }
  return a;
}

void write_outputs(const RunArgs& a, const Problem& p, const Tensors& out) {
  if (!a.out.empty()) write_npy(a.out, out.o.get(), shape_of(p, p.q_heads, p.q_len, p.dim_v()));
  if (!a.lse.empty()) write_npy(a.lse, out.lse.get(), {p.batch, p.q_heads, p.q_len});
}

int run_backward(const RunArgs& a, const Kernel& kernel, const LoadedInputs& li) {
  if (a.d_o.empty() || a.dq.empty() || a.dk.empty() || a.dv.empty()) {
    throw InvalidInput("backward: --do, --dq, --dk and --dv are required; allowed: dO to read, dQ, dK, dV to write");
  }
  if (!a.o_in.empty() && a.lse.empty()) {
    throw InvalidInput(
        "o: --o given without --lse; allowed: both (the forward's O and LSE), or neither (the "
        "kernel's own forward computes them)");
  }
  Problem p = li.problem;
  p.pass = Pass::Backward;
  const std::vector<int64_t> o_shape = shape_of(p, p.q_heads, p.q_len, p.dim_v());
  NpyArray d_o = read_shaped("do", a.d_o, o_shape, "O's shape in the layout of Q");
  Session session(kernel, p, a.mask.thread_count());
  Tensors out = allocate_outputs(p);
  double forward_s = 0;
  if (a.o_in.empty()) {  // the kernel's own forward
    const auto t0 = std::chrono::steady_clock::now();
    session.run(li.inputs, out.outputs);
    forward_s = seconds_since(t0);
    write_outputs(a, p, out);
  } else {
    const NpyArray o = read_shaped("o", a.o_in, o_shape, "O's shape in the layout of Q");
    const NpyArray lse = read_shaped("lse", a.lse, {p.batch, p.q_heads, p.q_len}, "(batch, q_heads, q_len)");
    std::copy(o.data.data(), o.data.data() + o.data.size(), out.o.get());
    std::copy(lse.data.data(), lse.data.data() + lse.data.size(), out.lse.get());
  }
  GradientTensors g = allocate_gradients(p);
  const ConstView dov = make_view<const float>(d_o.data.data(), p.batch, p.q_heads, p.q_len, p.dim_v(), p.layout);
  const auto t0 = std::chrono::steady_clock::now();
  session.run_backward(li.inputs, {dov, as_const(out.outputs.o), out.outputs.lse}, g.grads);
  const double backward_s = seconds_since(t0);
  write_npy(a.dq, g.dq.get(), shape_of(p, p.q_heads, p.q_len, p.head_dim));
  write_npy(a.dk, g.dk.get(), shape_of(p, p.kv_heads, p.kv_len, p.head_dim));
  write_npy(a.dv, g.dv.get(), shape_of(p, p.kv_heads, p.kv_len, p.dim_v()));
  std::printf("%s: %s\n", kernel_label(kernel).c_str(), p.describe().c_str());
  if (a.o_in.empty()) {
    std::printf("forward %.3f ms, %.2f GFLOP/s; ", forward_s * 1e3, p.forward_flops() / forward_s * 1e-9);
  } else {
    std::printf("O and LSE from %s and %s; ", a.o_in.c_str(), a.lse.c_str());
  }
  std::printf("backward %.3f ms, %.2f GFLOP/s (2.5x the forward's FLOPs), %d thread(s), workspace %.1f KiB\n",
              backward_s * 1e3, p.flops() / backward_s * 1e-9, session.threads(), session.workspace_bytes() / 1024.0);
  return 0;
}
}  // namespace

Command add_run(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* sub = app.add_subcommand(
      "run", "run one kernel on .npy inputs, write O (and LSE) as .npy; with --backward its gradients from dO");
  sub->add_option("--impl", args->impl,
                  "kernel name, or auto: the fastest kernel that runs the problem here (attnlab list prints its "
                  "table; the line 'auto: KERNEL (rule)' says which ran)")
      ->required();
  sub->add_option("--arithmetic", args->arithmetic,
                  "with --impl auto: native (the default: bf16 products for bf16 inputs, else float32), f32 "
                  "(float32 products always) or int8 (int8 products allowed for float32 inputs: flash_int8)");
  sub->add_option("--q", args->q, "Q .npy (float32/float64, C order)")->required();
  sub->add_option("--k", args->k, "K .npy")->required();
  sub->add_option("--v", args->v, "V .npy")->required();
  sub->add_option("--out", args->out, "O .npy to write (float32, Q's shape; required without --backward)");
  sub->add_option("--lse", args->lse,
                  "LSE .npy to write (float32, (batch, q_heads, q_len)); with --backward and --o: the forward's LSE "
                  "to read");
  sub->add_flag("--backward", args->backward,
                "the kernel's backward pass: dQ, dK, dV from --do, and O and LSE from its own forward (written to "
                "--out / --lse when given) unless --o and --lse give them");
  sub->add_option("--do", args->d_o, "with --backward: dO .npy to read (float32/float64, O's shape)");
  sub->add_option("--o", args->o_in,
                  "with --backward: the forward's O .npy to read (with --lse), instead of the "
                  "kernel's own forward");
  sub->add_option("--dq", args->dq, "with --backward: dQ .npy to write (float32, Q's shape)");
  sub->add_option("--dk", args->dk, "with --backward: dK .npy to write (float32, K's shape)");
  sub->add_option("--dv", args->dv, "with --backward: dV .npy to write (float32, V's shape)");
  args->mask.add_to(*sub);
  args->isa.add_to(*sub, false);
  return {sub, [args] {
            args->isa.apply();
            const bool is_auto = args->impl == kAutoKernel;
            if (!is_auto) kernel_or_throw(args->impl);  // a bad name fails before any file is read
            if (!is_auto && !args->arithmetic.empty()) {
              throw InvalidInput("arithmetic: given with --impl " + args->impl + "; allowed: with --impl auto only");
            }
            const AutoArithmetic arithmetic =
                parse_auto_arithmetic(args->arithmetic.empty() ? "native" : args->arithmetic);
            if (!args->backward) {
              for (const auto& [name, value] : {std::pair{"do", &args->d_o},
                                                {"o", &args->o_in},
                                                {"dq", &args->dq},
                                                {"dk", &args->dk},
                                                {"dv", &args->dv}}) {
                if (!value->empty()) {
                  throw InvalidInput(std::string(name) + ": given without --backward; allowed: --" + name +
                                     " with --backward");
                }
              }
              if (args->out.empty()) throw InvalidInput("out: required; allowed: the O .npy to write");
            }
            LoadedInputs li = load_inputs(args->q, args->k, args->v, args->mask);
            warn_nonfinite(li);
            Problem asked = li.problem;
            if (args->backward) asked.pass = Pass::Backward;
            const AutoChoice choice = resolve_kernel(args->impl, "", asked, args->mask.thread_count(), arithmetic);
            if (is_auto) std::printf("auto: %s\n", choice.describe().c_str());
            const Kernel& kernel = *choice.kernel;
            if (args->backward) return run_backward(*args, kernel, li);
            const Problem& p = li.problem;
            Session session(kernel, p, args->mask.thread_count());
            Tensors out = allocate_outputs(p);
            const auto t0 = std::chrono::steady_clock::now();
            session.run(li.inputs, out.outputs);
            const double secs = seconds_since(t0);
            write_outputs(*args, p, out);
            std::printf("%s: %s\n", kernel_label(kernel).c_str(), p.describe().c_str());
            std::printf("time %.3f ms, %.2f GFLOP/s, %d thread(s), workspace %.1f KiB\n", secs * 1e3,
                        p.flops() / secs * 1e-9, session.threads(), session.workspace_bytes() / 1024.0);
            return 0;
          }};
}

}  // namespace attnlab::cli
