// Strided 4-D views (batch, heads, seq, head_dim) with the last dimension contiguous.
// The same view type covers BHSD and BSHD memory: only the strides differ.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

#include "attnlab/blocks/kv_page.hpp"
#include "attnlab/problem.hpp"

namespace attnlab {

struct KvSummary;  // kv_summary.hpp

template <class T>
struct View4 {
  T* data = nullptr;
  int64_t batch = 0, heads = 0, seq = 0, dim = 0;
  int64_t stride_b = 0, stride_h = 0, stride_s = 0;  // in elements; stride_d == 1

  T* row(int64_t b, int64_t h, int64_t s) const { return data + b * stride_b + h * stride_h + s * stride_s; }
  int64_t elems() const { return batch * heads * seq * dim; }
};

using ConstView = View4<const float>;
using MutView = View4<float>;

// Strides of a densely packed tensor in the given layout.
template <class T>
View4<T> make_view(T* data, int64_t batch, int64_t heads, int64_t seq, int64_t dim, Layout layout) {
  View4<T> v{data, batch, heads, seq, dim, 0, 0, 0};
  if (layout == Layout::BHSD) {
    v.stride_s = dim;
    v.stride_h = seq * dim;
    v.stride_b = heads * seq * dim;
  } else {
    v.stride_h = dim;
    v.stride_s = heads * dim;
    v.stride_b = seq * heads * dim;
  }
  return v;
}

template <class T>
View4<const T> as_const(const View4<T>& v) {
  return {v.data, v.batch, v.heads, v.seq, v.dim, v.stride_b, v.stride_h, v.stride_s};
}

// A paged cache's block table (Problem::kv_block > 0): sequence b's key j lives in pool block
// table[b * table_len + j / block], at row j % block of it. The K and V views then describe the
// pool: View4::batch = its blocks, seq = block. Entries past a sequence's length are -1.
struct KvPages {
  const int32_t* table = nullptr;  // nullptr: a contiguous cache
  int64_t table_len = 0;           // entries per batch entry
  int64_t block = 0;               // tokens per block
  int64_t pool_blocks = 0;
};

// The order in which the lab hands out a pool's blocks: a fixed shuffle (splitmix64 Fisher-Yates),
// so no sequence's blocks lie adjacent or in order (its own paged caches and generate's).
std::vector<int32_t> scattered_pool_order(int64_t blocks);

// Row j of sequence b, kv head h of a K or V view: the one rule for where a cache row lives.
template <class T>
inline __attribute__((always_inline)) T* kv_row(const View4<T>& v, const KvPages& pg, int64_t b, int64_t h, int64_t j) {
  if (!pg.table) return v.row(b, h, j);
  const PageSlot at = page_slot(pg.table, pg.table_len, pg.block, b, j);
  return v.row(at.block, h, at.slot);
}

// Q, K and V in their storage dtype: float32 in q, k, v (dtype F32), or the 16-bit
// patterns in q16, k16, v16 (dtype BF16 or F16; the float views are then empty).
struct Inputs {
  ConstView q, k, v;
  DType dtype = DType::F32;
  View4<const uint16_t> q16, k16, v16;
  // A quantized cache (Problem::kv_dtype, kv_quant.hpp; Q in q, float32): K and V as one row of
  // bytes per (batch, kv head, token), View4::dim = the row's bytes, strides in bytes;
  // kv_scale = the fp8 layouts' per-tensor scale.
  KvDType kv = KvDType::Same;
  View4<const std::byte> kq, vq;
  float kv_scale = 1.0f;
  KvPages pages;  // a paged cache: the K and V views above are its pool
  // The cache's page summaries (kv_summary.hpp), which a query-aware sparse decode
  // (Problem::topk_tokens) ranks the pages by; nullptr: none kept.
  const KvSummary* summary = nullptr;
};

// Inputs over memory the caller owns (numpy arrays, a KV cache) holding `dtype` elements: each
// view gives the sizes and element strides (View4<const void>: geometry only), read as float32
// for f32 and as 16-bit patterns for bf16/f16.
inline Inputs inputs_over(DType dtype, const View4<const void>& q, const View4<const void>& k,
                          const View4<const void>& v) {
  const auto as = [](auto tag, const View4<const void>& g) {
    using T = decltype(tag);
    return View4<const T>{
        static_cast<const T*>(g.data), g.batch, g.heads, g.seq, g.dim, g.stride_b, g.stride_h, g.stride_s};
  };
  Inputs in;
  in.dtype = dtype;
  if (dtype == DType::F32) {
    in.q = as(float{}, q), in.k = as(float{}, k), in.v = as(float{}, v);
  } else {
    in.q16 = as(uint16_t{}, q), in.k16 = as(uint16_t{}, k), in.v16 = as(uint16_t{}, v);
  }
  return in;
}

template <class E>
struct TypedInputs {
  View4<const E> q, k, v;
  KvPages pages;
};

// (Always inlined, like dtype.hpp's conversions: per-target code calls them.)
template <class E, class S>
inline __attribute__((always_inline)) View4<const E> retype(const View4<const S>& s) {
  static_assert(sizeof(E) == sizeof(S));
  return {reinterpret_cast<const E*>(s.data), s.batch, s.heads, s.seq, s.dim, s.stride_b, s.stride_h, s.stride_s};
}

// The inputs as views of their storage type E (float, bf16 or f16); E must be in.dtype's.
template <class E>
inline __attribute__((always_inline)) TypedInputs<E> typed(const Inputs& in) {
  if constexpr (std::is_same_v<E, float>) {
    return {in.q, in.k, in.v, in.pages};
  } else {
    return {retype<E>(in.q16), retype<E>(in.k16), retype<E>(in.v16), in.pages};
  }
}

// f(TypedInputs<E>) with E the storage type of in.dtype: how a kernel reaches its
// element-type template.
template <class F>
decltype(auto) visit_inputs(const Inputs& in, F&& f) {
  return visit_dtype(in.dtype, [&](auto e) -> decltype(auto) { return f(typed<decltype(e)>(in)); });
}

struct Outputs {
  MutView o;             // same shape and layout as q
  float* lse = nullptr;  // optional, contiguous (batch, q_heads, q_len)
};

// 64-byte aligned storage, zero-initialised. Buffers of 4 MiB and more are advised to the
// kernel as huge-page memory (madvise MADV_HUGEPAGE, what numpy does for its large arrays, so
// the lab's tensors and a peer's numpy inputs are backed alike; honoured unless transparent
// huge pages are "never", machine.json says which): strided rows (bshd, a dilated phase's
// every D-th row) then cost no TLB miss per row. Measured on an AVX-512 Xeon, transparent
// huge pages "madvise": causal window 512 bshd 1.06-1.07x, dilated 1.05x, Longformer 1.04x,
// contiguous bhsd dense and window 0.98-1.01x (results/2026-12-02-ab, ab17).
struct AlignedFree {
  void operator()(void* p) const;
};
// What alloc_bytes(count) takes: whole 64-byte lines. The memory estimates (sweep points,
// verification) count buffers with it.
size_t allocated_bytes(size_t count);
std::unique_ptr<float[], AlignedFree> alloc_floats(size_t count);
std::unique_ptr<std::byte[], AlignedFree> alloc_bytes(size_t count);

// Owned 64-byte aligned floats (move-only): either allocated here and left uninitialised,
// for data about to be overwritten whole, or adopted memory such as a file mapping, which
// `release` gives back.
class FloatBuffer {
 public:
  FloatBuffer() = default;
  explicit FloatBuffer(size_t count);
  FloatBuffer(float* data, size_t count, std::function<void()> release);
  FloatBuffer(FloatBuffer&& other) noexcept { *this = std::move(other); }
  FloatBuffer& operator=(FloatBuffer&& other) noexcept;
  ~FloatBuffer();
  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  float& operator[](size_t i) { return data_[i]; }
  const float& operator[](size_t i) const { return data_[i]; }
  const float* begin() const { return data_; }
  const float* end() const { return data_ + n_; }

 private:
  float* data_ = nullptr;
  size_t n_ = 0;
  std::function<void()> release_;
};

// Owned Q, K, V, O, LSE for a problem, in the problem's layout; Q, K, V in the problem's
// dtype (float32 in q, k, v; 16-bit patterns in q16, k16, v16).
struct Tensors {
  std::unique_ptr<float[], AlignedFree> q, k, v, o, lse;
  std::unique_ptr<std::byte[], AlignedFree> q16, k16, v16;
  std::unique_ptr<std::byte[], AlignedFree> kq, vq;  // a quantized cache's rows
  std::vector<int32_t> table;                        // a paged cache's block table
  std::shared_ptr<KvSummary> summary;                // Problem::topk: the cache's page summaries
  Inputs inputs;
  Outputs outputs;
};
// V's views set to the first p.dim_v() columns of K's rows (Problem::kv_shared): K's storage.
void share_v_with_k(const Problem& p, Inputs& in);

// Throws InvalidInput when tensor_bytes(p) exceed the memory budget (limits.hpp). A shared V
// (kv_shared) is K's storage. A paged
// problem gets its pool and a block table whose blocks are scattered over the pool (a fixed
// shuffle: sequence b's blocks are neither adjacent nor in order, as in a cache that served
// many requests).
Tensors allocate_tensors(const Problem& p);
// Only O and LSE (zeroed), for inputs that live elsewhere (e.g. read from files).
Tensors allocate_outputs(const Problem& p);
// Bytes of Q, K, V (at p.dtype), O and LSE of a valid problem.
int64_t tensor_bytes(const Problem& p);
// n uniform [-1, 1) floats from a seed (splitmix64; identical on every platform): the values
// random_tensors draws.
void fill_uniform(float* x, int64_t n, uint64_t seed);
// Uniform [-1, 1) inputs from a seed (deterministic across platforms), rounded to p.dtype
// (the same float32 values for every dtype before rounding), O and LSE zeroed.
Tensors random_tensors(const Problem& p, uint64_t seed);
// Float32 inputs (p's shapes and layout, any strides) stored as p.dtype: rounded to nearest
// even, densely packed; with O and LSE zeroed. For f32, a dense copy. A quantized cache
// (p.kv_dtype): K and V written row by row by kv_quant.hpp's rule (where a cache is written).
Tensors convert_inputs(const Problem& p, const Inputs& f32);

// A quantized cache's K and V read back as float32 (kv_quant.hpp's rule) into k and v (dense,
// p's layout, kv_elems() and v_elems() floats); returns float32 inputs over them and in's Q.
Inputs dequantize_kv_into(const Problem& p, const Inputs& in, float* k, float* v);
// The same into owned memory, with the problem those inputs are: kv_dtype Same (float32
// storage). What the reference and the textbook baseline read.
struct DequantizedKv {
  Problem problem;
  std::unique_ptr<float[], AlignedFree> k, v;
  Inputs inputs;
};
DequantizedKv dequantize_kv(const Problem& p, const Inputs& in);

// A paged cache's rows copied into a contiguous cache of the same storage (rows past a sequence's
// length zero), with the problem it is (kv_block 0): what naive and the reference read, so the
// tile engine's own block walk is checked against an independent copy. Q stays in's (a view).
size_t unpaged_bytes(const Problem& p);  // what unpage_kv_into writes: K, then V (64-byte aligned)
Inputs unpage_kv_into(const Problem& p, const Inputs& in, std::byte* out);
struct UnpagedKv {
  Problem problem;
  std::unique_ptr<std::byte[], AlignedFree> kv;
  Inputs inputs;
};
UnpagedKv unpage_kv(const Problem& p, const Inputs& in);

// The inverse: contiguous inputs of p's storage (in's problem is p with kv_block 0) copied into
// a paged cache of p (allocate_tensors' scattered table); Q copied as it is.
Tensors page_kv(const Problem& p, const Inputs& in);

// Throws InvalidInput naming the entry when a block table does not fit the problem: an id
// outside the pool, a sequence's key without a block (-1, or a table shorter than its length),
// a block that two sequences (or two positions of one) share.
void validate_block_table(const Problem& p, const KvPages& pages);

// A quantized cache given as stored (rows of bytes in kv_dtype's layout, read as they are: .npy
// uint8 files, Python uint8 arrays): K's rows must be head_dim's size; head_dim_v is head_dim
// when V's rows are that size too, else the one dim whose row takes v_row_bytes (0 = head_dim).
// Throws InvalidInput naming k_field / v_field, the size given and the sizes allowed.
int64_t raw_cache_dim_v(KvDType t, int64_t head_dim, int64_t k_row_bytes, int64_t v_row_bytes,
                        const std::string& k_field, const std::string& v_field);

}  // namespace attnlab
