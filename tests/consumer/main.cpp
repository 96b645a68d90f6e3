// Runs flash on random inputs through the installed library and checks it against the float64
// reference with the lab's tolerance policy. Exit 0 when it agrees.
#include <cstdio>

#include "attnlab/kernel.hpp"
#include "attnlab/verify.hpp"

int main() {
  using namespace attnlab;
  Problem p;
  p.q_heads = 8, p.kv_heads = 2, p.q_len = 70, p.kv_len = 130, p.head_dim = 64;
  p.causal = CausalAlign::BottomRight;
  Tensors t = random_tensors(p, 1);
  const Agreement a = prepare_agreement(p, t.inputs, all_rows(p));
  const KernelCheck c = check_kernel(kernel_or_throw("flash"), p, t.inputs, a, 2);
  std::printf("consumer: flash on %s: %s (O error %.3g, tolerance %.3g)%s%s\n", p.describe().c_str(),
              to_string(c.verdict), c.errors.o_rel, c.tol.o_rel, c.reason.empty() ? "" : ": ", c.reason.c_str());
  return c.verdict == Verdict::Pass ? 0 : 1;
}
