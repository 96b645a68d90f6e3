// attnlab::parallel_tasks: tbb::parallel_for, plus, in ThreadSanitizer builds only, the
// happens-before edges TSan cannot see. libtbb is not instrumented, so its task hand-off and
// its join look unsynchronised to TSan, which would then report every task's read of the
// caller's data (inputs, workspace, the previous phase's results) as a race. Here the
// caller's writes happen before every task (it releases `start`, each task acquires it) and
// every task's writes before the return (each task releases `done`, the caller acquires it).
// Tasks get no edge between each other: two tasks touching the same memory are still reported.
// A name of its own: a call spelled `parallel_for(tbb::blocked_range...)` from a kernel's
// namespace finds tbb::parallel_for by argument-dependent lookup, which wins the overload
// and silently drops the annotations (it did, once the kernels moved into per-target
// namespaces).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "attnlab/kernel.hpp"

#if defined(__SANITIZE_THREAD__)
#define ATTN_TSAN_ANNOTATE 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ATTN_TSAN_ANNOTATE 1
#endif
#endif
#ifdef ATTN_TSAN_ANNOTATE
#include <sanitizer/tsan_interface.h>
#endif

namespace attnlab {

// Where a kernel chooses how to cut its work (flash's query tile, decode's key chunk), it cuts
// the largest pieces that still make at least this many tasks: enough for the threads of a
// large machine to balance, decided from the problem alone, so the results (each task's
// summation order) never depend on the thread count.
inline constexpr int64_t kMinTasks = 64;

template <class Range, class Body, class... Partitioner>
void parallel_tasks(const Range& range, const Body& body, Partitioner&&... partitioner) {
#ifdef ATTN_TSAN_ANNOTATE
  char start = 0, done = 0;
  __tsan_release(&start);
  tbb::parallel_for(
      range,
      [&](const Range& r) {
        __tsan_acquire(&start);
        body(r);
        __tsan_release(&done);
      },
      std::forward<Partitioner>(partitioner)...);
  __tsan_acquire(&done);
#else
  tbb::parallel_for(range, body, std::forward<Partitioner>(partitioner)...);
#endif
}

}  // namespace attnlab

// Only the per-target sources include this header (CMake's ATTN_TARGET_SOURCES), so what follows
// lives in the target's namespace: a function or a TBB template instantiated here gets a symbol of
// this target's own. In namespace attnlab, the linker kept one copy of each for the whole binary -
// backward_tiles.cpp's avx2 copy of thread_scratch and of TBB's range_vector<blocked_range<long>>
// ::split_to_fill, VEX-encoded, in baseline code (IsaSymbols.* caught it).
namespace attnlab::ATTN_TARGET_NS {

// The task range of every parallel_tasks call: tbb::blocked_range<int64_t> under this target's name.
struct TaskRange : tbb::blocked_range<int64_t> {
  using tbb::blocked_range<int64_t>::blocked_range;
  TaskRange(TaskRange& r, tbb::split s) : tbb::blocked_range<int64_t>(r, s) {}
  TaskRange(TaskRange& r, tbb::proportional_split& s) : tbb::blocked_range<int64_t>(r, s) {}
};

// The calling thread's slice of the run's workspace (bytes_per_thread each, after `offset`
// bytes shared by all threads): tasks index scratch by their arena slot, so a kernel run
// outside an arena of ctx.threads threads would share a slice - an error, not a race.
inline std::byte* thread_scratch(RunContext& ctx, size_t bytes_per_thread, const char* kernel, size_t offset = 0) {
  const int slot = tbb::this_task_arena::current_thread_index();
  if (slot < 0 || slot >= ctx.threads) {
    throw std::logic_error(std::string(kernel) + ": run outside an arena of ctx.threads threads");
  }
  return ctx.workspace.data() + offset + static_cast<size_t>(slot) * bytes_per_thread;
}

}  // namespace attnlab::ATTN_TARGET_NS
