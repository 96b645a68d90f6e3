#include "attnlab/tensor.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

namespace attnlab {

void AlignedFree::operator()(void* p) const { std::free(p); }

std::unique_ptr<std::byte[], AlignedFree> alloc_bytes(size_t count) {
  const size_t rounded = ((count + 63) / 64) * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, rounded == 0 ? 64 : rounded);
  return std::unique_ptr<std::byte[], AlignedFree>(static_cast<std::byte*>(p));
}

std::unique_ptr<float[], AlignedFree> alloc_floats(size_t count) {
  auto bytes = alloc_bytes(count * sizeof(float));
  return std::unique_ptr<float[], AlignedFree>(reinterpret_cast<float*>(bytes.release()));
}

Tensors allocate_tensors(const Problem& p) {
  Tensors t;
  t.q = alloc_floats(p.q_elems());
  t.k = alloc_floats(p.kv_elems());
  t.v = alloc_floats(p.kv_elems());
  t.o = alloc_floats(p.q_elems());
  t.lse = alloc_floats(p.lse_elems());
  t.inputs.q = make_view<const float>(t.q.get(), p.batch, p.q_heads, p.q_len, p.head_dim, p.layout);
  t.inputs.k = make_view<const float>(t.k.get(), p.batch, p.kv_heads, p.kv_len, p.head_dim, p.layout);
  t.inputs.v = make_view<const float>(t.v.get(), p.batch, p.kv_heads, p.kv_len, p.head_dim, p.layout);
  t.outputs.o = make_view<float>(t.o.get(), p.batch, p.q_heads, p.q_len, p.head_dim, p.layout);
  t.outputs.lse = t.lse.get();
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
void fill(float* x, int64_t n, uint64_t seed) {
  uint64_t s = seed;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(static_cast<double>(next(s) >> 40) / double(1ull << 23) - 1.0);
  }
}
}  // namespace

Tensors random_tensors(const Problem& p, uint64_t seed) {
  Tensors t = allocate_tensors(p);
  fill(t.q.get(), p.q_elems(), seed * 3 + 1);
  fill(t.k.get(), p.kv_elems(), seed * 3 + 2);
  fill(t.v.get(), p.kv_elems(), seed * 3 + 3);
  return t;
}

}  // namespace attnlab
