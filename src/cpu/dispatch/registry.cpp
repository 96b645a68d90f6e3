// The registry, in ladder order: one line per single-build kernel; the SIMD kernels from the
// target tables (CMake's ATTN_SIMD_KERNELS, src/cpu/dispatch/target.hpp), once per built target
// (include/attnlab/isa.hpp), each variant wrapped so it names its target and is unavailable on
// a CPU that cannot run it.
#include <algorithm>
#include <memory>
#include <stdexcept>

#include "attnlab/isa.hpp"
#include "attnlab/kernel.hpp"
#include "cpu/dispatch/isa_internal.hpp"

namespace attnlab {

namespace cpu {
const Kernel& naive();
const Kernel& blocked();
}  // namespace cpu

namespace cuda {  // src/cuda/kernels.cpp: present in every build, available only with a GPU
const std::vector<const Kernel*>& kernels();
}  // namespace cuda

namespace {

// flash_bf16, flash_amx and flash_int8_amx in a build without the avx512_bf16 object (not x86-64, or
// ATTN_NATIVE): listed, never available.
class UnbuiltFlashBf16 final : public Kernel {
 public:
  explicit UnbuiltFlashBf16(const char* name, Arithmetic a = Arithmetic::Bf16Products)
      : name_(name), caps_{.arithmetic = a} {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override {
    return "flash with bf16 products (AVX512_BF16 vdpbf16ps; flash_amx: AMX-BF16 tiles; flash_int8_amx: AMX-INT8 "
           "scores, AMX-BF16 P.V)";
  }
  const Capabilities& capabilities() const override { return caps_; }
  Support available() const override {
    return Support::no(
        "not in this build: the avx512_bf16 object is built only by x86-64 builds with run-time "
        "dispatch (not ATTN_NATIVE)");
  }
  void run(const Problem&, const Inputs&, const Outputs&, RunContext&) const override {
    throw std::logic_error(std::string(name_) + ": not built");
  }

 private:
  const char* name_;
  Capabilities caps_;
};

// A SIMD kernel compiled for one target.
class TargetKernel final : public Kernel {
 public:
  TargetKernel(const Kernel& inner, std::string isa) : inner_(inner), isa_(std::move(isa)) {}
  std::string_view name() const override { return inner_.name(); }
  std::string_view description() const override { return inner_.description(); }
  std::string_view isa() const override { return isa_; }
  std::string_view precision() const override { return inner_.precision(); }
  const Capabilities& capabilities() const override { return inner_.capabilities(); }
  Support available() const override {
    if (!cpu_runs_isa(isa_)) return Support::no(cannot_run_reason(isa_));
    return inner_.available();
  }
  // The target's own code runs only on a CPU that has its instructions (a question about an
  // avx512 variant on an AVX2 CPU would die of SIGILL in its compiled checks).
  Support supports(const Problem& p) const override {
    if (!cpu_runs_isa(isa_)) return Support::no(cannot_run_reason(isa_));
    return inner_.supports(p);
  }
  size_t workspace_bytes(const Problem& p, int threads) const override {
    return cpu_runs_isa(isa_) ? inner_.workspace_bytes(p, threads) : 0;
  }
  std::shared_ptr<const Plan> make_plan(const Problem& p) const override {
    return cpu_runs_isa(isa_) ? inner_.make_plan(p) : nullptr;
  }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    inner_.run(p, in, out, ctx);
  }
  Support backward_supports(const Problem& p) const override {
    if (!cpu_runs_isa(isa_)) return Support::no(cannot_run_reason(isa_));
    return inner_.backward_supports(p);
  }
  size_t backward_workspace_bytes(const Problem& p, int threads) const override {
    return cpu_runs_isa(isa_) ? inner_.backward_workspace_bytes(p, threads) : 0;
  }
  void run_backward(const Problem& p, const Inputs& in, const BackwardInputs& bw, const Gradients& g,
                    RunContext& ctx) const override {
    inner_.run_backward(p, in, bw, g, ctx);
  }
  std::shared_ptr<const Plan> make_backward_plan(const Problem& p) const override {
    return cpu_runs_isa(isa_) ? inner_.make_backward_plan(p) : nullptr;
  }

 private:
  const Kernel& inner_;
  std::string isa_;
};

// One ladder entry: a single-build kernel, or the variants of a SIMD kernel (narrowest first).
struct Entry {
  std::vector<const Kernel*> variants;
};

const std::vector<Entry>& entries() {
  static const std::vector<Entry> e = [] {
    static std::vector<std::unique_ptr<TargetKernel>> owned;
    std::vector<Entry> list;
    list.push_back({{&cpu::naive()}});
    list.push_back({{&cpu::blocked()}});
    // One entry per SIMD kernel (CMake's ATTN_SIMD_KERNELS), a variant per built target.
    const auto& tables = target_tables();
    for (int i = 0; i < tables.front()->kernel_count; ++i) {
      Entry entry;
      for (const TargetTable* t : tables) {
        owned.push_back(std::make_unique<TargetKernel>(*t->kernels[i], t->isa));
        entry.variants.push_back(owned.back().get());
      }
      list.push_back(std::move(entry));
    }
    static const UnbuiltFlashBf16 unbuilt_bf16("flash_bf16"), unbuilt_amx("flash_amx"),
        unbuilt_int8_amx("flash_int8_amx", Arithmetic::Int8Bf16Products);
    if (const Bf16Table* bt = bf16_table()) {
      owned.push_back(std::make_unique<TargetKernel>(*bt->flash_bf16, kBf16Isa));
      list.push_back({{owned.back().get()}});
      owned.push_back(std::make_unique<TargetKernel>(*bt->flash_amx, kAmxIsa));
      list.push_back({{owned.back().get()}});
      owned.push_back(std::make_unique<TargetKernel>(*bt->flash_int8_amx, kAmxInt8Isa));
      list.push_back({{owned.back().get()}});
    } else {
      list.push_back({{&unbuilt_bf16}});
      list.push_back({{&unbuilt_amx}});
      list.push_back({{&unbuilt_int8_amx}});
    }
    for (const Kernel* k : cuda::kernels()) list.push_back({{k}});  // src/cuda/kernel_list.hpp
    return list;
  }();
  return e;
}

const Kernel* pick(const Entry& e, std::string_view isa) {
  if (e.variants.size() == 1) return e.variants.front();
  for (const Kernel* k : e.variants) {
    if (k->isa() == isa) return k;
  }
  // No variant for that target: the widest this CPU runs.
  for (auto it = e.variants.rbegin(); it != e.variants.rend(); ++it) {
    if (cpu_runs_isa((*it)->isa())) return *it;
  }
  return e.variants.front();
}

}  // namespace

std::vector<const Kernel*> registry() {
  const std::string isa = default_isa();
  std::vector<const Kernel*> r;
  for (const Entry& e : entries()) r.push_back(pick(e, isa));
  return r;
}

std::vector<const Kernel*> variants() {
  std::vector<const Kernel*> r;
  for (const Entry& e : entries()) r.insert(r.end(), e.variants.begin(), e.variants.end());
  return r;
}

// Refusals in attn_core name the kernels that can (kernels_that): this is their list.
[[maybe_unused]] const bool kCatalogSet = (set_kernel_catalog(&registry), true);

std::vector<std::string> kernel_isas(std::string_view name) {
  std::vector<std::string> r;
  for (const Entry& e : entries()) {
    if (e.variants.front()->name() != name) continue;
    for (const Kernel* k : e.variants) r.emplace_back(k->isa());
  }
  return r;
}

const Kernel* find_kernel(std::string_view name, std::string_view isa) {
  for (const Entry& e : entries()) {
    if (e.variants.front()->name() != name) continue;
    if (isa.empty()) return pick(e, default_isa());
    for (const Kernel* k : e.variants) {
      if (k->isa() == isa) return k;
    }
    return nullptr;
  }
  return nullptr;
}

bool is_per_target_isa(std::string_view kernel_isa) {
  const auto& built = built_isas();
  return std::find(built.begin(), built.end(), kernel_isa) != built.end();
}

std::string kernel_label(std::string_view name, std::string_view isa) {
  if (!is_per_target_isa(isa)) return std::string(name);
  return std::string(name) + "[" + std::string(isa) + "]";
}

std::string kernel_label(const Kernel& k) { return kernel_label(k.name(), k.isa()); }

std::string kernel_names() {
  std::string names;
  for (const Entry& e : entries()) {
    if (!names.empty()) names += ", ";
    names += e.variants.front()->name();
  }
  return names;
}

const Kernel& kernel_or_throw(std::string_view name, std::string_view isa) {
  if (const Kernel* k = find_kernel(name, isa)) return *k;
  if (find_kernel(name) == nullptr) {
    throw InvalidInput("impl: '" + std::string(name) + "' is not a kernel; allowed: " + kernel_names());
  }
  throw InvalidInput("isa: " + std::string(name) + " has no '" + std::string(isa) +
                     "' variant; allowed: " + isa_names(kernel_isas(name)));
}

}  // namespace attnlab
