// The registry: one line per implementation, in ladder order.
#include <tbb/task_arena.h>

#include "attnlab/kernel.hpp"
#include "attnlab/limits.hpp"

namespace attnlab {

namespace cpu {
const Kernel& naive();
const Kernel& blocked();
const Kernel& simd();
const Kernel& threaded();
const Kernel& flash();
const Kernel& decode();
}  // namespace cpu

namespace cuda {  // src/cuda/kernels.cpp: present in every build, available only with a GPU
const Kernel& naive();
const Kernel& flash();
}  // namespace cuda

const std::vector<const Kernel*>& registry() {
  static const std::vector<const Kernel*> kernels = {
      &cpu::naive(),
      &cpu::blocked(),
      &cpu::simd(),
      &cpu::threaded(),
      &cpu::flash(),
      &cpu::decode(),
      &cuda::naive(),
      &cuda::flash(),
  };
  return kernels;
}

const Kernel* find_kernel(std::string_view name) {
  for (const Kernel* k : registry()) {
    if (k->name() == name) return k;
  }
  return nullptr;
}

std::string kernel_names() {
  std::string names;
  for (const Kernel* k : registry()) {
    if (!names.empty()) names += ", ";
    names += k->name();
  }
  return names;
}

const Kernel& kernel_or_throw(std::string_view name) {
  if (const Kernel* k = find_kernel(name)) return *k;
  throw InvalidInput("impl: '" + std::string(name) + "' is not a kernel; allowed: " +
                     kernel_names());
}

Support fits_memory_budget(const Kernel& kernel, const Problem& problem, int threads) {
  const auto workspace = static_cast<int64_t>(kernel.workspace_bytes(problem, threads));
  const int64_t tensors = tensor_bytes(problem);
  const std::string why = over_memory_budget(
      workspace + tensors, "workspace " + bytes_text(static_cast<double>(workspace)) +
                               " + Q, K, V, O, LSE " + bytes_text(static_cast<double>(tensors)));
  return why.empty() ? Support::yes() : Support::no("memory: " + why);
}

Support can_run(const Kernel& kernel, const Problem& problem, int threads) {
  if (Support a = kernel.available(); !a) return a;
  if (Support s = kernel.supports(problem); !s) return s;
  return fits_memory_budget(kernel, problem, threads);
}

Session::Session(const Kernel& kernel, const Problem& problem, int threads)
    : kernel_(kernel), problem_(problem), threads_(threads) {
  problem_.validate();
  if (threads < 1 || threads > 1024) {
    throw InvalidInput("threads: " + std::to_string(threads) +
                       " is not allowed; allowed: 1 to 1024");
  }
  if (Support a = kernel.available(); !a) {
    throw InvalidInput(std::string(kernel.name()) + " is not available: " + a.reason);
  }
  if (Support s = kernel.supports(problem_); !s) {
    throw InvalidInput(std::string(kernel.name()) + " does not support " + problem_.describe() +
                       ": " + s.reason);
  }
  if (Support m = fits_memory_budget(kernel, problem_, threads); !m) {
    throw InvalidInput(std::string(kernel.name()) + " cannot run " + problem_.describe() + ": " +
                       m.reason);
  }
  workspace_size_ = kernel.workspace_bytes(problem_, threads);
  workspace_ = alloc_bytes(workspace_size_);
  arena_ = std::make_unique<tbb::task_arena>(threads);
}

Session::~Session() = default;

void Session::run(const Inputs& in, const Outputs& out) {
  RunContext ctx{threads_, std::span<std::byte>(workspace_.get(), workspace_size_)};
  arena_->execute([&] { kernel_.run(problem_, in, out, ctx); });
}

}  // namespace attnlab
