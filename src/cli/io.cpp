#include "io.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <iostream>

namespace attnlab::cli {

namespace {
std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "(";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + ")";
}
}  // namespace

LoadedInputs load_inputs(const std::string& qp, const std::string& kp, const std::string& vp,
                         const MaskFlags& flags) {
  LoadedInputs li;
  li.q = read_npy(qp);
  li.k = read_npy(kp);
  li.v = read_npy(vp);
  Problem& p = li.problem;
  flags.apply(p);
  const bool bhsd = p.layout == Layout::BHSD;
  const char* dims = bhsd ? "(batch, heads, seq, head_dim) for layout bhsd"
                          : "(batch, seq, heads, head_dim) for layout bshd";
  for (auto [path, arr] : {std::pair{&qp, &li.q}, {&kp, &li.k}, {&vp, &li.v}}) {
    if (arr->shape.size() != 4) {
      throw InvalidInput(*path + ": shape " + shape_text(arr->shape) + " has " +
                         std::to_string(arr->shape.size()) + " dimensions; allowed: 4 " + dims);
    }
    for (int64_t s : arr->shape) {
      if (s == 0) throw InvalidInput(*path + ": shape " + shape_text(arr->shape) + " has a zero dimension; allowed: all >= 1");
    }
  }
  const auto& qs = li.q.shape;
  const auto& ks = li.k.shape;
  if (ks != li.v.shape) {
    throw InvalidInput(vp + ": shape " + shape_text(li.v.shape) + " differs from K's " +
                       shape_text(ks) + "; allowed: V has K's shape");
  }
  const int hi = bhsd ? 1 : 2, si = bhsd ? 2 : 1;
  if (ks[0] != qs[0]) throw InvalidInput(kp + ": batch " + std::to_string(ks[0]) + " differs from Q's batch " + std::to_string(qs[0]));
  if (ks[3] != qs[3]) throw InvalidInput(kp + ": head_dim " + std::to_string(ks[3]) + " differs from Q's head_dim " + std::to_string(qs[3]));
  p.batch = qs[0];
  p.q_heads = qs[hi];
  p.q_len = qs[si];
  p.head_dim = qs[3];
  p.kv_heads = ks[hi];
  p.kv_len = ks[si];
  p.validate();
  li.inputs.q = make_view<const float>(li.q.data.data(), p.batch, p.q_heads, p.q_len, p.head_dim, p.layout);
  li.inputs.k = make_view<const float>(li.k.data.data(), p.batch, p.kv_heads, p.kv_len, p.head_dim, p.layout);
  li.inputs.v = make_view<const float>(li.v.data.data(), p.batch, p.kv_heads, p.kv_len, p.head_dim, p.layout);
  return li;
}

void warn_nonfinite(const std::string& name, const FloatBuffer& data) {
  // Exponent bits all ones = NaN or Inf. Branch-free, so the scan vectorizes: it reads
  // every input once, at memory speed.
  size_t count = 0;
  for (float x : data) count += (std::bit_cast<uint32_t>(x) & 0x7f800000u) == 0x7f800000u;
  if (count > 0) {
    size_t first = 0;
    while (std::isfinite(data[first])) ++first;
    std::cerr << "warning: " << name << " holds " << count
              << " NaN/Inf value(s), first at flat index " << first
              << "; every row that sees one gets NaN output (masked positions never leak)\n";
  }
}

}  // namespace attnlab::cli
