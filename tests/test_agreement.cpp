// Every registered kernel against the float64 reference over a grid of shapes: odd sizes,
// q_len != kv_len both ways, head dims that are and are not multiples of the vector width,
// MHA / GQA / MQA, batch 1-3, causal (both alignments), windows, kv_lens with zeros and
// both layouts. Kernels are taken from the registry, so a new kernel is tested with no
// change here. Unavailable kernels (e.g. CUDA without a device) are skipped with the reason.
#include <gtest/gtest.h>

#include <sstream>
#include <thread>

#include "attnlab/kernel.hpp"
#include "attnlab/verify.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

constexpr int64_t kLens[] = {1, 2, 3, 17, 64, 65, 127, 300};
constexpr int64_t kDims[] = {16, 32, 64, 80, 96, 128, 256};
constexpr int64_t kHeads[][2] = {{1, 1}, {4, 1}, {8, 2}, {8, 8}};

enum class MaskKind { None, Causal, CausalTopLeft, WindowCausal, WindowBoth, KvLens, KvLensCausal };
constexpr MaskKind kMasks[] = {MaskKind::None,       MaskKind::Causal,   MaskKind::CausalTopLeft,
                               MaskKind::WindowCausal, MaskKind::WindowBoth, MaskKind::KvLens,
                               MaskKind::KvLensCausal};
const char* mask_name(MaskKind m) {
  switch (m) {
    case MaskKind::None: return "none";
    case MaskKind::Causal: return "causal";
    case MaskKind::CausalTopLeft: return "causal_tl";
    case MaskKind::WindowCausal: return "win16_0";
    case MaskKind::WindowBoth: return "win5_3";
    case MaskKind::KvLens: return "kvlens";
    case MaskKind::KvLensCausal: return "kvlens_causal";
  }
  return "?";
}

struct Case {
  Problem p;
  std::string name;
};

Case make_case(int64_t sq, int64_t sk, int64_t d, int hi, int64_t batch, MaskKind mask, Layout layout) {
  Case c;
  Problem& p = c.p;
  p.batch = batch, p.q_heads = kHeads[hi][0], p.kv_heads = kHeads[hi][1];
  p.q_len = sq, p.kv_len = sk, p.head_dim = d, p.layout = layout;
  switch (mask) {
    case MaskKind::None: break;
    case MaskKind::Causal: p.causal = CausalAlign::BottomRight; break;
    case MaskKind::CausalTopLeft: p.causal = CausalAlign::TopLeft; break;
    case MaskKind::WindowCausal: p.causal = CausalAlign::BottomRight, p.window_left = 16; break;
    case MaskKind::WindowBoth: p.window_left = 5, p.window_right = 3; break;
    case MaskKind::KvLens:
    case MaskKind::KvLensCausal:
      // The first entry is always 0 (a fully padded sequence); the others vary.
      for (int64_t b = 0; b < batch; ++b) p.kv_lens.push_back(b == 0 ? 0 : (b == 1 ? sk : (sk + 1) / 2));
      if (mask == MaskKind::KvLensCausal) p.causal = CausalAlign::BottomRight;
      break;
  }
  std::ostringstream name;  // (a stream: GCC 12 warns falsely on chained string +)
  name << "q" << sq << "_k" << sk << "_d" << d << "_h" << p.q_heads << "x" << p.kv_heads << "_b"
       << batch << "_" << mask_name(mask) << "_" << to_string(layout);
  c.name = name.str();
  return c;
}

// Every (q_len, kv_len) pair once, with the other axes cycling at co-prime periods so
// they combine in many ways; plus every head_dim x mask at one odd shape.
std::vector<Case> grid() {
  std::vector<Case> cases;
  int n = 0;
  for (int64_t sq : kLens)
    for (int64_t sk : kLens) {
      const int64_t d = kDims[n % 7];
      const int hi = n % 4;
      const int64_t batch = 1 + n % 3;
      const MaskKind mask = kMasks[(n / 2) % 7];
      const Layout layout = (n / 3) % 2 ? Layout::BSHD : Layout::BHSD;
      ++n;
      if (test::small_mode() && (n % 4 != 0)) continue;
      cases.push_back(make_case(sq, sk, d, hi, batch, mask, layout));
    }
  for (int64_t d : kDims)
    for (MaskKind m : kMasks) {
      if (test::small_mode() && d > 96) continue;
      cases.push_back(make_case(65, 127, d, 2, 2, m, d % 32 ? Layout::BSHD : Layout::BHSD));
    }
  // GQA with 6 query heads over 2 kv heads: a tiled mapping (h % kv_heads) cannot pass.
  Case g = make_case(17, 300, 64, 0, 2, MaskKind::Causal, Layout::BHSD);
  g.p.q_heads = 6, g.p.kv_heads = 2, g.name = "q17_k300_d64_h6x2_b2_causal_bhsd";
  cases.push_back(g);
  return cases;
}

struct Param {
  const Kernel* kernel;
  Case c;
};

// Readable test output instead of gtest's byte dump.
void PrintTo(const Param& p, std::ostream* os) { *os << p.kernel->name() << " " << p.c.p.describe(); }

std::vector<Param> params() {
  std::vector<Param> out;
  for (const Kernel* k : registry())
    for (const Case& c : grid()) out.push_back({k, c});
  return out;
}

class KernelAgreement : public ::testing::TestWithParam<Param> {};

TEST_P(KernelAgreement, MatchesFloat64Reference) {
  const Kernel& k = *GetParam().kernel;
  const Problem& p = GetParam().c.p;
  if (Support a = k.available(); !a) GTEST_SKIP() << k.name() << " unavailable: " << a.reason;
  if (Support s = k.supports(p); !s) GTEST_SKIP() << k.name() << " does not support this shape: " << s.reason;
  Tensors t = random_tensors(p, 42);
  // At most 768 rows are checked (always the first and last of every head).
  const Agreement a = prepare_agreement(p, t.inputs, sample_rows(p, 768, 7));
  const int threads = static_cast<int>(std::max(2u, std::thread::hardware_concurrency()));
  const KernelCheck c = check_kernel(k, p, t.inputs, a, threads);
  EXPECT_EQ(c.verdict, Verdict::Pass) << p.describe() << ": " << c.reason;
  EXPECT_TRUE(c.errors.lse_checked);
}

INSTANTIATE_TEST_SUITE_P(Grid, KernelAgreement, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::string(info.param.kernel->name()) + "_" + info.param.c.name;
                         });

}  // namespace
}  // namespace attnlab
