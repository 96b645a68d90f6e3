// The CUDA kernels as registry entries, present in every build. With ATTN_HAS_CUDA they copy
// the host tensors to the device and run src/cuda/naive.cu or flash.cu there (runtime.cu);
// without it, or without a usable device, available() says why and `attnlab list` shows it.
#include <algorithm>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "attnlab/cuda.hpp"
#include "attnlab/kernel.hpp"
#include "cuda/host_args.hpp"
#include "cuda/kernel_list.hpp"

#if defined(ATTN_HAS_CUDA)
#include "cuda/runtime.hpp"
#endif

namespace attnlab::cuda_impl {

namespace {
template <class T>
void check_view(const char* name, const View4<T>& v) {
  if (v.stride_b < 0 || v.stride_h < 0 || v.stride_s < 0) {
    throw InvalidInput(std::string(name) +
                       ": negative strides are not supported by the CUDA "
                       "kernels; allowed: strides >= 0 (bhsd, bshd or sub-views of them)");
  }
  if (v.seq > 1 && v.stride_s < v.dim) {
    throw InvalidInput(std::string(name) + ": seq stride " + std::to_string(v.stride_s) +
                       " overlaps rows of head_dim " + std::to_string(v.dim) + "; allowed: seq stride >= head_dim");
  }
}
template <class T>
Strides strides_of(const View4<T>& v) {
  return {v.stride_b, v.stride_h, v.stride_s};
}
}  // namespace

DeviceArgs problem_args(const Problem& p) {
  DeviceArgs a;
  a.batch = p.batch;
  a.q_heads = p.q_heads;
  a.kv_heads = p.kv_heads;
  a.q_len = p.q_len;
  a.kv_len = p.kv_len;
  a.head_dim = p.head_dim;
  a.head_dim_v = p.dim_v();
  a.causal = p.causal;
  a.window_left = p.window_left;
  a.window_right = p.window_right;
  a.scale = p.effective_scale();
  a.dtype = p.dtype;
  a.sparse = p.sparse();
  a.kv = p.kv_dtype;
  a.kv_block = p.kv_block;
  a.table_len = p.kv_table_len();
  a.k_row_bytes = p.kv_row_bytes(p.head_dim);
  a.v_row_bytes = p.kv_row_bytes(p.dim_v());
  return a;
}

std::shared_ptr<const Plan> block_plan(const Problem& p, const KernelOps& ops) {
  if (!p.sparse()) return nullptr;
  const int64_t rows = ops.block_rows(problem_args(p));
  if (rows <= 0 || rows % p.group() != 0) return nullptr;  // unsupported() says why
  return std::make_shared<BlockPlan>(build_block_map(p, rows / p.group()));
}

void attach_plan(DeviceArgs& a, const Problem& p, const KernelOps& ops, const Plan* plan,
                 std::shared_ptr<const Plan>& keep) {
  if (!p.sparse()) return;
  // A plan for this kernel's block shape only (one query tile per thread block; no solo rows or
  // gathered columns, which the CUDA kernel does not run).
  const auto* made = dynamic_cast<const BlockPlan*>(plan);
  if (made &&
      (made->map.br * p.group() != ops.block_rows(a) || !made->map.solo.empty() || !made->map.gathered.empty())) {
    made = nullptr;
  }
  if (!made) {
    keep = block_plan(p, ops);
    made = dynamic_cast<const BlockPlan*>(keep.get());
  }
  if (!made) throw InvalidInput("a sparse pattern this CUDA kernel cannot run: " + std::string(ops.unsupported(a)));
  const BlockMap& m = made->map;
  a.map.start = m.start.data();
  a.map.entries = m.entries.data();
  a.map.bits = m.bits.data();
  a.map.row_empty = m.row_empty.data();
  a.map.query_tiles = m.query_tiles;
  a.map.variants_b = m.variants_b;
  a.map.variants_h = m.variants_h;
  a.map.n_start = static_cast<int64_t>(m.start.size());
  a.map.n_entries = static_cast<int64_t>(m.entries.size());
  a.map.n_bits = static_cast<int64_t>(m.bits.size());
  a.map.n_empty = static_cast<int64_t>(m.row_empty.size());
}

DeviceArgs device_args(const Problem& p, const Inputs& in, const Outputs& out) {
  check_view("o", out.o);
  DeviceArgs a = problem_args(p);
  visit_inputs(in, [&](const auto& t) {
    check_view("q", t.q);
    check_view("k", t.k);
    check_view("v", t.v);
    a.q = t.q.data;
    a.k = t.k.data;
    a.v = t.v.data;
    a.qs = strides_of(t.q);
    a.ks = strides_of(t.k);
    a.vs = strides_of(t.v);
  });
  if (in.kv != KvDType::Same) {  // K and V as rows of bytes
    check_view("k", in.kq);
    check_view("v", in.vq);
    a.k = in.kq.data;
    a.v = in.vq.data;
    a.ks = strides_of(in.kq);
    a.vs = strides_of(in.vq);
    a.kv_scale = in.kv_scale;
  }
  a.table = in.pages.table;
  a.dtype = in.dtype;
  a.o = out.o.data;
  a.lse = out.lse;
  a.kv_lens = p.kv_lens.empty() ? nullptr : p.kv_lens.data();
  a.os = strides_of(as_const(out.o));
  return a;
}

void attach_head_terms(DeviceArgs& a, const Problem& p, std::vector<float>& keep) {
  a.softcap = p.softcap;
  const bool sinks = !p.sink_logits.empty();
  keep.clear();
  if (p.has_alibi())
    for (int64_t h = 0; h < p.q_heads; ++h) keep.push_back(p.alibi_slope(h));
  if (sinks)
    for (int64_t h = 0; h < p.q_heads; ++h) keep.push_back(p.sink_logit(h));
  a.alibi = p.has_alibi() ? keep.data() : nullptr;
  a.sinks = sinks ? keep.data() + (p.has_alibi() ? p.q_heads : 0) : nullptr;
}

InputExtents input_extents(const Inputs& in) {
  InputExtents e;
  visit_inputs(in, [&](const auto& t) {
    e.q = span_elems(t.q);
    e.k = span_elems(t.k);
    e.v = span_elems(t.v);
  });
  if (in.kv != KvDType::Same) e.k = span_elems(in.kq), e.v = span_elems(in.vq);  // bytes
  return e;
}

}  // namespace attnlab::cuda_impl

namespace attnlab::cuda {

namespace {

std::mutex g_timing_mutex;
std::optional<Timing> g_last_timing;

constexpr const char* kBuiltWithout =
    "built without CUDA (reconfigure with nvcc available and -DATTN_ENABLE_CUDA=AUTO or ON)";

class CudaKernel final : public Kernel {
 public:
  // A row of kernel_list.hpp's list; ops: nullptr in a build without CUDA.
  CudaKernel(std::string_view name, std::string_view description, const cuda_impl::KernelOps* ops,
             std::string_view precision, Capabilities caps)
      : name_(name), description_(description), ops_(ops), precision_(precision), caps_(caps) {}
  const Capabilities& capabilities() const override { return caps_; }
  std::string_view precision() const override { return precision_.empty() ? Kernel::precision() : precision_; }
  std::shared_ptr<const Plan> make_plan(const Problem& p) const override {
    return ops_ ? cuda_impl::block_plan(p, *ops_) : nullptr;
  }
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return description_; }
  std::string_view isa() const override { return kIsa; }
  Support available() const override { return device_status(); }
  Support supports(const Problem& p) const override {
    if (!ops_) return Support::yes();  // unreachable: available() is no without CUDA
    const cuda_impl::DeviceArgs a = cuda_impl::problem_args(p);
    if (const char* why = ops_->unsupported(a); why && *why) return Support::no(why);
#if defined(ATTN_HAS_CUDA)
    if (auto d = device_info()) {
      const int64_t smem = ops_->smem_bytes(a);
      if (smem > d->smem_per_block_optin) {
        return Support::no("needs " + std::to_string(smem) +
                           " B of shared memory per block at "
                           "head_dim " +
                           std::to_string(std::max(p.head_dim, p.dim_v())) + "; the device allows " +
                           std::to_string(d->smem_per_block_optin));
      }
    }
#endif
    return Support::yes();
  }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
#if defined(ATTN_HAS_CUDA)
    cuda_impl::DeviceArgs a = cuda_impl::device_args(p, in, out);
    std::shared_ptr<const Plan> keep;
    cuda_impl::attach_plan(a, p, *ops_, ctx.plan, keep);
    std::vector<float> head_terms;
    cuda_impl::attach_head_terms(a, p, head_terms);
    const cuda_impl::InputExtents in_ext = cuda_impl::input_extents(in);
    cuda_dev::Extents ext;
    ext.q = in_ext.q;
    ext.k = in_ext.k;
    ext.v = in_ext.v;
    ext.o = cuda_impl::span_elems(out.o);
    ext.o_dense = ext.o == out.o.elems();
    ext.lse = p.lse_elems();
    Timing t;
    cuda_dev::run(*ops_, a, ext, t, ctx.timed_launches);
    std::lock_guard<std::mutex> lock(g_timing_mutex);
    g_last_timing = t;
#else
    (void)p, (void)in, (void)out, (void)ctx;
    throw InvalidInput(std::string(name_) + " is not available: " + kBuiltWithout);
#endif
  }

 private:
  std::string_view name_, description_;
  const cuda_impl::KernelOps* ops_;
  std::string_view precision_;
  Capabilities caps_;
};

#if defined(ATTN_HAS_CUDA)
#define ATTN_CUDA_DEV_OPS(id) &cuda_dev::id##_ops
#else
#define ATTN_CUDA_DEV_OPS(id) nullptr
#endif

}  // namespace

const std::vector<const Kernel*>& kernels() {
#define ATTN_CUDA_ENTRY(id, description, precision, caps, sms) \
  CudaKernel("cuda_" #id, description, ATTN_CUDA_DEV_OPS(id), precision, caps),
  static const CudaKernel all[] = {ATTN_CUDA_KERNELS(ATTN_CUDA_ENTRY)};
#undef ATTN_CUDA_ENTRY
  static const std::vector<const Kernel*> list = [] {
    std::vector<const Kernel*> v;
    for (const CudaKernel& k : all) v.push_back(&k);
    return v;
  }();
  return list;
}

namespace {
const Kernel& by_name(std::string_view name) {
  for (const Kernel* k : kernels())
    if (k->name() == name) return *k;
  throw std::logic_error("no CUDA kernel " + std::string(name) + " in src/cuda/kernel_list.hpp");
}
}  // namespace

const Kernel& naive() { return by_name("cuda_naive"); }
const Kernel& flash() { return by_name("cuda_flash"); }
const Kernel& flash_bf16() { return by_name("cuda_flash_bf16"); }
const Kernel& decode() { return by_name("cuda_decode"); }

Support device_status() {
#if defined(ATTN_HAS_CUDA)
  const std::string& why = cuda_dev::unavailable_reason();
  return why.empty() ? Support::yes() : Support::no(why);
#else
  return Support::no(kBuiltWithout);
#endif
}

bool is_cuda_kernel(const Kernel& k) {
  const auto& all = kernels();
  return std::find(all.begin(), all.end(), &k) != all.end();
}

std::optional<DeviceInfo> device_info() {
#if defined(ATTN_HAS_CUDA)
  return cuda_dev::info();
#else
  return std::nullopt;
#endif
}

std::string DeviceInfo::describe() const {
  std::ostringstream s;
  s.precision(3);
  s << name << " (sm_" << cc_major << cc_minor << ", " << sm_count << " SMs, " << clock_ghz << " GHz, FP32 peak "
    << fp32_peak_tflops << " TFLOP/s, bf16 tensor peak " << bf16_tensor_peak_tflops << " TFLOP/s, " << mem_bandwidth_gbs
    << " GB/s nominal, " << global_mem_bytes / (1024 * 1024 * 1024) << " GiB)";
  return s.str();
}

std::optional<Timing> last_timing() {
  std::lock_guard<std::mutex> lock(g_timing_mutex);
  return g_last_timing;
}

Timing time_launches(Session& s, const Inputs& in, const Outputs& out, int launches) {
  if (!is_cuda_kernel(s.kernel())) {
    throw InvalidInput("time_launches: '" + std::string(s.kernel().name()) +
                       "' is not a CUDA kernel; allowed: cuda_naive, cuda_flash, cuda_flash_bf16, cuda_decode");
  }
  if (launches < 1) throw InvalidInput("launches: " + std::to_string(launches) + " is not allowed; allowed: >= 1");
  s.run(in, out, launches);
  return *last_timing();
}

Bandwidth measure_bandwidth(double bytes, int reps) {
#if defined(ATTN_HAS_CUDA)
  return cuda_dev::measure_bandwidth(bytes, reps);
#else
  (void)bytes, (void)reps;
  throw std::runtime_error(std::string("measure_bandwidth: ") + kBuiltWithout);
#endif
}

void release_device_memory() {
#if defined(ATTN_HAS_CUDA)
  cuda_dev::release();
#endif
}

}  // namespace attnlab::cuda
