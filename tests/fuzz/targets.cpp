#include "targets.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attnlab/npy.hpp"
#include "attnlab/problem.hpp"
#include "bench/sweep/experiment.hpp"
#include "cli/common.hpp"

namespace attnlab::fuzz {

std::string check_npy(std::string_view bytes) {
  NpyArray a;
  try {
    a = parse_npy(std::string(bytes), "fuzz.npy");
  } catch (const InvalidInput&) {
    return "";
  }
  size_t count = 1;
  for (int64_t d : a.shape) {
    if (d < 0) return "negative dimension accepted";
    count *= static_cast<size_t>(d);
  }
  if (a.is16()) {
    if (a.bits16.size() != count || !a.data.empty()) return "16-bit element count differs from the shape";
    return "";
  }
  if (a.data.size() != count) return "element count differs from the shape";
  if (a.source_dtype != "<f4" && a.source_dtype != "<f8") return "unknown source dtype " + a.source_dtype;
  const NpyArray b = parse_npy(encode_npy(a.data.data(), a.shape), "fuzz-roundtrip.npy");
  if (b.shape != a.shape || b.data.size() != a.data.size()) return "round trip changed the shape";
  if (count > 0 && std::memcmp(b.data.data(), a.data.data(), count * sizeof(float)) != 0) {
    return "round trip changed the data";
  }
  return "";
}

std::string check_experiment(std::string_view text) {
  static const std::vector<std::string> kernels = bench::registry_kernel_names();
  bench::Experiment e;
  try {
    e = bench::parse_experiment_text(std::string(text), "fuzz", kernels);
  } catch (const InvalidInput&) {
    return "";
  }
  if (e.grids.empty() || e.implementations.empty()) return "an accepted experiment has no grid or kernel";
  if (e.repetitions < 1 || e.verify_rows < 1) return "run settings out of range";
  return "";
}

namespace {

// interval.hpp's rule without overflow: a bound past the first or last key is unbounded.
Interval exact_row(const MaskSpec& m, int64_t i) {
  using I = __int128;
  const I diag = I(i) + (m.causal == CausalAlign::TopLeft ? 0 : I(m.kv_len) - m.q_len);
  const I right = m.causal != CausalAlign::None ? 0 : I(m.right);
  I hi = right < 0 ? I(m.kv_len) : std::min<I>(m.kv_len, diag + right + 1);
  hi = std::max<I>(hi, 0);
  const I lo = std::min(hi, m.left < 0 ? I(0) : std::max<I>(0, diag - m.left));
  return {static_cast<int64_t>(lo), static_cast<int64_t>(hi)};
}

std::string check_rows(const Problem& p, int64_t b) {
  const MaskSpec m = p.mask_for_batch(b);
  if (m.kv_len < 0 || m.kv_len > p.kv_len) return "batch kv length out of range";
  // Every row when there are few, else both ends and the middle (q_len may be 2^36).
  std::vector<int64_t> rows;
  if (p.q_len <= 256) {
    for (int64_t i = 0; i < p.q_len; ++i) rows.push_back(i);
  } else {
    const int64_t n = p.q_len;
    rows = {0, 1, n / 2, n / 2 + 1, n - 2, n - 1};
  }
  Interval prev{0, 0};
  for (int64_t i : rows) {
    const Interval iv = m.row(i);
    if (iv.lo < 0 || iv.lo > iv.hi || iv.hi > m.kv_len) return "row interval outside [0, kv_len]";
    if (!iv.empty() && !prev.empty() && (iv.lo < prev.lo || iv.hi < prev.hi)) {
      return "row intervals not monotonic in the row";
    }
    const Interval want = exact_row(m, i);
    if (iv.lo != want.lo || iv.hi != want.hi) {
      return "row " + std::to_string(i) + ": [" + std::to_string(iv.lo) + ", " + std::to_string(iv.hi) +
             ") but the exact rule gives [" + std::to_string(want.lo) + ", " + std::to_string(want.hi) + ")";
    }
    if (!iv.empty()) prev = iv;
  }
  // The union over a row block (tile skipping) holds every row's interval.
  const int64_t n = std::min<int64_t>(p.q_len, 64);
  const Interval u = m.rows(0, n);
  for (int64_t i = 0; i < n; ++i) {
    const Interval iv = m.row(i);
    if (!iv.empty() && (iv.lo < u.lo || iv.hi > u.hi)) return "rows() union misses a row's keys";
  }
  return "";
}

}  // namespace

std::string check_mask_flags(std::string_view text) {
  std::vector<std::string> args;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    args.emplace_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  // One app for every input (building it costs more than parsing): parse() clears the
  // previous parse, and the flags return to their defaults first.
  static cli::ShapeFlags shape;
  static cli::MaskFlags mask;
  static CLI::App& app = *[] {
    auto* a = new CLI::App;
    shape.add_to(*a);
    mask.add_to(*a);
    return a;
  }();
  shape = cli::ShapeFlags{};
  mask = cli::MaskFlags{};
  Problem p;
  try {
    app.parse(args);
    shape.apply(p);
    mask.apply(p);
    (void)mask.thread_count();
    p.validate();
  } catch (const CLI::ParseError&) {
    return "";
  } catch (const InvalidInput&) {
    return "";
  }
  for (int64_t b : {int64_t{0}, p.batch - 1}) {
    if (std::string broken = check_rows(p, b); !broken.empty()) return broken;
  }
  (void)p.describe();
  return "";
}

}  // namespace attnlab::fuzz
