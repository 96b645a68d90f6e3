#include "attnlab/tensor.hpp"

#include "attnlab/kv_summary.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
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

namespace {
// K/V rows the cache stores: per (batch, kv head, token), or a paged cache's whole pool.
int64_t kv_rows(const Problem& p) {
  return p.kv_paged() ? p.kv_pool_blocks() * p.kv_block * p.kv_heads : p.batch * p.kv_heads * p.kv_len;
}
}  // namespace

int64_t tensor_bytes(const Problem& p) {
  const int64_t rows = kv_rows(p);
  const int64_t in = p.q_elems() * dtype_bytes(p.dtype) +
                     rows * (p.kv_row_bytes(p.head_dim) + (p.kv_shared ? 0 : p.kv_row_bytes(p.dim_v())));
  return in + (p.o_elems() + p.lse_elems()) * int64_t{sizeof(float)} +
         p.batch * p.kv_table_len() * int64_t{sizeof(int32_t)};
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

std::vector<int32_t> scattered_pool_order(int64_t blocks) {
  std::vector<int32_t> perm(static_cast<size_t>(std::max<int64_t>(blocks, 0)));
  for (int64_t i = 0; i < blocks; ++i) perm[i] = static_cast<int32_t>(i);
  uint64_t state = 0x5eedb10c;
  for (int64_t i = blocks - 1; i > 0; --i) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    std::swap(perm[i], perm[(z ^ (z >> 31)) % static_cast<uint64_t>(i + 1)]);
  }
  return perm;
}

namespace {
// The block table of a fresh paged cache: sequence b's blocks in order b-major, drawn from
// scattered_pool_order, entries past a sequence's length -1.
std::vector<int32_t> scattered_table(const Problem& p) {
  const int64_t tl = p.kv_table_len();
  const std::vector<int32_t> perm = scattered_pool_order(p.kv_pool_blocks());
  std::vector<int32_t> table(static_cast<size_t>(p.batch * tl), -1);
  int64_t next = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t x = 0; x < (p.kv_len_of(b) + p.kv_block - 1) / p.kv_block; ++x) table[b * tl + x] = perm[next++];
  }
  return table;
}
}  // namespace

void share_v_with_k(const Problem& p, Inputs& in) {
  const auto prefix = [](auto k, int64_t dim) {
    k.dim = dim;
    return k;
  };
  in.v = in.k.data ? prefix(in.k, p.dim_v()) : in.v;
  in.v16 = in.k16.data ? prefix(in.k16, p.dim_v()) : in.v16;
  in.vq = in.kq.data ? prefix(in.kq, p.kv_row_bytes(p.dim_v())) : in.vq;
}

Tensors allocate_tensors(const Problem& p) {
  if (const std::string why = over_memory_budget(tensor_bytes(p), "Q, K, V, O, LSE"); !why.empty()) {
    throw InvalidInput("tensors of " + p.describe() + ": " + why);
  }
  Tensors t = allocate_outputs(p);
  t.inputs.dtype = p.dtype;
  // K and V: (batch, kv heads, kv_len) rows, or a paged cache's pool of (blocks, kv heads, block).
  const int64_t kv_outer = p.kv_paged() ? p.kv_pool_blocks() : p.batch;
  const int64_t kv_seq = p.kv_paged() ? p.kv_block : p.kv_len;
  const auto kv_count = [&](int64_t dim) { return static_cast<size_t>(kv_outer * p.kv_heads * kv_seq * dim); };
  const auto kv_view = [&](const auto* data, int64_t dim) {
    return make_view(data, kv_outer, p.kv_heads, kv_seq, dim, p.layout);
  };
  if (p.kv_paged()) {
    t.table = scattered_table(p);
    t.inputs.pages = KvPages{t.table.data(), p.kv_table_len(), p.kv_block, p.kv_pool_blocks()};
  }
  if (p.kv_quantized()) {  // Q float32 (validate), K and V rows of bytes
    t.q = alloc_floats(p.q_elems());
    t.inputs.q = make_view<const float>(t.q.get(), p.batch, p.q_heads, p.q_len, p.head_dim, p.layout);
    const auto rows = [&](std::unique_ptr<std::byte[], AlignedFree>& buf, int64_t dim) {
      const int64_t bytes = p.kv_row_bytes(dim);
      buf = alloc_bytes(kv_count(bytes));
      return kv_view(static_cast<const std::byte*>(buf.get()), bytes);
    };
    t.inputs.kv = p.kv_dtype;
    t.inputs.kq = rows(t.kq, p.head_dim);
    if (p.kv_shared) {
      share_v_with_k(p, t.inputs);
    } else {
      t.inputs.vq = rows(t.vq, p.dim_v());
    }
    return t;
  }
  if (p.dtype == DType::F32) {
    t.q = alloc_floats(p.q_elems());
    t.k = alloc_floats(kv_count(p.head_dim));
    t.inputs.q = make_view<const float>(t.q.get(), p.batch, p.q_heads, p.q_len, p.head_dim, p.layout);
    t.inputs.k = kv_view(static_cast<const float*>(t.k.get()), p.head_dim);
    if (p.kv_shared) {
      share_v_with_k(p, t.inputs);
    } else {
      t.v = alloc_floats(kv_count(p.dim_v()));
      t.inputs.v = kv_view(static_cast<const float*>(t.v.get()), p.dim_v());
    }
    return t;
  }
  const auto u16 = [](const std::unique_ptr<std::byte[], AlignedFree>& b) {
    return reinterpret_cast<const uint16_t*>(b.get());
  };
  t.q16 = alloc_bytes(2 * static_cast<size_t>(p.q_elems()));
  t.k16 = alloc_bytes(2 * kv_count(p.head_dim));
  t.inputs.q16 = make_view<const uint16_t>(u16(t.q16), p.batch, p.q_heads, p.q_len, p.head_dim, p.layout);
  t.inputs.k16 = kv_view(u16(t.k16), p.head_dim);
  if (p.kv_shared) {
    share_v_with_k(p, t.inputs);
  } else {
    t.v16 = alloc_bytes(2 * kv_count(p.dim_v()));
    t.inputs.v16 = kv_view(u16(t.v16), p.dim_v());
  }
  return t;
}

namespace {
// dst (dense, E) = src (float32, any strides), element by element.
// The rows of src (b, h, s) a cache stores: every one, or a paged cache's rows that have a block.
template <class F>
void for_stored_rows(const ConstView& src, const KvPages& pg, const F& f) {
  for (int64_t b = 0; b < src.batch; ++b)
    for (int64_t h = 0; h < src.heads; ++h)
      for (int64_t s = 0; s < src.seq; ++s) {
        if (!pg.table || pg.table[b * pg.table_len + s / pg.block] >= 0) f(b, h, s);
      }
}
template <class E>
void store_as(const ConstView& src, const View4<const E>& dst, const KvPages& pg = {}) {
  for_stored_rows(src, pg, [&](int64_t b, int64_t h, int64_t s) {
    const float* x = src.row(b, h, s);
    E* y = const_cast<E*>(kv_row(dst, pg, b, h, s));
    for (int64_t d = 0; d < src.dim; ++d) y[d] = from_float<E>(x[d]);
  });
}
}  // namespace

namespace {
// Each row of src (float32, any strides) written into dst's row of bytes by kv_quant.hpp's rule.
void quantize_rows(KvDType type, float scale, const ConstView& src, const View4<const std::byte>& dst,
                   const KvPages& pg) {
  for_stored_rows(src, pg, [&](int64_t b, int64_t h, int64_t s) {
    quantize_row(type, src.row(b, h, s), src.dim, const_cast<std::byte*>(kv_row(dst, pg, b, h, s)), scale);
  });
}
void dequantize_rows(KvDType type, float scale, const View4<const std::byte>& src, const MutView& dst) {
  for (int64_t b = 0; b < dst.batch; ++b)
    for (int64_t h = 0; h < dst.heads; ++h)
      for (int64_t s = 0; s < dst.seq; ++s) dequantize_row(type, src.row(b, h, s), dst.dim, dst.row(b, h, s), scale);
}
}  // namespace

Inputs dequantize_kv_into(const Problem& p, const Inputs& in, float* k, float* v) {
  if (in.pages.table) throw std::logic_error("dequantize_kv_into: a paged cache; unpage_kv first");
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

namespace {
template <class T>
View4<const std::byte> bytes_of(const View4<const T>& v) {
  const auto e = static_cast<int64_t>(sizeof(T));
  return {reinterpret_cast<const std::byte*>(v.data),
          v.batch,
          v.heads,
          v.seq,
          v.dim * e,
          v.stride_b * e,
          v.stride_h * e,
          v.stride_s * e};
}
// K (value = false) or V of `in` as rows of bytes, whatever their storage.
View4<const std::byte> kv_bytes_view(const Inputs& in, bool value) {
  if (in.kv != KvDType::Same) return value ? in.vq : in.kq;
  if (in.dtype == DType::F32) return bytes_of(value ? in.v : in.k);
  return bytes_of(value ? in.v16 : in.k16);
}
size_t dense_bytes(const Problem& p, int64_t dim) {
  return static_cast<size_t>(p.batch * p.kv_heads * p.kv_len * p.kv_row_bytes(dim));
}
}  // namespace

size_t unpaged_bytes(const Problem& p) {
  return allocated_bytes(dense_bytes(p, p.head_dim)) + allocated_bytes(dense_bytes(p, p.dim_v()));
}

Inputs unpage_kv_into(const Problem& p, const Inputs& in, std::byte* out_bytes) {
  if (!in.pages.table) throw std::logic_error("unpage_kv_into: the cache is not paged");
  Inputs out = in;
  out.pages = {};
  for (const bool value : {false, true}) {
    const int64_t dim = value ? p.dim_v() : p.head_dim, rb = p.kv_row_bytes(dim);
    std::byte* dst = value ? out_bytes + allocated_bytes(dense_bytes(p, p.head_dim)) : out_bytes;
    std::fill(dst, dst + dense_bytes(p, dim), std::byte{0});
    const auto dense = make_view<const std::byte>(dst, p.batch, p.kv_heads, p.kv_len, rb, p.layout);
    const View4<const std::byte> pool = kv_bytes_view(in, value);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.kv_heads; ++h)
        for (int64_t j = 0; j < p.kv_len_of(b); ++j) {
          std::memcpy(const_cast<std::byte*>(dense.row(b, h, j)), kv_row(pool, in.pages, b, h, j),
                      static_cast<size_t>(rb));
        }
    if (p.kv_quantized()) {
      (value ? out.vq : out.kq) = dense;
    } else if (p.dtype == DType::F32) {
      (value ? out.v : out.k) =
          make_view<const float>(reinterpret_cast<const float*>(dst), p.batch, p.kv_heads, p.kv_len, dim, p.layout);
    } else {
      (value ? out.v16 : out.k16) = make_view<const uint16_t>(reinterpret_cast<const uint16_t*>(dst), p.batch,
                                                              p.kv_heads, p.kv_len, dim, p.layout);
    }
  }
  return out;
}

UnpagedKv unpage_kv(const Problem& p, const Inputs& in) {
  UnpagedKv u;
  u.problem = p;
  u.problem.kv_block = 0;
  u.kv = alloc_bytes(unpaged_bytes(p));
  u.inputs = unpage_kv_into(p, in, u.kv.get());
  return u;
}

Tensors page_kv(const Problem& p, const Inputs& in) {
  if (in.pages.table || !p.kv_paged()) throw std::logic_error("page_kv: contiguous inputs into a paged problem");
  Tensors t = allocate_tensors(p);
  const auto q = [](const Inputs& x) {
    return x.dtype == DType::F32 || x.kv != KvDType::Same ? bytes_of(x.q) : bytes_of(x.q16);
  };
  const View4<const std::byte> qs = q(in), qd = q(t.inputs);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.q_heads; ++h)
      for (int64_t i = 0; i < p.q_len; ++i)
        std::memcpy(const_cast<std::byte*>(qd.row(b, h, i)), qs.row(b, h, i), static_cast<size_t>(qs.dim));
  for (const bool value : {false, true}) {
    if (value && p.kv_shared) break;  // V is K's rows
    const View4<const std::byte> src = kv_bytes_view(in, value), pool = kv_bytes_view(t.inputs, value);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.kv_heads; ++h)
        for (int64_t j = 0; j < p.kv_len_of(b); ++j) {
          std::memcpy(const_cast<std::byte*>(kv_row(pool, t.inputs.pages, b, h, j)), src.row(b, h, j),
                      static_cast<size_t>(src.dim));
        }
  }
  t.inputs.kv_scale = in.kv_scale;
  return t;
}

void validate_block_table(const Problem& p, const KvPages& pg) {
  const auto n = [](int64_t x) { return std::to_string(x); };
  if (!pg.table) throw InvalidInput("block_table: none given for a paged cache (kv_block " + n(p.kv_block) + ")");
  if (pg.block != p.kv_block) {
    throw InvalidInput("block_table: blocks of " + n(pg.block) + " tokens; allowed: kv_block (" + n(p.kv_block) + ")");
  }
  std::vector<int64_t> owner(static_cast<size_t>(std::max<int64_t>(pg.pool_blocks, 0)), -1);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t need = (p.kv_len_of(b) + pg.block - 1) / pg.block;
    if (need > pg.table_len) {
      throw InvalidInput("block_table[" + n(b) + "]: " + n(pg.table_len) + " entries for " + n(p.kv_len_of(b)) +
                         " keys; allowed: at least " + n(need) + " (ceil(length / kv_block))");
    }
    for (int64_t x = 0; x < need; ++x) {
      const int64_t id = pg.table[b * pg.table_len + x];
      const std::string at = "block_table[" + n(b) + "][" + n(x) + "]: ";
      if (id < 0 || id >= pg.pool_blocks) {
        throw InvalidInput(at + "block id " + n(id) + " is outside the pool; allowed: 0.." + n(pg.pool_blocks - 1) +
                           (id < 0 ? " (the sequence has a key in this block)" : ""));
      }
      if (owner[id] >= 0) {
        throw InvalidInput(at + "block " + n(id) + " is also block_table[" + n(owner[id] / pg.table_len) + "][" +
                           n(owner[id] % pg.table_len) + "]; allowed: each block in one place of the table");
      }
      owner[id] = b * pg.table_len + x;
    }
  }
}

int64_t raw_cache_dim_v(KvDType t, int64_t head_dim, int64_t k_row_bytes, int64_t v_row_bytes,
                        const std::string& k_field, const std::string& v_field) {
  const auto n = [](int64_t x) { return std::to_string(x); };
  const std::string type = to_string(t);
  if (k_row_bytes != kv_row_bytes(t, head_dim)) {
    throw InvalidInput(k_field + ": rows of " + n(k_row_bytes) + " bytes; allowed: " + n(kv_row_bytes(t, head_dim)) +
                       " (a " + type + " row of head_dim " + n(head_dim) + ", Q's last dimension)");
  }
  if (v_row_bytes == k_row_bytes) return 0;
  std::vector<int64_t> dims;  // the block layouts take multiples of 32 values
  for (int64_t d = Problem::kMinHeadDim; d <= Problem::kMaxHeadDim; ++d) {
    const bool blocks = t == KvDType::Q8_0 || t == KvDType::Q4_0;
    if ((!blocks || d % 32 == 0) && kv_row_bytes(t, d) == v_row_bytes) dims.push_back(d);
  }
  if (dims.size() == 1) return dims[0];
  std::string names;
  for (int64_t d : dims) names += (names.empty() ? "" : " or ") + n(d);
  throw InvalidInput(v_field + ": rows of " + n(v_row_bytes) + " bytes are " +
                     (dims.empty() ? "no " + type + " row" : "a " + type + " row of head_dim_v " + names) +
                     "; allowed: the bytes of one " + type + " row of " + n(Problem::kMinHeadDim) + ".." +
                     n(Problem::kMaxHeadDim) + " values");
}

Tensors convert_inputs(const Problem& p, const Inputs& f32) {
  Tensors t = allocate_tensors(p);
  if (p.kv_quantized()) {
    store_as(f32.q, t.inputs.q);
    quantize_rows(p.kv_dtype, t.inputs.kv_scale, f32.k, t.inputs.kq, t.inputs.pages);
    if (!p.kv_shared) quantize_rows(p.kv_dtype, t.inputs.kv_scale, f32.v, t.inputs.vq, t.inputs.pages);
    return t;
  }
  visit_inputs(t.inputs, [&](const auto& dst) {  // (a shared V is K's rows: written with them)
    store_as(f32.q, dst.q);
    store_as(f32.k, dst.k, dst.pages);
    if (!p.kv_shared) store_as(f32.v, dst.v, dst.pages);
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
  f.kv_block = 0;  // the same values at the same positions as the contiguous cache
  Tensors t = allocate_tensors(f);
  fill_uniform(t.q.get(), p.q_elems(), seed * 3 + 1);
  fill_uniform(t.k.get(), p.kv_elems(), seed * 3 + 2);
  if (!p.kv_shared) fill_uniform(t.v.get(), p.v_elems(), seed * 3 + 3);  // else V is K's first columns
  Tensors out =
      p.dtype == DType::F32 && !p.kv_quantized() && !p.kv_paged() ? std::move(t) : convert_inputs(p, t.inputs);
  if (p.topk()) attach_summary(p, out);  // (not timed: a cache keeps its summaries as it grows)
  return out;
}

}  // namespace attnlab
