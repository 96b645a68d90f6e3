// The one interface every implementation sits behind, and the registry that lists them.
//
// A kernel says whether it supports a problem (and why not), how much workspace it needs
// (allocated once, outside any timed region) and runs. `Session` binds a kernel to a
// problem and a thread count: it validates, allocates the workspace and owns the
// oneTBB task arena the kernel runs in, so `Session::run` is the only thing a benchmark
// times.
//
// The SIMD kernels exist once per instruction-set target (include/attnlab/isa.hpp): each
// variant is a Kernel of the same name whose isa() says its target; registry() lists the
// default variant of each kernel, variants() all of them.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attnlab/backward.hpp"
#include "attnlab/blocks/phases.hpp"
#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab {

// "yes", or "no" with the reason.
struct Support {
  bool ok = true;
  std::string reason;
  static Support yes() { return {}; }
  static Support no(std::string why) { return {false, std::move(why)}; }
  explicit operator bool() const { return ok; }
};

// Per-problem setup a kernel builds once, outside the timed region (e.g. flash's block map of
// a sparse pattern): Session makes it and hands it to every run().
struct Plan {
  virtual ~Plan() = default;
  virtual size_t bytes() const = 0;  // its memory, reported with the workspace
};

// The plan of the kernels that run a sparse pattern tile by tile: its block map.
struct BlockPlan final : Plan {
  BlockMap map;
  explicit BlockPlan(BlockMap m) : map(std::move(m)) {}
  size_t bytes() const override { return map.bytes(); }
};

// The plan of a backward pass that needs a sparse pattern's rule per element (flash's): the
// Pattern, on its own copy of the problem. Out-of-line members (src/core/pattern.cpp): baseline code.
struct PatternPlan final : Plan {
  Problem problem;
  Pattern pattern;
  explicit PatternPlan(const Problem& p);
  PatternPlan(const PatternPlan&) = delete;  // pattern refers to problem
  size_t bytes() const override;
};

// The plan of flash's dilated windows: the phases it runs as dense strided sub-problems
// (phases.hpp) and its tasks in order.
struct PhasePlan final : Plan {
  std::vector<DilationPhase> phases;
  // One task per (phase, kv head, query tile of br phase rows), in the order they are handed
  // out: per batch entry and kv head, the query tiles from the last, and for each the D phases
  // one after another. The phases of one tile index read interleaved rows (every D-th) of the
  // same stretch of K and V, so the neighbouring rows the hardware prefetchers bring in around
  // one phase's rows are the next phase's, still cached when it runs.
  struct Task {
    int32_t phase = 0, hk = 0;
    int64_t qt = 0;
  };
  std::vector<Task> tasks;
  int64_t br = 0;
  size_t bytes() const override { return phases.size() * sizeof(DilationPhase) + tasks.size() * sizeof(Task); }
};

// The arithmetic a kernel's results carry, which the tolerance baseline reproduces (verify.hpp):
//   F32           float32 products and sums on values widened exactly from storage (the textbook);
//   Bf16Products  bf16 x bf16 products (exact) summed in float32, and the softmax weights P
//                 rounded to bf16 before P.V (flash_bf16);
//   Int8Products  Q rounded to int8 by round_q_row (kv_quant.hpp) and K.Q as exact int32 dot
//                 products with a quantized cache's integer codes, the scales applied after;
//                 softmax in float32; on a tile of 64 keys a row sees whole, P times V's scales
//                 rounded by round_p_tile and P.V as exact int32 sums with V's codes (decode_i8).
//                 Its baseline is the textbook on the Q it multiplies with P rounded by the same
//                 rule: what rounding costs is derived, never a chosen number. On a dense
//                 problem (flash_int8) K is smoothed and rounded too, and on a tile of 64 keys
//                 a row sees whole P is rounded by round_p_tile and V per channel
//                 (round_v_channels), P.V exact int32 sums of their codes.
//   Int8Bf16Products  Int8Products' K.Q (flash_int8's rounding), then P and V rounded to bf16 for
//                 P.V (flash_int8_amx: TDPBSSD scores, TDPBF16PS P.V on the AMX tiles).
enum class Arithmetic { F32, Bf16Products, Int8Products, Int8Bf16Products };
const char* to_string(Arithmetic a);  // "f32", "bf16_products", "int8_products", "int8_bf16_products"

// What a kernel runs, declared once as one value (Kernel::capabilities): the session refuses a
// problem outside it naming the kernels that run it (supports_problem), wrappers forward it whole,
// the agreement grid's must-run table and `attnlab list` read it. A new capability is a field, its
// row in session.cpp's rules and the kernels that set it.
struct Capabilities {
  bool patterns = false;             // sparse patterns (Problem::sparse(), pattern.hpp); else interval masks only
  bool head_dim_v = false;           // head_dim_v != head_dim (MLA's d_v != d_qk)
  bool kv_quant = false;             // a quantized KV cache (Problem::kv_dtype, kv_quant.hpp)
  bool kv_int_codes_only = false;    // ... and only one with integer codes (q8_0, q4_0, u8, u4: kv_int_dot)
  bool paged = false;                // a paged cache (Problem::kv_block, Inputs::pages)
  bool backward = false;             // the backward pass (backward.hpp)
  bool score_mods = false;           // softcap, ALiBi and sink logits (Problem::score_mods, score_mod.hpp)
  bool score_mods_backward = false;  // ... in its backward pass too (d softcap, d sink logits)
  bool topk = false;                 // query-aware sparse decode (Problem::topk_tokens, kv_summary.hpp)
  Arithmetic arithmetic = Arithmetic::F32;  // what its tolerance is measured against
  int64_t max_q_len = 0;                    // 0: any; decode kernels take a few new query rows
  int64_t max_head_dim = 0;                 // 0: Problem's limit; else max(head_dim, head_dim_v) up to this
  const char* limit_note = "";              // why the limits: the refusal's words (decode: "it splits the keys ...")
};

struct RunContext {
  int threads = 1;                 // size of the arena the kernel runs in
  std::span<std::byte> workspace;  // workspace_bytes() bytes, 64-byte aligned
  const Plan* plan = nullptr;      // make_plan()'s, when the kernel made one
  // CUDA kernels: this many more launches back to back between two events after the one whose
  // results are copied back (cuda::time_launches; the others ignore it).
  int timed_launches = 0;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual std::string_view name() const = 0;
  virtual std::string_view description() const = 0;
  // The instruction-set target its code was compiled for: a built target (isa.hpp) for
  // the SIMD kernels, "baseline" for code built for the architecture's baseline, "cuda".
  // (Defaults are defined out of line, in baseline code: an inline body would be emitted
  // in every per-target object too, and the linker could keep an AVX-512 copy.)
  virtual std::string_view isa() const;
  // Whether the kernel can run on this machine at all (e.g. "no CUDA device").
  virtual Support available() const;
  // Its arithmetic, for `attnlab list` and the reports: which storage dtypes it reads and the
  // precision it computes in (default: f32, bf16 and f16 inputs widened exactly to float32
  // where loaded; float32 compute and accumulation).
  virtual std::string_view precision() const;
  // What it runs (default: interval masks, d_v = d, a float cache, contiguous, forward only, F32).
  // Constant data, not a value built on call: the registry asks every kernel, also one compiled for
  // instructions this CPU lacks, and such an object builds even a struct with vector stores (SIGILL
  // on an SSE2-only CPU); returning the address of a constant is not vector code.
  virtual const Capabilities& capabilities() const;
  // capabilities().arithmetic: the arithmetic its tolerance is measured against.
  Arithmetic arithmetic() const;
  // Whether it computes this (valid) problem; the reason when not.
  virtual Support supports(const Problem&) const;
  // Scratch memory for run(), for `threads` threads: the kernel's extra memory.
  virtual size_t workspace_bytes(const Problem&, int threads) const;
  // Its per-problem setup (nullptr: none); run() must also work without it (then it builds
  // what it needs itself, inside the run).
  virtual std::shared_ptr<const Plan> make_plan(const Problem&) const;
  // Computes O (and LSE when outputs.lse is set). Called inside the run's task_arena.
  virtual void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const = 0;
  // Whether its backward pass (capabilities().backward; a Session made for the backward refuses
  // the others, naming the kernels that have one) computes this (valid) problem; the reason when
  // not (default: yes).
  virtual Support backward_supports(const Problem&) const;
  // Scratch memory for run_backward(), for `threads` threads.
  virtual size_t backward_workspace_bytes(const Problem&, int threads) const;
  // Writes dQ, dK and dV (every element) from Q, K, V, dO and the forward's O and LSE. Called
  // inside the run's task_arena; only when capabilities().backward.
  virtual void run_backward(const Problem& p, const Inputs& in, const BackwardInputs& bw, const Gradients& g,
                            RunContext& ctx) const;
  // run_backward's per-problem setup (nullptr: none), made by a Session for the backward and
  // handed to run_backward as RunContext::plan; run_backward must also work without it.
  virtual std::shared_ptr<const Plan> make_backward_plan(const Problem&) const;
};

// All kernels, in ladder order, each once: a SIMD kernel as its variant for default_isa()
// (or, if it has none, its widest variant this CPU runs). Test-only kernels are not listed.
std::vector<const Kernel*> registry();
// Every variant: registry()'s kernels, the SIMD ones once per built target (narrowest
// first). A variant whose target this CPU cannot run is listed, and unavailable (why).
std::vector<const Kernel*> variants();
// The variant of kernel `name` for target `isa` ("" = as registry() picks); nullptr when
// there is no kernel of that name, or it has no variant for `isa`.
const Kernel* find_kernel(std::string_view name, std::string_view isa = {});
// Throws InvalidInput listing the known names (or the kernel's targets).
const Kernel& kernel_or_throw(std::string_view name, std::string_view isa = {});
std::string kernel_names();  // "naive, blocked, ..."
// The targets kernel `name` is built for (one entry, its isa(), for single-build kernels).
std::vector<std::string> kernel_isas(std::string_view name);
// Whether a kernel's isa() names a target it was compiled for (one of built_isas()), as
// opposed to "baseline" or "cuda": such kernels have one variant per target.
bool is_per_target_isa(std::string_view kernel_isa);
// How output names a kernel variant: "flash[avx2]" for a kernel built per target, the plain
// name ("naive", "cuda_flash") otherwise.
std::string kernel_label(std::string_view name, std::string_view isa);
std::string kernel_label(const Kernel& k);

// The kernels whose capability holds ("naive, flash, ..."), for refusals that name them. The
// registry hands its list over at start-up (set_kernel_catalog): attn_core does not link the
// kernels; "" until it does.
std::string kernels_that(bool Capabilities::*has);
std::string kernels_that(const std::function<bool(const Capabilities&)>& has);
void set_kernel_catalog(std::vector<const Kernel*> (*all)());

// supports(), after the capabilities (a sparse pattern, d_v != d_qk, a quantized or paged cache,
// the limits; session.cpp's rules): the kernel-side half of can_run.
// A problem whose pass is not the forward also needs backward_support.
Support supports_problem(const Kernel& kernel, const Problem& problem);
// Whether the kernel's backward pass takes the (valid) problem: capabilities().backward, a cache the
// backward reads (check_backward_problem), backward_supports(); the reason names the kernels
// that have one.
Support backward_support(const Kernel& kernel, const Problem& problem);
// Whether the memory a run of `kernel` on the (valid) problem needs -- its workspace for
// `threads` threads plus the problem's Q, K, V, O and LSE -- fits the memory budget
// (limits.hpp); the reason names the bytes and the budget when not.
// backward: a run of both passes - the larger workspace, and dO, dQ, dK, dV beside the tensors.
Support fits_memory_budget(const Kernel& kernel, const Problem& problem, int threads, bool backward = false);
// The one decision every path takes before allocating (Session, check_kernel, sweeps):
// available(), then supports_problem() (the capabilities, then supports()), then
// fits_memory_budget(); "no" with the first reason.
Support can_run(const Kernel& kernel, const Problem& problem, int threads, bool backward = false);

// A kernel bound to a problem and a thread count.
class Session {
 public:
  // Validates the problem, checks availability, support and the memory budget (throws
  // InvalidInput with the reason), allocates the workspace and creates the arena. backward:
  // the session also runs run_backward (the kernel must have it; its workspace is the larger).
  Session(const Kernel& kernel, const Problem& problem, int threads, bool backward = false);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // timed_launches: RunContext::timed_launches (cuda::time_launches).
  void run(const Inputs& in, const Outputs& out, int timed_launches = 0);
  // The backward pass (a session made with backward = true).
  void run_backward(const Inputs& in, const BackwardInputs& bw, const Gradients& g);
  // A growing KV cache (attnlab generate): the problem becomes the same one with kv_len keys,
  // at most the kv_len the session was made for, so the workspace and arena are reused.
  // Interval problems without per-batch kv_lens only; throws InvalidInput otherwise.
  void resize_kv(int64_t kv_len);
  size_t workspace_bytes() const { return workspace_size_; }
  // Both plans' memory: the forward's and, for a backward session, the backward's.
  size_t plan_bytes() const { return (plan_ ? plan_->bytes() : 0) + (backward_plan_ ? backward_plan_->bytes() : 0); }
  const Kernel& kernel() const { return kernel_; }
  const Problem& problem() const { return problem_; }
  int threads() const { return threads_; }

 private:
  const Kernel& kernel_;
  Problem problem_;
  int threads_;
  int64_t made_kv_len_;  // resize_kv's bound
  bool backward_;
  size_t workspace_size_ = 0;
  std::unique_ptr<std::byte[], AlignedFree> workspace_;
  std::shared_ptr<const Plan> plan_, backward_plan_;
  struct Arena;  // a tbb::task_arena (kept out of this header)
  std::unique_ptr<Arena> arena_;
};

}  // namespace attnlab
