// attnlab verify: kernels against the float64 reference (random inputs over one shape or a
// default set), or against outputs produced elsewhere (--expect, e.g. numpy / PyTorch).
#include <cstdio>
#include <iostream>

#include "attnlab/kernel.hpp"
#include "attnlab/verify.hpp"
#include "io.hpp"

namespace attnlab::cli {

namespace {

struct VerifyArgs {
  std::string impl = "all";
  std::string q, k, v, expect, expect_lse;
  MaskFlags mask;
  ShapeFlags shape;
};

std::vector<const Kernel*> selected(const std::string& impl) {
  if (impl == "all") return registry();
  std::vector<const Kernel*> out;
  for (const auto& name : CLI::detail::split(impl, ',')) out.push_back(&kernel_or_throw(name));
  return out;
}

// The shapes `verify` checks when no shape is given: MHA, GQA, MQA decode, windows with
// per-batch kv lengths (including 0), q_len > kv_len (fully masked rows), top-left causal,
// both layouts, head dims that are and are not multiples of the vector width.
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
  return v;
}

void print_header(const Problem& p, const Errors& baseline, const Tolerance& tol) {
  std::printf("\n%s\n", p.describe().c_str());
  std::printf("  baseline (textbook float32 vs float64): O %.3g, LSE %.3g -> tolerance O %.3g, LSE %.3g\n",
              baseline.o_rel, baseline.lse, tol.o_rel, tol.lse);
}

void print_columns() {
  std::printf("  %-12s %12s %12s %12s  %s\n", "kernel", "O max abs", "O rel", "LSE rel", "status");
}

bool print_check(const KernelCheck& c) {
  if (c.verdict == Verdict::Skip) {
    std::printf("  %-12s %12s %12s %12s  SKIP (%s)\n", c.kernel.c_str(), "-", "-", "-", c.reason.c_str());
    return true;
  }
  std::printf("  %-12s %12.3g %12.3g %12.3g  %s%s%s\n", c.kernel.c_str(), c.errors.o_abs,
              c.errors.o_rel, c.errors.lse, to_string(c.verdict),
              c.reason.empty() ? "" : ": ", c.reason.c_str());
  return c.verdict != Verdict::Fail;
}

int verify_random(const std::vector<Problem>& problems, const VerifyArgs& a) {
  bool ok = true;
  for (const Problem& p : problems) {
    p.validate();
    Tensors t = random_tensors(p, a.shape.seed);
    const Agreement ag = prepare_agreement(p, t.inputs, all_rows(p));
    print_header(p, ag.baseline, ag.tol);
    print_columns();
    for (const Kernel* k : selected(a.impl)) {
      ok &= print_check(check_kernel(*k, p, t.inputs, ag, a.mask.thread_count()));
    }
  }
  std::printf("\n%s\n", ok ? "all selected kernels agree with the float64 reference"
                            : "FAILED: some kernel disagrees with the float64 reference");
  return ok ? 0 : 1;
}

int verify_expect(const VerifyArgs& a) {
  LoadedInputs li = load_inputs(a.q, a.k, a.v, a.mask);
  const Problem& p = li.problem;
  NpyArray expect = read_npy(a.expect);
  if (expect.shape != li.q.shape) {
    throw InvalidInput(a.expect + ": shape differs from Q's shape; allowed: O has Q's shape");
  }
  NpyArray expect_lse;
  if (!a.expect_lse.empty()) {
    expect_lse = read_npy(a.expect_lse);
    if (expect_lse.shape != std::vector<int64_t>{p.batch, p.q_heads, p.q_len}) {
      throw InvalidInput(a.expect_lse + ": shape must be (batch, q_heads, q_len) = (" +
                         std::to_string(p.batch) + ", " + std::to_string(p.q_heads) + ", " +
                         std::to_string(p.q_len) + ")");
    }
  }
  const Agreement ag = prepare_agreement(p, li.inputs, all_rows(p));
  const MutView ev = make_view<float>(expect.data.data(), p.batch, p.q_heads, p.q_len, p.head_dim, p.layout);
  const Errors external = measure(ag.ref, as_const(ev), expect_lse.data.empty() ? nullptr : expect_lse.data.data(), p);
  print_header(p, ag.baseline, ag.tol);
  std::printf("  expected file vs float64 reference: O %.3g, LSE %.3g -> %s\n", external.o_rel,
              external.lse, ag.tol.passes(external) ? "agrees" : "DISAGREES (different semantics or precision?)");
  print_columns();
  // Kernels are compared with the expected outputs, allowing the file's own error.
  Agreement vs_file = ag;
  for (size_t r = 0; r < vs_file.ref.rows.size(); ++r) {
    const RowId& id = vs_file.ref.rows[r];
    const float* row = ev.row(id.b, id.h, id.i);
    for (int64_t d = 0; d < p.head_dim; ++d) vs_file.ref.o[r * p.head_dim + d] = row[d];
    if (!expect_lse.data.empty()) vs_file.ref.lse[r] = expect_lse.data[(id.b * p.q_heads + id.h) * p.q_len + id.i];
  }
  vs_file.tol = ag.tol.widened_by(external);
  bool ok = ag.tol.passes(external);
  for (const Kernel* k : selected(a.impl)) {
    KernelCheck c = check_kernel(*k, p, li.inputs, vs_file, a.mask.thread_count());
    if (expect_lse.data.empty()) c.errors.lse = 0;  // LSE is compared only when given
    ok &= print_check(c);
  }
  std::printf("\n%s\n", ok ? "all selected kernels agree with the expected outputs"
                            : "FAILED: disagreement with the expected outputs");
  return ok ? 0 : 1;
}

}  // namespace

Command add_verify(CLI::App& app) {
  auto args = std::make_shared<VerifyArgs>();
  CLI::App* sub = app.add_subcommand("verify", "check kernels against the float64 reference or expected .npy outputs");
  sub->add_option("--impl", args->impl, "kernel name(s), comma separated, or all");
  sub->add_option("--q", args->q, "Q .npy (with --k, --v, --expect)");
  sub->add_option("--k", args->k, "K .npy");
  sub->add_option("--v", args->v, "V .npy");
  sub->add_option("--expect", args->expect, "expected O .npy, made elsewhere");
  sub->add_option("--expect-lse", args->expect_lse, "expected LSE .npy (batch, q_heads, q_len)");
  args->mask.add_to(*sub);
  args->shape.add_to(*sub);
  return {sub, [args, sub] {
            const VerifyArgs& a = *args;
            const bool files = !a.q.empty() || !a.k.empty() || !a.v.empty() || !a.expect.empty();
            if (files) {
              if (a.q.empty() || a.k.empty() || a.v.empty() || a.expect.empty()) {
                throw InvalidInput("verify: --q, --k, --v and --expect go together; allowed: all four, or none (random inputs)");
              }
              return verify_expect(a);
            }
            const bool mask_given = sub->count("--causal") + sub->count("--causal-top-left") +
                                        sub->count("--window") + sub->count("--kv-lens") +
                                        sub->count("--scale") + sub->count("--layout") > 0;
            if (!a.shape.any_given(*sub) && !mask_given) return verify_random(default_shapes(), a);
            Problem p;
            a.shape.apply(p);
            a.mask.apply(p);
            return verify_random({p}, a);
          }};
}

}  // namespace attnlab::cli
