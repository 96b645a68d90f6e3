// The Kernel interface's shared parts: defaults, the run decision (can_run) and Session.
#include <algorithm>
#include <functional>
#include <stdexcept>

#include <tbb/task_arena.h>

#include "attnlab/kernel.hpp"
#include "attnlab/kv_quant.hpp"
#include "attnlab/limits.hpp"

namespace attnlab {

std::string_view Kernel::isa() const { return "baseline"; }
Support Kernel::available() const { return Support::yes(); }
std::string_view Kernel::precision() const { return "f32/bf16/f16 in, widened exactly; f32 compute"; }
const Capabilities& Kernel::capabilities() const {
  static constexpr Capabilities kNone{};
  return kNone;
}
Arithmetic Kernel::arithmetic() const { return capabilities().arithmetic; }
const char* to_string(Arithmetic a) {
  switch (a) {
    case Arithmetic::Bf16Products: return "bf16_products";
    case Arithmetic::Int8Products: return "int8_products";
    case Arithmetic::Int8Bf16Products: return "int8_bf16_products";
    case Arithmetic::F32: break;
  }
  return "f32";
}
Support Kernel::supports(const Problem&) const { return Support::yes(); }
size_t Kernel::workspace_bytes(const Problem&, int) const { return 0; }
std::shared_ptr<const Plan> Kernel::make_plan(const Problem&) const { return nullptr; }
Support Kernel::backward_supports(const Problem&) const { return Support::yes(); }
size_t Kernel::backward_workspace_bytes(const Problem&, int) const { return 0; }
std::shared_ptr<const Plan> Kernel::make_backward_plan(const Problem&) const { return nullptr; }
void Kernel::run_backward(const Problem&, const Inputs&, const BackwardInputs&, const Gradients&, RunContext&) const {
  throw std::logic_error(std::string(name()) + ": run_backward called on a kernel without the backward pass");
}

namespace {
std::vector<const Kernel*> (*catalog)() = nullptr;
}  // namespace

void set_kernel_catalog(std::vector<const Kernel*> (*all)()) { catalog = all; }

std::string kernels_that(const std::function<bool(const Capabilities&)>& has) {
  std::string names;
  if (!catalog) return names;
  for (const Kernel* k : catalog()) {
    if (has(k->capabilities())) names += (names.empty() ? "" : ", ") + std::string(k->name());
  }
  return names;
}
std::string kernels_that(bool Capabilities::*has) {
  return kernels_that([has](const Capabilities& c) { return c.*has; });
}

namespace {

// The capabilities the session checks before a kernel's own supports(), one row each: whether the
// problem needs it, and the refusal's words around the kernels that have it.
struct Rule {
  bool Capabilities::*has;
  bool (*needs)(const Problem&);
  std::string (*what)(const Problem&);
  const char* tail;
};
const Rule kRules[] = {
    {&Capabilities::patterns, [](const Problem& p) { return p.sparse(); },
     [](const Problem&) { return std::string("a sparse pattern"); },
     " run them; this kernel takes interval masks only"},
    {&Capabilities::head_dim_v, [](const Problem& p) { return p.dim_v() != p.head_dim; },
     [](const Problem&) { return std::string("head_dim_v != head_dim"); },
     " run it; this kernel keeps one head_dim for Q, K and V"},
    {&Capabilities::score_mods, [](const Problem& p) { return p.score_mods(); },
     [](const Problem& p) { return "score modifications " + p.score_mod_name(); },
     " apply softcap, ALiBi and sink logits; this kernel takes plain scaled scores"},
    {&Capabilities::topk, [](const Problem& p) { return p.topk(); },
     [](const Problem& p) { return "topk_tokens " + std::to_string(p.topk_tokens); },
     " attend the pages a query's summary bounds rank first; this kernel reads every key"},
    {&Capabilities::kv_quant, [](const Problem& p) { return p.kv_quantized(); },
     [](const Problem& p) { return std::string("kv_dtype ") + to_string(p.kv_dtype); }, " read a quantized cache"},
    {&Capabilities::paged, [](const Problem& p) { return p.kv_paged(); },
     [](const Problem& p) { return "kv_block " + std::to_string(p.kv_block); }, " read a paged cache"},
};

}  // namespace

Support supports_problem(const Kernel& kernel, const Problem& problem) {
  const Capabilities c = kernel.capabilities();
  for (const Rule& r : kRules) {
    if (r.needs(problem) && !(c.*r.has))
      return Support::no(r.what(problem) + " (" + kernels_that(r.has) + r.tail + ")");
  }
  if (c.max_q_len > 0 && problem.q_len > c.max_q_len) {
    return Support::no("q_len " + std::to_string(problem.q_len) + " > " + std::to_string(c.max_q_len) + ": " +
                       std::string(kernel.name()) + " " + c.limit_note);
  }
  if (const int64_t d = std::max(problem.head_dim, problem.dim_v()); c.max_head_dim > 0 && d > c.max_head_dim) {
    return Support::no("head dim " + std::to_string(d) + " > " + std::to_string(c.max_head_dim) + ": " +
                       std::string(kernel.name()) + " takes head dims up to " + std::to_string(c.max_head_dim));
  }
  if (c.kv_int_codes_only && !(problem.kv_quantized() && kv_int_dot(problem.kv_dtype))) {
    return Support::no(std::string("kv_dtype ") + to_string(problem.kv_dtype) + ": " + std::string(kernel.name()) +
                       " multiplies integer codes (q8_0, q4_0, u8, u4); " +
                       kernels_that([](const Capabilities& k) { return k.kv_quant && !k.kv_int_codes_only; }) +
                       " run the others");
  }
  if (problem.pass != Pass::Forward) {
    if (Support b = backward_support(kernel, problem); !b) return b;
  }
  return kernel.supports(problem);
}

Support backward_support(const Kernel& kernel, const Problem& problem) {
  if (!kernel.capabilities().backward) {
    return Support::no("backward: " + std::string(kernel.name()) +
                       " has no backward pass; allowed: " + kernels_that(&Capabilities::backward));
  }
  if (problem.score_mods() && !kernel.capabilities().score_mods_backward) {
    const std::string have = kernels_that(&Capabilities::score_mods_backward);
    return Support::no("backward: score modifications " + problem.score_mod_name() + " (" +
                       (have.empty() ? std::string("no kernel's backward takes them yet") : "their backward: " + have) +
                       "; " + std::string(kernel.name()) + "'s takes plain scaled scores)");
  }
  if (problem.kv_quantized() || problem.kv_paged()) {
    try {
      check_backward_problem(problem);
    } catch (const InvalidInput& e) {
      return Support::no(e.what());
    }
  }
  if (Support s = kernel.backward_supports(problem); !s) return Support::no("backward: " + s.reason);
  return Support::yes();
}

Support fits_memory_budget(const Kernel& kernel, const Problem& problem, int threads, bool backward) {
  backward = backward || problem.pass != Pass::Forward;
  auto workspace = static_cast<int64_t>(kernel.workspace_bytes(problem, threads));
  int64_t tensors = tensor_bytes(problem);
  if (backward) {  // the larger workspace; dO (O's size) and float32 dQ, dK, dV
    workspace = std::max(workspace, static_cast<int64_t>(kernel.backward_workspace_bytes(problem, threads)));
    tensors += (problem.o_elems() + problem.q_elems() + problem.kv_elems() + problem.v_elems()) *
               static_cast<int64_t>(sizeof(float));
  }
  const std::string why = over_memory_budget(
      workspace + tensors, "workspace " + bytes_text(static_cast<double>(workspace)) + " + Q, K, V, O, LSE" +
                               (backward ? ", dO, dQ, dK, dV " : " ") + bytes_text(static_cast<double>(tensors)));
  return why.empty() ? Support::yes() : Support::no("memory: " + why);
}

Support can_run(const Kernel& kernel, const Problem& problem, int threads, bool backward) {
  if (Support a = kernel.available(); !a) return a;
  if (Support s = supports_problem(kernel, problem); !s) return s;
  if (backward && problem.pass == Pass::Forward) {
    if (Support b = backward_support(kernel, problem); !b) return b;
  }
  return fits_memory_budget(kernel, problem, threads, backward);
}

struct Session::Arena {
  tbb::task_arena arena;
  explicit Arena(int threads) : arena(threads) {}
};

Session::Session(const Kernel& kernel, const Problem& problem, int threads, bool backward)
    : kernel_(kernel),
      problem_(problem),
      threads_(threads),
      made_kv_len_(problem.kv_len),
      backward_(backward || problem.pass != Pass::Forward) {
  backward = backward_;
  problem_.validate();
  if (threads < 1 || threads > kMaxThreads) {  // a resolved count (thread_count: 0 means all cores before here)
    throw InvalidInput("threads: " + std::to_string(threads) + " is not allowed; allowed: 1 to " +
                       std::to_string(kMaxThreads));
  }
  if (Support a = kernel.available(); !a) {
    throw InvalidInput(std::string(kernel.name()) + " is not available: " + a.reason);
  }
  if (Support s = supports_problem(kernel, problem_); !s) {
    throw InvalidInput(std::string(kernel.name()) + " does not support " + problem_.describe() + ": " + s.reason);
  }
  if (backward) {
    if (Support s = backward_support(kernel, problem_); !s) {
      throw InvalidInput(std::string(kernel.name()) + " cannot run the backward of " + problem_.describe() + ": " +
                         s.reason);
    }
  }
  if (Support m = fits_memory_budget(kernel, problem_, threads, backward); !m) {
    throw InvalidInput(std::string(kernel.name()) + " cannot run " + problem_.describe() + ": " + m.reason);
  }
  workspace_size_ = kernel.workspace_bytes(problem_, threads);
  if (backward) workspace_size_ = std::max(workspace_size_, kernel.backward_workspace_bytes(problem_, threads));
  workspace_ = alloc_bytes(workspace_size_);
  plan_ = kernel.make_plan(problem_);
  if (backward) backward_plan_ = kernel.make_backward_plan(problem_);
  arena_ = std::make_unique<Arena>(threads);
}

Session::~Session() = default;

void Session::resize_kv(int64_t kv_len) {
  if (problem_.sparse() || !problem_.kv_lens.empty()) {
    throw InvalidInput(
        "resize_kv: the session's problem has a sparse pattern or kv_lens; allowed: interval masks only");
  }
  if (kv_len > made_kv_len_) {
    throw InvalidInput("kv_len: " + std::to_string(kv_len) + " is above the session's " + std::to_string(made_kv_len_) +
                       "; allowed: 1 to the kv_len the session was made for");
  }
  Problem p = problem_;
  p.kv_len = kv_len;
  p.validate();
  if (Support s = supports_problem(kernel_, p); !s) {
    throw InvalidInput(std::string(kernel_.name()) + " does not support " + p.describe() + ": " + s.reason);
  }
  if (kernel_.workspace_bytes(p, threads_) > workspace_size_) {
    throw InvalidInput("resize_kv: kv_len " + std::to_string(kv_len) +
                       " needs more workspace than the session has; "
                       "allowed: at most the kv_len the session was made for");
  }
  problem_ = p;
}

void Session::run(const Inputs& in, const Outputs& out, int timed_launches) {
  if (in.dtype != problem_.dtype) {  // a kernel would read views the inputs do not have
    throw InvalidInput(std::string("inputs: dtype ") + to_string(in.dtype) + " given to a " +
                       to_string(problem_.dtype) + " problem; allowed: the problem's dtype");
  }
  RunContext ctx{threads_, std::span<std::byte>(workspace_.get(), workspace_size_), plan_.get(), timed_launches};
  arena_->arena.execute([&] { kernel_.run(problem_, in, out, ctx); });
}

void Session::run_backward(const Inputs& in, const BackwardInputs& bw, const Gradients& g) {
  if (!backward_) throw std::logic_error("Session::run_backward: the session was not made for the backward pass");
  if (!bw.lse || !bw.o.data || !bw.d_o.data) {
    throw InvalidInput("backward: dO, O and the forward's LSE are all required; allowed: the forward's outputs");
  }
  if (in.dtype != problem_.dtype) {
    throw InvalidInput(std::string("inputs: dtype ") + to_string(in.dtype) + " given to a " +
                       to_string(problem_.dtype) + " problem; allowed: the problem's dtype");
  }
  RunContext ctx{threads_, std::span<std::byte>(workspace_.get(), workspace_size_), backward_plan_.get(), 0};
  arena_->arena.execute([&] { kernel_.run_backward(problem_, in, bw, g, ctx); });
}

}  // namespace attnlab
