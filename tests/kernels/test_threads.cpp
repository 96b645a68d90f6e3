// Kernels whose work decomposition does not depend on the thread count must give bitwise
// identical O and LSE for any thread count: threaded (tasks = query blocks) and decode
// (tasks = fixed key chunks, merged in chunk order).
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "attnlab/kernel.hpp"
#include "attnlab/verify.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

struct Output {
  std::vector<float> o, lse;
};

Output run_with(const Kernel& k, const Problem& p, int threads) {
  Tensors t = random_tensors(p, 123);
  Session s(k, p, threads);
  s.run(t.inputs, t.outputs);
  return {std::vector<float>(t.o.get(), t.o.get() + p.q_elems()),
          std::vector<float>(t.lse.get(), t.lse.get() + p.lse_elems())};
}

void expect_variant_invariant(const Kernel& k, const Problem& p) {
  const std::string name = test::variant_name(k);
  ASSERT_TRUE(supports_problem(k, p)) << supports_problem(k, p).reason;
  // The shape must be big enough for several tasks per thread, and correct at all.
  Tensors t = random_tensors(p, 123);
  const KernelCheck c = check_kernel(k, p, t.inputs, prepare_agreement(p, t.inputs, sample_rows(p, 256, 3)), 2);
  ASSERT_EQ(c.verdict, Verdict::Pass) << c.reason;
  const Output one = run_with(k, p, 1);
  for (int threads : {2, 3}) {
    const Output many = run_with(k, p, threads);
    EXPECT_EQ(std::memcmp(one.o.data(), many.o.data(), one.o.size() * sizeof(float)), 0)
        << name << ": O differs between 1 and " << threads << " threads";
    EXPECT_EQ(std::memcmp(one.lse.data(), many.lse.data(), one.lse.size() * sizeof(float)), 0)
        << name << ": LSE differs between 1 and " << threads << " threads";
  }
}

// For every variant of the kernel this CPU runs (one per built target).
void expect_thread_count_invariant(const char* name, const Problem& p) {
  int ran = 0;
  for (const std::string& isa : kernel_isas(name)) {
    const Kernel& k = kernel_or_throw(name, isa);
    if (!k.available()) continue;
    SCOPED_TRACE(test::variant_name(k));
    expect_variant_invariant(k, p);
    ++ran;
  }
  EXPECT_GT(ran, 0) << name << ": no variant runs on this CPU";
}

TEST(ThreadCount, ThreadedIsBitwiseIdenticalForAnyThreadCount) {
  Problem p = test::shape(2, 6, 2, 77, 300, 80);  // GQA 3:1, 3 query blocks per head
  p.causal = CausalAlign::BottomRight;
  expect_thread_count_invariant("threaded", p);
}

TEST(ThreadCount, DecodeIsBitwiseIdenticalForAnyThreadCount) {
  // GQA 4:1, several key chunks per head, one sequence shorter than the cache (empty
  // chunks) and a causal diagonal inside a chunk.
  Problem p = test::shape(2, 8, 2, 5, 1500, 80);
  p.causal = CausalAlign::BottomRight;
  p.kv_lens = {1500, 700};
  expect_thread_count_invariant("decode", p);
}

}  // namespace
}  // namespace attnlab
