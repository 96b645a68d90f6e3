// threaded: the simd kernel's work spread over threads with oneTBB.
//
// Idea: the simd kernel's unit of work - one block of 32 query rows of one (batch, head)
// against every key it sees (simd::attend_row_block, src/cpu/simd/rowblock.hpp) - is
// independent of every other block, so the blocks are the tasks: tbb::parallel_for over
// the flat (batch, head, query block) index with grain 1, inside the caller's arena
// (ctx.threads wide). The decomposition depends only on the problem, and a block's result
// only on its inputs, so the output is bitwise identical for any thread count (tested in
// tests/kernels/test_threads.cpp). Causal blocks late in the sequence cost more than early ones;
// grain 1 lets TBB's work stealing even that out (every (b, h) has a mix of both).
// Memory: one simd scratch per thread (about 42 KiB at head_dim 128), the running thread's
// slice (thread_scratch); nothing proportional to sequence length.
// Expected cost: simd's time divided by the thread count, less the imbalance of the last
// few tasks; K/V tiles are per-thread L2 traffic as in simd (each head's K/V is streamed
// once per query block, by whichever thread runs it).
// Measured: results/2026-11-29-attn_bench (2.0x simd on 2 threads, Zen 4) and the ladder in
// every report.
#include <stdexcept>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "attnlab/kernel.hpp"
#include "cpu/engine/parallel.hpp"
#include "cpu/simd/rowblock.hpp"

namespace attnlab::ATTN_TARGET_NS::cpu {
namespace {

size_t per_thread_bytes(const Problem& p) { return (simd::row_block_scratch_bytes(p) + 63) / 64 * 64; }

class Threaded final : public Kernel {
 public:
  std::string_view name() const override { return "threaded"; }
  std::string_view description() const override {
    return "the simd kernel's 32-row blocks as oneTBB tasks over (batch, head, query block); "
           "bitwise identical for any thread count";
  }
  size_t workspace_bytes(const Problem& p, int threads) const override {
    return static_cast<size_t>(threads) * per_thread_bytes(p);
  }
  const Capabilities& capabilities() const override {
    static constexpr Capabilities k{.score_mods = true};
    return k;
  }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    const int64_t blocks = (p.q_len + simd::kRowBlock - 1) / simd::kRowBlock;
    const int64_t tasks = p.batch * p.q_heads * blocks;
    const size_t stride = per_thread_bytes(p);
    attnlab::parallel_tasks(TaskRange(0, tasks, 1), [&](const TaskRange& range) {
      std::byte* scratch = thread_scratch(ctx, stride, "threaded");
      for (int64_t t = range.begin(); t != range.end(); ++t) {
        const int64_t bh = t / blocks;
        simd::attend_row_block(p, in, out, bh / p.q_heads, bh % p.q_heads, (t % blocks) * simd::kRowBlock, scratch);
      }
    });
  }
};

}  // namespace

const Kernel& threaded() {
  static const Threaded k;
  return k;
}

}  // namespace attnlab::ATTN_TARGET_NS::cpu
