#include "attnlab/tensor.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "attnlab/limits.hpp"

namespace attnlab {

void AlignedFree::operator()(void* p) const { std::free(p); }

namespace {
constexpr size_t kHugeFrom = size_t{4} << 20;  // numpy's threshold for the same advice

// allocated_bytes(count), 64-byte aligned, contents undefined; from 4 MiB on advised as
// huge-page memory (the whole 4 KiB pages inside it: the kernel backs each 2 MiB-aligned
// stretch of them with one huge page).
std::byte* alloc_lines(size_t count, size_t* rounded) {
  *rounded = allocated_bytes(count);
  if (*rounded < count) throw std::bad_alloc();
  void* p = std::aligned_alloc(64, *rounded);
  if (!p) throw std::bad_alloc();
#if defined(MADV_HUGEPAGE)
  if (*rounded >= kHugeFrom) {
    const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
    const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + *rounded) / page * page;
    if (page > 0 && b > a) ::madvise(reinterpret_cast<void*>(a), b - a, MADV_HUGEPAGE);  // advice only
  }
#endif
  return static_cast<std::byte*>(p);
}
}  // namespace

size_t allocated_bytes(size_t count) {
  return count == 0 ? 64 : (count + 63) / 64 * 64;  // wraps near SIZE_MAX: alloc_lines refuses that
}

std::unique_ptr<std::byte[], AlignedFree> alloc_bytes(size_t count) {
  size_t rounded = 0;
  std::byte* p = alloc_lines(count, &rounded);
  std::memset(p, 0, rounded);
  return std::unique_ptr<std::byte[], AlignedFree>(p);
}

FloatBuffer::FloatBuffer(size_t count) : n_(count) {
  if (count > SIZE_MAX / sizeof(float)) throw std::bad_alloc();
  size_t rounded = 0;
  data_ = reinterpret_cast<float*>(alloc_lines(count * sizeof(float), &rounded));
  release_ = [p = data_] { std::free(p); };
}

FloatBuffer::FloatBuffer(float* data, size_t count, std::function<void()> release)
    : data_(data), n_(count), release_(std::move(release)) {}

FloatBuffer& FloatBuffer::operator=(FloatBuffer&& other) noexcept {
  if (this != &other) {
    if (release_) release_();
    data_ = std::exchange(other.data_, nullptr);
    n_ = std::exchange(other.n_, 0);
    release_ = std::exchange(other.release_, nullptr);
  }
  return *this;
}

FloatBuffer::~FloatBuffer() {
  if (release_) release_();
}

int64_t tensor_bytes(const Problem& p) {
  const int64_t rows = p.batch * p.kv_heads * p.kv_len;
  const int64_t in =
      p.q_elems() * dtype_bytes(p.dtype) + rows * (p.kv_row_bytes(p.head_dim) + p.kv_row_bytes(p.dim_v()));
  return in + (p.o_elems() + p.lse_elems()) * int64_t{sizeof(float)};
}

std::unique_ptr<float[], AlignedFree> alloc_floats(size_t count) {
  auto bytes = alloc_bytes(count * sizeof(float));
  return std::unique_ptr<float[], AlignedFree>(reinterpret_cast<float*>(bytes.release()));
}

Tensors allocate_outputs(const Problem& p) {
  Tensors t;
  t.o = alloc_floats(p.o_elems());
  t.lse = alloc_floats(p.lse_elems());
  t.outputs.o = make_view<float>(t.o.get(), p.batch, p.q_heads, p.q_len, p.dim_v(), p.layout);
  t.outputs.lse = t.lse.get();
  return t;
}

Tensors allocate_tensors(const Problem& p) {
  if (const std::string why = over_memory_budget(tensor_bytes(p), "Q, K, V, O, LSE"); !why.empty()) {
    throw InvalidInput("tensors of " + p.describe() + ": " + why);
  }
  Tensors t = allocate_outputs(p);
  t.inputs.dtype = p.dtype;
  if (p.kv_quantized()) {  // Q float32 (validate), K and V rows of bytes
    t.q = alloc_floats(p.q_elems());
    t.inputs.q = make_view<const float>(t.q.get(), p.batch, p.q_heads, p.q_len, p.head_dim, p.layout);
    const auto rows = [&](std::unique_ptr<std::byte[], AlignedFree>& buf, int64_t dim) {
      const int64_t bytes = p.kv_row_bytes(dim);
      buf = alloc_bytes(static_cast<size_t>(p.batch * p.kv_heads * p.kv_len * bytes));
      return make_view<const std::byte>(buf.get(), p.batch, p.kv_heads, p.kv_len, bytes, p.layout);
    };
    t.inputs.kv = p.kv_dtype;
    t.inputs.kq = rows(t.kq, p.head_dim);
    t.inputs.vq = rows(t.vq, p.dim_v());
    return t;
  }
  if (p.dtype == DType::F32) {
    t.q = alloc_floats(p.q_elems());
    t.k = alloc_floats(p.kv_elems());
    t.v = alloc_floats(p.v_elems());
    t.inputs.q = make_view<const float>(t.q.get(), p.batch, p.q_heads, p.q_len, p.head_dim, p.layout);
    t.inputs.k = make_view<const float>(t.k.get(), p.batch, p.kv_heads, p.kv_len, p.head_dim, p.layout);
    t.inputs.v = make_view<const float>(t.v.get(), p.batch, p.kv_heads, p.kv_len, p.dim_v(), p.layout);
    return t;
  }
  const auto u16 = [](const std::unique_ptr<std::byte[], AlignedFree>& b) {
    return reinterpret_cast<const uint16_t*>(b.get());
  };
  t.q16 = alloc_bytes(2 * static_cast<size_t>(p.q_elems()));
  t.k16 = alloc_bytes(2 * static_cast<size_t>(p.kv_elems()));
  t.v16 = alloc_bytes(2 * static_cast<size_t>(p.v_elems()));
  t.inputs.q16 = make_view<const uint16_t>(u16(t.q16), p.batch, p.q_heads, p.q_len, p.head_dim, p.layout);
  t.inputs.k16 = make_view<const uint16_t>(u16(t.k16), p.batch, p.kv_heads, p.kv_len, p.head_dim, p.layout);
  t.inputs.v16 = make_view<const uint16_t>(u16(t.v16), p.batch, p.kv_heads, p.kv_len, p.dim_v(), p.layout);
  return t;
}

namespace {
// dst (dense, E) = src (float32, any strides), element by element.
template <class E>
void store_as(const ConstView& src, const View4<const E>& dst) {
  for (int64_t b = 0; b < src.batch; ++b)
    for (int64_t h = 0; h < src.heads; ++h)
      for (int64_t s = 0; s < src.seq; ++s) {
        const float* x = src.row(b, h, s);
        E* y = const_cast<E*>(dst.row(b, h, s));
        for (int64_t d = 0; d < src.dim; ++d) y[d] = from_float<E>(x[d]);
      }
}
}  // namespace

namespace {
// Each row of src (float32, any strides) written into dst's row of bytes by kv_quant.hpp's rule.
void quantize_rows(KvDType type, float scale, const ConstView& src, const View4<const std::byte>& dst) {
  for (int64_t b = 0; b < src.batch; ++b)
    for (int64_t h = 0; h < src.heads; ++h)
      for (int64_t s = 0; s < src.seq; ++s)
        quantize_row(type, src.row(b, h, s), src.dim, const_cast<std::byte*>(dst.row(b, h, s)), scale);
}
void dequantize_rows(KvDType type, float scale, const View4<const std::byte>& src, const MutView& dst) {
  for (int64_t b = 0; b < dst.batch; ++b)
    for (int64_t h = 0; h < dst.heads; ++h)
      for (int64_t s = 0; s < dst.seq; ++s) dequantize_row(type, src.row(b, h, s), dst.dim, dst.row(b, h, s), scale);
}
}  // namespace

Inputs dequantize_kv_into(const Problem& p, const Inputs& in, float* k, float* v) {
  const MutView kd = make_view<float>(k, p.batch, p.kv_heads, p.kv_len, p.head_dim, p.layout);
  const MutView vd = make_view<float>(v, p.batch, p.kv_heads, p.kv_len, p.dim_v(), p.layout);
  dequantize_rows(in.kv, in.kv_scale, in.kq, kd);
  dequantize_rows(in.kv, in.kv_scale, in.vq, vd);
  Inputs out;
  out.q = in.q;
  out.k = make_view<const float>(k, p.batch, p.kv_heads, p.kv_len, p.head_dim, p.layout);
  out.v = make_view<const float>(v, p.batch, p.kv_heads, p.kv_len, p.dim_v(), p.layout);
  return out;
}

DequantizedKv dequantize_kv(const Problem& p, const Inputs& in) {
  DequantizedKv d;
  d.problem = p;
  d.problem.kv_dtype = KvDType::Same;
  d.k = alloc_floats(static_cast<size_t>(p.kv_elems()));
  d.v = alloc_floats(static_cast<size_t>(p.v_elems()));
  d.inputs = dequantize_kv_into(p, in, d.k.get(), d.v.get());
  return d;
}

Tensors convert_inputs(const Problem& p, const Inputs& f32) {
  Tensors t = allocate_tensors(p);
  if (p.kv_quantized()) {
    store_as(f32.q, t.inputs.q);
    quantize_rows(p.kv_dtype, t.inputs.kv_scale, f32.k, t.inputs.kq);
    quantize_rows(p.kv_dtype, t.inputs.kv_scale, f32.v, t.inputs.vq);
    return t;
  }
  visit_inputs(t.inputs, [&](const auto& dst) {
    store_as(f32.q, dst.q);
    store_as(f32.k, dst.k);
    store_as(f32.v, dst.v);
  });
  return t;
}

namespace {
// splitmix64: tiny, well mixed, identical everywhere.
uint64_t next(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

void fill_uniform(float* x, int64_t n, uint64_t seed) {
  uint64_t s = seed;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(static_cast<double>(next(s) >> 40) / double(1ull << 23) - 1.0);
  }
}

Tensors random_tensors(const Problem& p, uint64_t seed) {
  Problem f = p;
  f.dtype = DType::F32;
  f.kv_dtype = KvDType::Same;
  Tensors t = allocate_tensors(f);
  fill_uniform(t.q.get(), p.q_elems(), seed * 3 + 1);
  fill_uniform(t.k.get(), p.kv_elems(), seed * 3 + 2);
  fill_uniform(t.v.get(), p.v_elems(), seed * 3 + 3);
  return p.dtype == DType::F32 && !p.kv_quantized() ? std::move(t) : convert_inputs(p, t.inputs);
}

}  // namespace attnlab
