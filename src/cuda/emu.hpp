// Host emulation of the small part of CUDA the lab's kernels use, so their device code runs
// (slowly) and is tested on machines without a GPU. Not a general CUDA emulator.
//
// The device code of src/cuda/*.cu is compiled as plain C++ with ATTN_CUDA_EMU defined
// (see tests/kernels/cuda_emu_kernels.cpp). Every CUDA thread of a block becomes a fiber (ucontext)
// on the calling OS thread; blocks run one after another. A fiber runs until it reaches a
// barrier (__syncthreads, __syncwarp, or a warp shuffle, which is a warp barrier around a
// slot exchange) and the scheduler resumes waiting fibers when their whole block / warp has
// arrived. Fibers are resumed in a shuffled order at every round, so a missing barrier shows
// up as a wrong or changing result instead of being hidden by a fixed order. A barrier that
// can never complete (divergent __syncthreads) is reported as an error instead of hanging, and
// so is a shuffle whose mask does not name exactly the lanes that take part (or leaves out the
// lane read). Shared memory starts as NaN, as the tests' outputs and scratch do
// (tests/kernels/cuda_emu_kernels.cpp): memory a GPU leaves uninitialized may hold anything, so a
// kernel that multiplies unwritten memory by 0 or leaves an output unwritten shows up.
// cp.async (sm_80's asynchronous global -> shared copies): a copy lands either at once or only
// when its thread's cp.async.wait_group lets it (a coin flip per copy, seeded): read before the
// wait (and the barrier that makes other threads' copies visible), the buffer still holds the
// previous tile or NaN; issued into a buffer other threads still read, the early landings
// overwrite it under them. A copy whose addresses are not aligned to its size, or whose
// destination is not shared memory, is an error; so are copies a thread never waits for.
// What it cannot show: timing, memory-model subtleties beyond barrier ordering, bank conflicts,
// and anything about the real compiler's register allocation.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace attnlab::cuda_emu {

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct alignas(16) float4 {
  float x, y, z, w;
};

// The thread the scheduler is running; read by the threadIdx/blockIdx macros below.
inline thread_local uint3 g_thread_idx;
inline thread_local uint3 g_block_idx;
inline thread_local dim3 g_block_dim;
inline thread_local dim3 g_grid_dim;
inline thread_local std::byte* g_smem = nullptr;
inline thread_local size_t g_smem_bytes = 0;  // the launch's dynamic shared memory

class BlockScheduler {
 public:
  static constexpr size_t kStackBytes = 256 * 1024;
  static constexpr int kWarp = 32;

  enum class State { Ready, AtBlockBarrier, AtWarpBarrier, Done };

  BlockScheduler(unsigned threads, uint64_t seed) : rng_(seed) {
    fibers_.resize(threads);
    stacks_.reset(new std::byte[kStackBytes * threads]);
    slots_.assign(2 * ((threads + kWarp - 1) / kWarp) * kWarp, 0);
    arrivals_.assign(slots_.size(), Arrival{});
    exchange_.assign(slots_.size() * kExchangeWords, 0);
    exchange_seq_.assign(slots_.size(), 0);
  }

  // A fresh context for thread t starting at entry(). Its own frame, so no loop variable
  // is live across getcontext() (a returns-twice call GCC warns about: -Wclobbered).
  void prepare_fiber(unsigned t) {
    Fiber& f = fibers_[t];
    f.state = State::Ready;
    f.shuffle_phase = 0;
    f.shuffles = 0;
    f.exchange_phase = 0;
    f.exchanges = 0;
    f.open_copies.clear();
    f.copy_groups.clear();
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = stacks_.get() + kStackBytes * t;
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = &main_;
    makecontext(&f.ctx, &BlockScheduler::entry, 0);
  }

  // Runs body() once per thread of the block (threadIdx.x = 0 .. threads-1).
  void run_block(const std::function<void()>& body) {
    body_ = &body;
    std::fill(arrivals_.begin(), arrivals_.end(), Arrival{});
    std::fill(exchange_seq_.begin(), exchange_seq_.end(), 0);
    const unsigned n = static_cast<unsigned>(fibers_.size());
    for (unsigned t = 0; t < n; ++t) prepare_fiber(t);
    std::vector<unsigned> order(n);
    for (unsigned t = 0; t < n; ++t) order[t] = t;
    unsigned done = 0;
    while (done < n) {
      std::shuffle(order.begin(), order.end(), rng_);
      bool ran = false;
      for (unsigned t : order) {
        if (fibers_[t].state != State::Ready) continue;
        ran = true;
        current_ = t;
        g_thread_idx = uint3{t, 0, 0};
        t_current = this;
        swapcontext(&main_, &fibers_[t].ctx);
        if (fibers_[t].state == State::Ready) {  // returned
          fibers_[t].state = State::Done;
          if (!fibers_[t].open_copies.empty() || !fibers_[t].copy_groups.empty()) {
            report("thread " + std::to_string(t) + " ended with cp.async copies it never waited for");
          }
        }
        if (fibers_[t].state == State::Done) ++done;
      }
      if (release_barriers()) continue;
      if (!ran && done < n) {
        throw std::runtime_error(
            "cuda emulation: barrier deadlock (a __syncthreads/__syncwarp/shuffle that not "
            "every thread of the block/warp reaches)");
      }
    }
    if (!error_.empty()) throw std::runtime_error(error_);
  }

  // Called from fibers.
  void block_barrier() { yield(State::AtBlockBarrier); }
  void warp_barrier() { yield(State::AtWarpBarrier); }

  template <class T>
  T shuffle(unsigned mask, T value, unsigned src_lane_xor, bool is_xor) {
    static_assert(sizeof(T) <= sizeof(uint64_t));
    Fiber& f = fibers_[current_];
    const unsigned t = current_;
    const unsigned warp = t / kWarp, lane = t % kWarp;
    // Two slot sets, alternating: a lane may write the next shuffle's slot while a slower
    // lane still reads this one, and the warp barrier between them orders the reuse.
    const size_t base = f.shuffle_phase * (slots_.size() / 2) + warp * kWarp;
    uint64_t* slots = slots_.data() + base;
    Arrival* arrivals = arrivals_.data() + base;
    f.shuffle_phase ^= 1;
    const uint64_t seq = ++f.shuffles;
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(T));
    slots[lane] = bits;
    arrivals[lane] = Arrival{seq, mask};
    warp_barrier();
    const unsigned src = (is_xor ? (lane ^ src_lane_xor) : src_lane_xor) % kWarp;
    check_mask(arrivals, lane, src, seq, mask);
    T out;
    std::memcpy(&out, &slots[src], sizeof(T));
    return out;
  }

  // A warp-collective exchange (the tensor-core instructions' model: mma.sync, ldmatrix): every
  // lane of the warp deposits n <= kExchangeWords words, and after the warp barrier reads the
  // whole warp's deposits - lane l's word w at [l * kExchangeWords + w] - until its next
  // exchange. The .sync.aligned instructions need all 32 lanes: a lane absent (returned, or at
  // another instruction) is an error, as a divergent mma is undefined on a GPU.
  static constexpr int kExchangeWords = 8;
  const uint32_t* exchange(const uint32_t* words, int n, const char* what) {
    Fiber& f = fibers_[current_];
    const unsigned t = current_;
    const unsigned warp = t / kWarp, lane = t % kWarp;
    const size_t base = (f.exchange_phase * (exchange_.size() / 2)) + warp * kWarp * kExchangeWords;
    f.exchange_phase ^= 1;
    const uint64_t seq = ++f.exchanges;
    std::memcpy(exchange_.data() + base + lane * kExchangeWords, words, sizeof(uint32_t) * n);
    exchange_seq_[base / kExchangeWords + lane] = seq;
    warp_barrier();
    if (error_.empty()) {
      const unsigned first = t - lane;
      for (unsigned l = 0; l < static_cast<unsigned>(kWarp); ++l) {
        if (first + l >= fibers_.size() || exchange_seq_[base / kExchangeWords + l] != seq) {
          error_ = std::string("cuda emulation: ") + what + " at lane " + std::to_string(lane) + ": lane " +
                   std::to_string(l) + " of the warp is not at it (.sync.aligned needs all 32 lanes)";
          break;
        }
      }
    }
    return exchange_.data() + base;
  }

  // cp.async of `bytes` (4, 8 or 16) from global src to shared dst, the first src_bytes of them
  // read and the rest zero-filled (the instruction's src-size operand).
  void cp_async(void* dst, const void* src, int bytes, int src_bytes) {
    const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
    const auto smem = reinterpret_cast<uintptr_t>(g_smem);
    if (d % bytes != 0 || s % bytes != 0 || d < smem || d + bytes > smem + g_smem_bytes || src_bytes < 0 ||
        src_bytes > bytes) {
      report("cp.async of " + std::to_string(bytes) + " bytes at thread " + std::to_string(current_) +
             ": addresses not aligned to the copy's size, a destination outside shared memory, or a bad src-size");
      return;
    }
    Copy c{static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), bytes, src_bytes};
    if (std::bernoulli_distribution(0.5)(rng_)) {
      c.land();
    } else {
      fibers_[current_].open_copies.push_back(c);
    }
  }
  void cp_async_commit() {
    Fiber& f = fibers_[current_];
    f.copy_groups.push_back(std::move(f.open_copies));
    f.open_copies.clear();
  }
  // cp.async.wait_group n: every committed group but the newest n has landed.
  void cp_async_wait(int n) {
    Fiber& f = fibers_[current_];
    while (static_cast<int>(f.copy_groups.size()) > n) {
      for (const Copy& c : f.copy_groups.front()) c.land();
      f.copy_groups.pop_front();
    }
  }

  // A rule the device code broke (an instruction's operand it may not take): kept, and thrown by
  // run_block once the block ends, as a shuffle-mask violation is.
  void report(const std::string& what) {
    if (error_.empty()) error_ = "cuda emulation: " + what;
  }

  static inline thread_local BlockScheduler* t_current = nullptr;

 private:
  struct Copy {
    std::byte* dst;
    const std::byte* src;
    int bytes, src_bytes;
    void land() const {
      std::memcpy(dst, src, static_cast<size_t>(src_bytes));
      std::memset(dst + src_bytes, 0, static_cast<size_t>(bytes - src_bytes));
    }
  };
  struct Fiber {
    std::vector<Copy> open_copies;              // cp.async issued since the last commit, not landed
    std::deque<std::vector<Copy>> copy_groups;  // committed groups not waited for, oldest first
    ucontext_t ctx{};
    State state = State::Ready;
    unsigned shuffle_phase = 0;
    uint64_t shuffles = 0;  // shuffles this thread has called in this block
    unsigned exchange_phase = 0;
    uint64_t exchanges = 0;  // warp exchanges (mma, ldmatrix) likewise
  };
  // What a lane passed to its latest shuffle in a slot set: the shuffle's number and the mask.
  struct Arrival {
    uint64_t seq = 0;
    unsigned mask = 0;
  };

  // After the warp barrier of shuffle number `seq`: `mask` must name this lane and the lane it
  // reads, and every lane it names must be at this same shuffle with the same mask (CUDA's rule
  // for *_sync; a partial warp that names an absent lane is undefined there). The first
  // violation is kept and thrown by run_block once the block ends (not from inside a fiber).
  void check_mask(const Arrival* arrivals, unsigned lane, unsigned src, uint64_t seq, unsigned mask) {
    if (!error_.empty()) return;
    char buf[160];
    auto fail = [&](const char* what, unsigned other) {
      std::snprintf(buf, sizeof buf, "cuda emulation: shuffle mask 0x%08x at lane %u: %s %u", mask, lane, what, other);
      error_ = buf;
    };
    if (!(mask >> lane & 1u)) return fail("leaves out its own lane", lane);
    if (!(mask >> src & 1u)) return fail("leaves out the lane it reads,", src);
    const unsigned first = current_ - lane, n = static_cast<unsigned>(fibers_.size());
    for (unsigned l = 0; l < static_cast<unsigned>(kWarp); ++l) {
      if (!(mask >> l & 1u)) continue;
      if (first + l >= n || arrivals[l].seq != seq) return fail("names a lane that is not at this shuffle:", l);
      if (arrivals[l].mask != mask) return fail("differs from the mask of lane", l);
    }
  }

  static void entry() {
    BlockScheduler* s = t_current;
    (*s->body_)();
    // Falls off the end: uc_link resumes the scheduler, which marks the fiber done.
  }

  void yield(State s) {
    const unsigned t = current_;
    fibers_[t].state = s;
    swapcontext(&fibers_[t].ctx, &main_);
    // Resumed by the scheduler: restore this thread's identity.
    g_thread_idx = uint3{t, 0, 0};
  }

  // Wakes complete barriers; true when some fiber became ready.
  bool release_barriers() {
    const unsigned n = static_cast<unsigned>(fibers_.size());
    bool woke = false;
    bool block_ready = true, any_block = false;
    for (unsigned t = 0; t < n; ++t) {
      const State s = fibers_[t].state;
      if (s == State::Done) continue;
      if (s == State::AtBlockBarrier)
        any_block = true;
      else
        block_ready = false;
    }
    if (any_block && block_ready) {
      for (auto& f : fibers_) {
        if (f.state == State::AtBlockBarrier) f.state = State::Ready;
      }
      woke = true;
    }
    for (unsigned w0 = 0; w0 < n; w0 += kWarp) {
      const unsigned w1 = std::min(n, w0 + kWarp);
      bool ready = true, any = false;
      for (unsigned t = w0; t < w1; ++t) {
        const State s = fibers_[t].state;
        if (s == State::Done) continue;
        if (s == State::AtWarpBarrier)
          any = true;
        else
          ready = false;
      }
      if (any && ready) {
        for (unsigned t = w0; t < w1; ++t) {
          if (fibers_[t].state == State::AtWarpBarrier) fibers_[t].state = State::Ready;
        }
        woke = true;
      }
    }
    return woke;
  }

  std::vector<Fiber> fibers_;
  std::unique_ptr<std::byte[]> stacks_;
  std::vector<uint64_t> slots_;
  std::vector<Arrival> arrivals_;
  std::vector<uint32_t> exchange_;      // two sets (alternating, as the shuffle slots) of the warps'
  std::vector<uint64_t> exchange_seq_;  // deposits; which exchange each lane's deposit is from
  std::string error_;                   // the first shuffle-mask (or exchange) violation of the block
  ucontext_t main_{};
  unsigned current_ = 0;
  const std::function<void()>* body_ = nullptr;
  std::mt19937_64 rng_;
};

// kernel<<<grid, block, smem>>>(args) for a 1-D block, run to completion on this thread.
inline void emulate_launch(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()>& body) {
  if (block.y != 1 || block.z != 1) throw std::runtime_error("cuda emulation: 1-D blocks only");
  std::vector<float4> smem((smem_bytes + sizeof(float4) - 1) / sizeof(float4) + 1);
  BlockScheduler sched(block.x, 0x5eedu + grid.x * 31u + grid.y * 17u + grid.z);
  g_block_dim = block;
  g_grid_dim = grid;
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        g_block_idx = uint3{x, y, z};
        // NaN (all bits set: NaN as f32, bf16 and f16), not zeros or a finite value: shared
        // memory is uninitialized on a GPU, and 0 x NaN stays NaN where 0 x garbage would hide.
        std::memset(smem.data(), 0xff, smem.size() * sizeof(float4));
        g_smem = reinterpret_cast<std::byte*>(smem.data());
        g_smem_bytes = smem_bytes;
        sched.run_block(body);
      }
    }
  }
  g_smem = nullptr;
  g_smem_bytes = 0;
}

inline BlockScheduler& current() { return *BlockScheduler::t_current; }

}  // namespace attnlab::cuda_emu

// The CUDA spellings the kernels use.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define threadIdx (::attnlab::cuda_emu::g_thread_idx)
#define blockIdx (::attnlab::cuda_emu::g_block_idx)
#define blockDim (::attnlab::cuda_emu::g_block_dim)
#define gridDim (::attnlab::cuda_emu::g_grid_dim)

inline void __syncthreads() { ::attnlab::cuda_emu::current().block_barrier(); }
inline void __syncwarp(unsigned = 0xffffffffu) { ::attnlab::cuda_emu::current().warp_barrier(); }
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  return ::attnlab::cuda_emu::current().shuffle(mask, v, static_cast<unsigned>(lane_mask), true);
}
template <class T>
inline T __shfl_sync(unsigned mask, T v, int src_lane) {
  return ::attnlab::cuda_emu::current().shuffle(mask, v, static_cast<unsigned>(src_lane), false);
}
