// attnlab verify: kernels against the float64 reference (random inputs over one shape or a
// default set), or against outputs produced elsewhere (--expect, e.g. numpy / PyTorch);
// --backward: the backward pass's gradients against the float64 reference gradients.
// Verifying nothing is not agreement: a kernel named in --impl that runs on no shape
// (unavailable, or unsupported for every shape) makes the exit code 3, with the reason.
// Rows name the variant that ran: flash[avx2] for a kernel built per target, naive for one
// built once. --isa NAME runs the SIMD kernels' NAME variant; --isa all (or a list, e.g.
// scalar,avx2) runs every SIMD kernel once per listed target.
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "attnlab/auto.hpp"
#include "attnlab/kernel.hpp"
#include "attnlab/kv_summary.hpp"
#include "attnlab/verify.hpp"
#include "bench/sweep/bench_point.hpp"
#include "io.hpp"

namespace attnlab::cli {

namespace {

struct VerifyArgs {
  std::string impl = "all";
  std::string q, k, v, expect, expect_lse;
  MaskFlags mask;
  ShapeFlags shape;
  IsaFlag isa;
  std::vector<std::string> isas;  // isa.apply(), before anything runs
  int64_t sample_rows = 0;        // rows held to the reference; 0 = every row
  bool backward = false;          // the backward pass's gradients instead of O and LSE
  std::vector<RowId> rows(const Problem& p) const {
    return sample_rows > 0 ? attnlab::sample_rows(p, static_cast<size_t>(sample_rows), 7) : all_rows(p);
  }
};

// The kernels of --impl, each SIMD one once per target in `isas` (none: its default variant).
// "auto" is a nullptr slot: Tally::bind puts the kernel auto chooses for each shape there.
std::vector<const Kernel*> selected(const std::string& impl, const std::vector<std::string>& isas) {
  std::vector<const Kernel*> named;
  if (impl == "all") {
    named = registry();
  } else {
    for (const auto& name : CLI::detail::split(impl, ',')) {
      if (name != kAutoKernel) {
        named.push_back(&kernel_or_throw(name));
      } else if (!isas.empty()) {
        throw InvalidInput("isa: given with --impl auto; allowed: auto runs each kernel's default target");
      } else {
        named.push_back(nullptr);
      }
    }
  }
  std::vector<const Kernel*> out;
  auto add = [&](const Kernel* k) {
    if (k == nullptr || std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
  };
  for (const Kernel* k : named) {
    if (k == nullptr) {
      add(k);
      continue;
    }
    if (isas.empty() || !is_per_target_isa(k->isa())) {
      add(k);
      continue;
    }
    for (const std::string& isa : isas) add(&kernel_or_throw(k->name(), isa));
  }
  return out;
}

// The shapes `verify` checks when no shape is given: MHA, GQA, MQA decode, windows with
// per-batch kv lengths (including 0), q_len > kv_len (fully masked rows), top-left causal,
// both layouts, head dims that are and are not multiples of the vector width, d_v != d_qk.
std::vector<Problem> default_shapes() {
  auto make = [](int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d) {
    Problem p;
    p.batch = b, p.q_heads = hq, p.kv_heads = hkv, p.q_len = sq, p.kv_len = sk, p.head_dim = d;
    return p;
  };
  std::vector<Problem> v;
  v.push_back(make(1, 8, 8, 128, 128, 64));
  v.push_back(make(2, 8, 2, 65, 127, 80));
  v.back().causal = CausalAlign::BottomRight;
  v.push_back(make(1, 4, 1, 1, 300, 128));
  v.back().causal = CausalAlign::BottomRight;
  v.push_back(make(3, 6, 2, 17, 64, 96));
  v.back().window_left = 8, v.back().window_right = 0, v.back().kv_lens = {0, 64, 33};
  v.back().layout = Layout::BSHD;
  v.push_back(make(1, 8, 2, 300, 17, 32));
  v.back().causal = CausalAlign::BottomRight;
  v.push_back(make(1, 8, 8, 256, 256, 256));
  v.back().causal = CausalAlign::TopLeft;
  v.push_back(make(1, 4, 4, 40, 70, 192));  // MLA's prefill head: d_qk 192, d_v 128
  v.back().head_dim_v = 128, v.back().causal = CausalAlign::BottomRight;
  return v;
}

void print_header(const Problem& p, const Errors& baseline, const Tolerance& tol) {
  std::printf("\n%s\n", p.describe().c_str());
  std::printf("  baseline (textbook float32 vs float64): O %.3g, LSE %.3g -> tolerance O %.3g, LSE %.3g\n",
              baseline.o_rel, baseline.lse, tol.o_rel, tol.lse);
}

void print_columns() {
  std::printf("  %-18s %12s %12s %12s  %s\n", "kernel", "O max abs", "O rel", "LSE rel", "status");
}

void print_check(const KernelCheck& c) {
  if (c.verdict == Verdict::Skip) {
    std::printf("  %-18s %12s %12s %12s  SKIP (%s)\n", c.kernel.c_str(), "-", "-", "-", c.reason.c_str());
    return;
  }
  std::printf("  %-18s %12.3g %12.3g %12.3g  %s%s%s\n", c.kernel.c_str(), c.errors.o_abs, c.errors.o_rel, c.errors.lse,
              to_string(c.verdict), c.reason.empty() ? "" : ": ", c.reason.c_str());
}

// Per selected kernel over all shapes: whether it ran (passed or failed) on at least one,
// whether it failed, and the distinct reasons it was skipped.
class Tally {
 public:
  Tally(std::vector<const Kernel*> kernels, bool named) : kernels_(std::move(kernels)), named_(named) {
    seen_.resize(kernels_.size());
    for (const Kernel* k : kernels_) auto_.push_back(k == nullptr);
  }
  // The kernels for shape p: an auto slot gets choose_kernel's (or, when no kernel runs p, flash,
  // whose check then says why it is skipped).
  void bind(const Problem& p, int threads, bool backward) {
    for (size_t i = 0; i < kernels_.size(); ++i) {
      if (!auto_[i]) continue;
      Problem asked = p;
      if (backward) asked.pass = Pass::Backward;
      try {
        const AutoChoice c = choose_kernel(asked, threads);
        kernels_[i] = c.kernel, rule_[i] = c.describe();
      } catch (const InvalidInput& e) {
        kernels_[i] = &kernel_or_throw("flash"), rule_[i] = e.what();
      }
    }
  }
  const std::vector<const Kernel*>& kernels() const { return kernels_; }
  // A backward check: printed with its gradients' errors, recorded as a forward check is.
  void add(size_t i, const BackwardCheck& b) {
    const std::string name = label(i);
    if (b.verdict == Verdict::Skip) {
      std::printf("  %-18s %12s %12s %12s  SKIP (%s)\n", name.c_str(), "-", "-", "-", b.reason.c_str());
    } else {
      std::printf("  %-18s %12.3g %12.3g %12.3g  %s%s%s\n", name.c_str(), b.errors.dq, b.errors.dk, b.errors.dv,
                  to_string(b.verdict), b.reason.empty() ? "" : ": ", b.reason.c_str());
    }
    if (auto_[i]) std::printf("  %-18s %s\n", "", rule_[i].c_str());
    record(i, b.verdict, b.reason);
  }
  // Prints the check (labelled with the variant) and records it for kernels()[i].
  void add(size_t i, const KernelCheck& check) {
    KernelCheck c = check;
    c.kernel = label(i);
    print_check(c);
    if (auto_[i]) std::printf("  %-18s %s\n", "", rule_[i].c_str());
    if (const Arithmetic ar = kernels_[i]->arithmetic(); ar != Arithmetic::F32 && c.verdict != Verdict::Skip) {
      std::printf("  %-18s held to the textbook's error in its own arithmetic (%s): tolerance O %.3g, LSE %.3g\n", "",
                  to_string(ar), c.tol.o_rel, c.tol.lse);
    }
    record(i, c.verdict, c.reason);
  }
  void record(size_t i, Verdict verdict, const std::string& reason) {
    Seen& s = seen_[i];
    if (verdict == Verdict::Skip) {
      if (std::find(s.skips.begin(), s.skips.end(), reason) == s.skips.end()) s.skips.push_back(reason);
    } else {
      s.ran = true;
      s.failed |= verdict == Verdict::Fail;
    }
  }
  // `external_ok`: whether the expected file itself agrees (always true for random inputs).
  // 1 when something disagrees, else 3 when a named kernel (or, for all, every kernel) ran
  // on no shape, else 0.
  int finish(bool external_ok, const char* agree, const char* disagree) const {
    size_t ran = 0;
    bool failed = !external_ok;
    std::string not_run;
    for (size_t i = 0; i < kernels_.size(); ++i) {
      const Seen& s = seen_[i];
      ran += s.ran;
      failed |= s.failed;
      if (s.ran) continue;
      std::string why;
      for (const std::string& r : s.skips) why += (why.empty() ? "" : "; ") + r;
      not_run += (not_run.empty() ? "" : ", ") + (auto_[i] ? std::string(kAutoKernel) : kernel_label(*kernels_[i])) +
                 " (" + why + ")";
    }
    std::printf("\nverified %zu of %zu kernels%s%s\n", ran, kernels_.size(),
                not_run.empty() ? "" : "; not run: ", not_run.c_str());
    if (failed) {
      std::printf("%s\n", disagree);
      return 1;
    }
    if (ran == 0 || (named_ && ran < kernels_.size())) {
      std::printf("NOT VERIFIED: %s could not run on any shape\n", named_ ? "a named kernel" : "no kernel");
      std::cerr << "error: not verified: " << not_run << "\n";
      return 3;
    }
    std::printf("%s\n", agree);
    return 0;
  }

 private:
  struct Seen {
    bool ran = false, failed = false;
    std::vector<std::string> skips;
  };
  // The column's name: the variant, or for an auto slot "auto>" and the one it chose.
  std::string label(size_t i) const { return (auto_[i] ? "auto>" : "") + kernel_label(*kernels_[i]); }
  std::vector<const Kernel*> kernels_;
  std::vector<bool> auto_;
  std::vector<std::string> rule_ = std::vector<std::string>(kernels_.size());
  bool named_;
  std::vector<Seen> seen_;
};

Tally make_tally(const VerifyArgs& a) { return Tally(selected(a.impl, a.isas), a.impl != "all"); }

int verify_random(const std::vector<Problem>& problems, const VerifyArgs& a) {
  Tally tally = make_tally(a);
  for (const Problem& p : problems) {
    p.validate();
    tally.bind(p, a.mask.thread_count(), false);
    // When no selected kernel can run here (e.g. over the memory budget), say so before
    // paying for inputs and a float64 reference over every row.
    std::vector<KernelCheck> refused;
    for (const Kernel* k : tally.kernels()) {
      if (Support s = can_run(*k, p, a.mask.thread_count()); !s) {
        refused.push_back({std::string(k->name()), Verdict::Skip, {}, {}, s.reason});
      }
    }
    if (refused.size() == tally.kernels().size()) {
      std::printf("\n%s\n", p.describe().c_str());
      print_columns();
      for (size_t i = 0; i < refused.size(); ++i) tally.add(i, refused[i]);
      continue;
    }
    Tensors t = random_tensors(p, a.shape.seed);
    if (p.topk()) {  // an approximation: its class, then its exact part
      std::printf(
          "\n%s\n  query-aware sparse decode: approximate; the errors are against the float64 reference of "
          "the problem masked to the pages each kernel chose\n",
          p.describe().c_str());
      print_columns();
      for (size_t i = 0; i < tally.kernels().size(); ++i) {
        const TopkCheck c = check_topk(*tally.kernels()[i], p, t.inputs, a.rows(p), a.mask.thread_count());
        tally.add(i, c.exact);
        if (c.exact.verdict != Verdict::Skip) {
          std::printf("  %-18s approximate: recall %.4g (mean %.4g), error %.3g (O against dense float64)\n", "",
                      c.recall_min, c.recall_mean, c.err_dense);
        }
      }
      continue;
    }
    const Agreement ag = prepare_agreement(p, t.inputs, a.rows(p));
    print_header(p, ag.baseline, ag.tol);
    print_columns();
    for (size_t i = 0; i < tally.kernels().size(); ++i) {
      tally.add(i, check_kernel(*tally.kernels()[i], p, t.inputs, ag, a.mask.thread_count()));
    }
  }
  return tally.finish(true, "all kernels that ran agree with the float64 reference",
                      "FAILED: some kernel disagrees with the float64 reference");
}

// The backward pass on random inputs and a random dO: every element's gradient against the
// float64 reference, the tolerance from the textbook float32 backward's error (backward.hpp).
int verify_backward(const std::vector<Problem>& problems, const VerifyArgs& a) {
  Tally tally = make_tally(a);
  for (const Problem& p : problems) {
    p.validate();
    check_backward_problem(p);
    tally.bind(p, a.mask.thread_count(), true);
    Tensors t = random_tensors(p, a.shape.seed);
    const auto d_o = bench::random_d_o(p, a.shape.seed);  // a sweep's backward points use the same
    const ConstView dov = make_view<const float>(d_o.get(), p.batch, p.q_heads, p.q_len, p.dim_v(), p.layout);
    const BackwardAgreement ag = prepare_backward_agreement(p, t.inputs, dov);
    std::printf("\n%s, backward (dO uniform [-1, 1))\n", p.describe().c_str());
    std::printf("  baseline (textbook float32 vs float64): dQ %.3g, dK %.3g, dV %.3g -> tolerance %.3g, %.3g, %.3g\n",
                ag.baseline.dq, ag.baseline.dk, ag.baseline.dv, ag.tol.dq, ag.tol.dk, ag.tol.dv);
    std::printf("  %-18s %12s %12s %12s  %s\n", "kernel", "dQ rel", "dK rel", "dV rel", "status");
    for (size_t i = 0; i < tally.kernels().size(); ++i) {
      tally.add(i, check_backward(*tally.kernels()[i], p, t.inputs, dov, ag, a.mask.thread_count()));
    }
  }
  return tally.finish(true, "all kernels that ran agree with the float64 reference gradients",
                      "FAILED: some kernel's gradients disagree with the float64 reference");
}

int verify_expect(const VerifyArgs& a) {
  LoadedInputs li = load_inputs(a.q, a.k, a.v, a.mask);
  const Problem& p = li.problem;
  NpyArray expect = read_npy(a.expect);
  widen_to_float(expect);  // e.g. PyTorch's float16 output
  std::vector<int64_t> o_shape = li.q.shape;
  o_shape.back() = p.dim_v();
  if (expect.shape != o_shape) {
    throw InvalidInput(a.expect + ": shape differs from Q's shape with V's last dimension; allowed: O has that shape");
  }
  NpyArray expect_lse;
  if (!a.expect_lse.empty()) {
    expect_lse = read_npy(a.expect_lse);
    widen_to_float(expect_lse);
    if (expect_lse.shape != std::vector<int64_t>{p.batch, p.q_heads, p.q_len}) {
      throw InvalidInput(a.expect_lse + ": shape must be (batch, q_heads, q_len) = (" + std::to_string(p.batch) + ", " +
                         std::to_string(p.q_heads) + ", " + std::to_string(p.q_len) + ")");
    }
  }
  const Agreement ag = prepare_agreement(p, li.inputs, a.rows(p));
  const MutView ev = make_view<float>(expect.data.data(), p.batch, p.q_heads, p.q_len, p.dim_v(), p.layout);
  const Errors external = measure(ag.ref, as_const(ev), expect_lse.data.empty() ? nullptr : expect_lse.data.data(), p);
  print_header(p, ag.baseline, ag.tol);
  std::printf("  expected file vs float64 reference: O %.3g, LSE %.3g -> %s\n", external.o_rel, external.lse,
              ag.tol.passes(external) ? "agrees" : "DISAGREES (different semantics or precision?)");
  print_columns();
  // Kernels are compared with the expected outputs, allowing the file's own error.
  Agreement vs_file = ag;
  for (size_t r = 0; r < vs_file.ref.rows.size(); ++r) {
    const RowId& id = vs_file.ref.rows[r];
    const float* row = ev.row(id.b, id.h, id.i);
    for (int64_t d = 0; d < p.dim_v(); ++d) vs_file.ref.o[r * p.dim_v() + d] = row[d];
    if (!expect_lse.data.empty()) vs_file.ref.lse[r] = expect_lse.data[(id.b * p.q_heads + id.h) * p.q_len + id.i];
  }
  vs_file.tol = ag.tol.widened_by(external);
  vs_file.widen = external;
  Tally tally = make_tally(a);
  tally.bind(p, a.mask.thread_count(), false);
  for (size_t i = 0; i < tally.kernels().size(); ++i) {
    KernelCheck c = check_kernel(*tally.kernels()[i], p, li.inputs, vs_file, a.mask.thread_count());
    if (expect_lse.data.empty()) c.errors.lse = 0;  // LSE is compared only when given
    tally.add(i, c);
  }
  return tally.finish(ag.tol.passes(external), "all kernels that ran agree with the expected outputs",
                      "FAILED: disagreement with the expected outputs");
}

}  // namespace

Command add_verify(CLI::App& app) {
  auto args = std::make_shared<VerifyArgs>();
  CLI::App* sub = app.add_subcommand("verify", "check kernels against the float64 reference or expected .npy outputs");
  sub->footer(
      "Exit codes: 0 every kernel that ran agrees, 1 a kernel (or the --expect file) disagrees, 2 bad "
      "input, 3 not verified: a kernel named in --impl ran on no shape (unavailable, e.g. no CUDA device, "
      "or unsupported for every shape; the reason is printed), with --impl all no kernel ran, or another "
      "error. --impl all skips what cannot run, with the reason, and ends with \"verified N of M kernels\". "
      "Rows name the target a SIMD kernel ran (flash[avx2]); --isa all (or a list) verifies each SIMD kernel "
      "once per target, as separate kernels in that count.");
  sub->add_option("--impl", args->impl, "kernel name(s), comma separated, or all (default)");
  sub->add_option("--q", args->q, "Q .npy (with --k, --v, --expect)");
  sub->add_option("--k", args->k, "K .npy");
  sub->add_option("--v", args->v, "V .npy");
  sub->add_option("--expect", args->expect, "expected O .npy, made elsewhere");
  sub->add_option("--expect-lse", args->expect_lse, "expected LSE .npy (batch, q_heads, q_len)");
  sub->add_option("--sample-rows", args->sample_rows,
                  "check this many sampled query rows (all heads and batches) against the float64 reference "
                  "instead of every row: large shapes, whose reference over every row takes minutes (0 = every row)")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--backward", args->backward,
                "the backward pass: each kernel's dQ, dK, dV (after its own forward) against the float64 "
                "reference gradients, random inputs and dO; kernels without a backward pass are skipped");
  args->mask.add_to(*sub);
  args->shape.add_to(*sub);
  args->isa.add_to(*sub, true);
  return {sub, [args, sub] {
            args->isas = args->isa.apply();
            const VerifyArgs& a = *args;
            const bool files = !a.q.empty() || !a.k.empty() || !a.v.empty() || !a.expect.empty();
            if (files && a.backward) {
              throw InvalidInput("verify: --backward with --q/--k/--v/--expect; allowed: --backward on random inputs");
            }
            const auto run = [&](const std::vector<Problem>& ps) {
              return a.backward ? verify_backward(ps, a) : verify_random(ps, a);
            };
            if (files) {
              if (a.q.empty() || a.k.empty() || a.v.empty() || a.expect.empty()) {
                throw InvalidInput(
                    "verify: --q, --k, --v and --expect go together; allowed: all four, or none (random inputs)");
              }
              return verify_expect(a);
            }
            // Any flag but the settings (--dtype, ...) names one shape; the settings alone apply to
            // every default shape.
            // (A pattern flag alone once ran the default shapes without its pattern: every mask axis counts.)
            const bool mask_given = a.mask.masks.any_given() || sub->count("--scale") + sub->count("--layout") > 0;
            if (!a.shape.any_given() && !mask_given) {
              std::vector<Problem> shapes = default_shapes();
              for (Problem& p : shapes) a.mask.settings.apply(p);
              return run(shapes);
            }
            Problem p;
            a.shape.apply(p);
            a.mask.apply(p);
            return run({p});
          }};
}

}  // namespace attnlab::cli
