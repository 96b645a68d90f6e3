#include "attnlab/problem.hpp"

#include <cmath>
#include <sstream>

namespace attnlab {

const char* to_string(Layout layout) { return layout == Layout::BHSD ? "bhsd" : "bshd"; }

Layout parse_layout(const std::string& text) {
  if (text == "bhsd") return Layout::BHSD;
  if (text == "bshd") return Layout::BSHD;
  throw InvalidInput("layout: '" + text + "' is not a layout; allowed: bhsd, bshd");
}

const char* to_string(CausalAlign causal) {
  switch (causal) {
    case CausalAlign::None: return "none";
    case CausalAlign::BottomRight: return "bottom-right";
    case CausalAlign::TopLeft: return "top-left";
  }
  return "?";
}

namespace {
void require_positive(const char* field, int64_t value) {
  if (value < 1) {
    throw InvalidInput(std::string(field) + ": " + std::to_string(value) +
                       " is not allowed; allowed: an integer >= 1");
  }
}
void require_window(const char* field, int64_t value) {
  if (value < -1) {
    throw InvalidInput(std::string(field) + ": " + std::to_string(value) +
                       " is not allowed; allowed: -1 (unbounded) or an integer >= 0");
  }
}
}  // namespace

void Problem::validate() const {
  require_positive("batch", batch);
  require_positive("q_heads", q_heads);
  require_positive("kv_heads", kv_heads);
  require_positive("q_len", q_len);
  require_positive("kv_len", kv_len);
  if (q_heads % kv_heads != 0) {
    throw InvalidInput("kv_heads: " + std::to_string(kv_heads) + " does not divide q_heads (" +
                       std::to_string(q_heads) +
                       "); allowed: a divisor of q_heads (kv_heads == q_heads is MHA, 1 is MQA)");
  }
  if (head_dim < kMinHeadDim || head_dim > kMaxHeadDim) {
    throw InvalidInput("head_dim: " + std::to_string(head_dim) + " is not supported; allowed: " +
                       std::to_string(kMinHeadDim) + " to " + std::to_string(kMaxHeadDim));
  }
  require_window("window_left", window_left);
  require_window("window_right", window_right);
  if (!kv_lens.empty()) {
    if (static_cast<int64_t>(kv_lens.size()) != batch) {
      throw InvalidInput("kv_lens: " + std::to_string(kv_lens.size()) +
                         " entries given; allowed: exactly batch (" + std::to_string(batch) +
                         ") entries, or none");
    }
    for (size_t b = 0; b < kv_lens.size(); ++b) {
      if (kv_lens[b] < 0 || kv_lens[b] > kv_len) {
        throw InvalidInput("kv_lens[" + std::to_string(b) + "]: " + std::to_string(kv_lens[b]) +
                           " is out of range; allowed: 0 to kv_len (" + std::to_string(kv_len) +
                           ")");
      }
    }
  }
  if (scale && !std::isfinite(*scale)) {
    throw InvalidInput("scale: " + std::to_string(*scale) +
                       " is not allowed; allowed: a finite number");
  }
  // Keep every index comfortably inside int64 and every buffer addressable.
  constexpr int64_t kMaxElems = int64_t{1} << 36;
  if (q_len > kMaxElems / (batch * q_heads * head_dim) ||
      kv_len > kMaxElems / (batch * kv_heads * head_dim)) {
    throw InvalidInput("shape: " + describe() + " is too large; allowed: at most 2^36 elements "
                       "per tensor");
  }
}

float Problem::effective_scale() const {
  return scale ? *scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

MaskSpec Problem::mask_for_batch(int64_t b) const {
  return MaskSpec{q_len, kv_len_of(b), causal, window_left, window_right};
}

int64_t Problem::visible_pairs() const {
  int64_t pairs = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const MaskSpec m = mask_for_batch(b);
    for (int64_t i = 0; i < q_len; ++i) pairs += m.row(i).size();
  }
  return pairs * q_heads;
}

double Problem::flops() const {
  // Two GEMMs per visible (row, key) pair: q.k (2d) and p*v (2d).
  return 4.0 * static_cast<double>(head_dim) * static_cast<double>(visible_pairs());
}

double Problem::kv_bytes() const {
  // K and V rows that any query row sees, read once per kv head (GQA's saving shows here).
  double keys = 0;
  for (int64_t b = 0; b < batch; ++b) keys += static_cast<double>(mask_for_batch(b).rows(0, q_len).size());
  return 2.0 * sizeof(float) * keys * static_cast<double>(kv_heads * head_dim);
}

double Problem::bytes_moved() const {
  const double qo = 2.0 * sizeof(float) * static_cast<double>(q_elems());
  return qo + kv_bytes() + sizeof(float) * static_cast<double>(lse_elems());
}

std::string Problem::describe() const {
  std::ostringstream s;
  s << "batch=" << batch << " q_heads=" << q_heads << " kv_heads=" << kv_heads
    << " q_len=" << q_len << " kv_len=" << kv_len << " head_dim=" << head_dim;
  if (causal != CausalAlign::None) s << " causal=" << to_string(causal);
  if (window_left >= 0 || window_right >= 0) s << " window=" << window_left << "," << window_right;
  if (!kv_lens.empty()) {
    s << " kv_lens=";
    for (size_t b = 0; b < kv_lens.size(); ++b) s << (b ? "," : "") << kv_lens[b];
  }
  if (scale) s << " scale=" << *scale;
  s << " layout=" << to_string(layout);
  return s.str();
}

}  // namespace attnlab
