// Helpers shared by the tests.
#pragma once

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnlab/kernel.hpp"
#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"
#include "attnlab/verify.hpp"
#include "peaks/peak.hpp"  // is_per_target_isa

namespace attnlab::test {

// A variant's name in test names: "flash_avx2" for the SIMD kernels (one variant per
// built target, include/attnlab/isa.hpp), the plain name for single-build kernels.
inline std::string variant_name(const Kernel& k) {
  if (!is_per_target_isa(k.isa())) return std::string(k.name());
  return std::string(k.name()) + "_" + std::string(k.isa());
}

// A test kernel that is `inner` in every respect but run() (a planted bug around it): its name,
// target, capabilities, support, workspace and plan are inner's.
class Wrapped : public Kernel {
 public:
  explicit Wrapped(const Kernel& inner) : inner_(inner) {}
  std::string_view name() const override { return inner_.name(); }
  std::string_view description() const override { return "a planted bug around a kernel"; }
  std::string_view isa() const override { return inner_.isa(); }
  Support available() const override { return inner_.available(); }
  const Capabilities& capabilities() const override { return inner_.capabilities(); }
  Support supports(const Problem& p) const override { return inner_.supports(p); }
  size_t workspace_bytes(const Problem& p, int threads) const override { return inner_.workspace_bytes(p, threads); }
  Support backward_supports(const Problem& p) const override { return inner_.backward_supports(p); }
  size_t backward_workspace_bytes(const Problem& p, int threads) const override {
    return inner_.backward_workspace_bytes(p, threads);
  }
  std::shared_ptr<const Plan> make_plan(const Problem& p) const override { return inner_.make_plan(p); }

 protected:
  const Kernel& inner_;
};

// Sets an environment variable for a scope, restoring its previous value (or absence) after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* v = std::getenv(name)) had_ = true, saved_ = v;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { had_ ? setenv(name_, saved_.c_str(), 1) : unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string saved_;
};

// The storage dtype a kernel is tested at when a test does not range over dtypes: bf16 for
// the kernels that compute on bf16 only (flash_bf16), else f32.
inline DType native_dtype(const Kernel& k) {
  return k.arithmetic() == Arithmetic::Bf16Products ? DType::BF16 : DType::F32;
}

// The dtype a grid case of storage `dtype` runs at for kernel k, or nullopt when k skips it:
// a bf16-only kernel runs the float32 cases at bf16 (their inputs rounded) and the bf16 ones,
// not the f16 ones. Every other kernel runs each case as it is.
inline std::optional<DType> case_dtype(const Kernel& k, DType dtype) {
  if (native_dtype(k) == DType::F32) return dtype;
  if (dtype == DType::F16) return std::nullopt;
  return DType::BF16;
}

#if defined(ATTNLAB_EXE)
// The attnlab executable the CLI tests run: $ATTNLAB_EXE when set (the GPU bundle's copy, whose
// build folder does not exist where it runs), else the one built beside these tests.
inline std::string attnlab_exe() {
  const char* e = std::getenv("ATTNLAB_EXE");
  return e && *e ? e : ATTNLAB_EXE;
}
#endif

// One results.csv line into its fields (quotes as csv_field writes them: "" inside quotes).
inline std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '"' && quoted && i + 1 < line.size() && line[i + 1] == '"') {
      fields.back() += c;
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  return fields;
}

inline Problem shape(int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d) {
  Problem p;
  p.batch = b, p.q_heads = hq, p.kv_heads = hkv, p.q_len = sq, p.kv_len = sk, p.head_dim = d;
  return p;
}

// Small grids: sanitizer builds (ATTN_TEST_SMALL defined by CMake, so test discovery and
// test runs see the same list) or ATTN_TEST_SMALL=1 in the environment (ad hoc runs).
inline bool small_mode() {
#ifdef ATTN_TEST_SMALL
  return true;
#else
  const char* s = std::getenv("ATTN_TEST_SMALL");
  return s && std::string(s) == "1";
#endif
}

// Every variant of kernel `name` this CPU runs (one per built target for the SIMD kernels).
inline std::vector<const Kernel*> runnable(std::string_view name) {
  std::vector<const Kernel*> out;
  for (const Kernel* k : variants()) {
    if (k->name() == name && k->available()) out.push_back(k);
  }
  return out;
}

// k against the float64 reference on every row of p, under its arithmetic's tolerance.
inline KernelCheck check_all_rows(const Kernel& k, const Problem& p, const Tensors& t, int threads = 2) {
  const Agreement a = prepare_agreement(p, t.inputs, all_rows(p));
  return check_kernel(k, p, t.inputs, a, threads);
}

}  // namespace attnlab::test
