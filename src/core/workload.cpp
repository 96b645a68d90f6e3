// Needle workloads (include/attnlab/workload.hpp).
#include "attnlab/workload.hpp"

#include <cmath>
#include <set>
#include <string>

#include "attnlab/kv_summary.hpp"

namespace attnlab {

void validate_needles(const Needles& n) {
  if (n.per_row < 0) {
    throw InvalidInput("needles.per_row: " + std::to_string(n.per_row) + "; allowed: >= 0 (0: no needles)");
  }
  if (!(n.mass > 0 && n.mass < 1)) {
    throw InvalidInput("needles.mass: " + std::to_string(n.mass) +
                       "; allowed: a share of the softmax mass strictly between 0 and 1");
  }
}

Tensors workload_tensors(const Problem& p, uint64_t seed, const Needles& needles) {
  validate_needles(needles);
  if (!needles.any()) return random_tensors(p, seed);
  Problem f = p;  // planted in float32, a contiguous cache, before any storage rounds it
  f.dtype = DType::F32, f.kv_dtype = KvDType::Same, f.kv_block = 0;
  f.topk_tokens = f.topk_sinks = f.topk_recent = 0;
  Tensors t = random_tensors(f, seed);
  uint64_t state = seed * 7919 + 17;
  const auto draw = [&](int64_t n) {  // uniform in [0, n) (splitmix64)
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return static_cast<int64_t>((z ^ (z >> 31)) % static_cast<uint64_t>(n));
  };
  const double scale = p.effective_scale();
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hk = 0; hk < p.kv_heads; ++hk) {
      std::set<int64_t> taken;
      for (int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h)
        for (int64_t i = 0; i < p.q_len; ++i) {
          const Interval iv = p.visible(b, i);
          const int64_t n = iv.hi - iv.lo;
          if (n <= 0) continue;
          const float* q = t.inputs.q.row(b, h, i);
          double q2 = 0;
          for (int64_t x = 0; x < p.head_dim; ++x) q2 += static_cast<double>(q[x]) * q[x];
          if (q2 == 0) continue;
          const double k = static_cast<double>(needles.per_row);
          const double sigma2 = scale * scale * q2 / 3;
          const double s = std::log(needles.mass / (1 - needles.mass) * static_cast<double>(n) / k) + sigma2 / 2;
          const double c = s / (scale * q2);
          for (int64_t x = 0; x < needles.per_row; ++x) {
            int64_t j = -1;
            for (int tries = 0; tries < 64 && j < 0; ++tries) {
              const int64_t cand = iv.lo + draw(n);
              if (taken.insert(cand).second) j = cand;
            }
            if (j < 0) {
              throw InvalidInput("needles.per_row: " + std::to_string(needles.per_row) + " per row of " +
                                 std::to_string(p.group() * p.q_len) + " rows sharing a kv head over " +
                                 std::to_string(n) + " visible keys; allowed: far fewer needles than keys");
            }
            float* key = const_cast<float*>(t.inputs.k.row(b, hk, j));
            for (int64_t y = 0; y < p.head_dim; ++y) key[y] = static_cast<float>(c * q[y]);
          }
        }
    }
  const bool same = p.dtype == DType::F32 && !p.kv_quantized() && !p.kv_paged();
  Tensors out = same ? std::move(t) : convert_inputs(p, t.inputs);
  if (p.topk()) attach_summary(p, out);
  return out;
}

}  // namespace attnlab
