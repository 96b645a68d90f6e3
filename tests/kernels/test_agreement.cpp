// Every registered kernel against the float64 reference over a grid of shapes: odd sizes,
// q_len != kv_len both ways, head dims that are and are not multiples of the vector width,
// MHA / GQA / MQA, batch 1-3, causal (both alignments), windows, kv_lens with zeros and
// both layouts; head_dim_v != head_dim (MLA); vector tails (head dims 1 to 512 that are not multiples of 16) and
// decode's chunk merge (kv_len around its 128..2048-key chunks, q_len 1..16, kv_lens cutting inside a chunk). A quarter
// of the cases also run with bf16 and another quarter with f16 storage. Kernels are taken from the registry, so a new
// kernel is tested with no change here. Unavailable kernels (e.g. CUDA without a device) are skipped with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <thread>
#include <utility>

#include "attnlab/isa.hpp"
#include "attnlab/kernel.hpp"
#include "attnlab/kv_quant.hpp"
#include "attnlab/verify.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

constexpr int64_t kLens[] = {1, 2, 3, 17, 64, 65, 127, 300};
constexpr int64_t kDims[] = {16, 32, 64, 80, 96, 128, 256};
// The first four cycle in the shape grid; 6x2 (a tiled h % kv_heads mapping fails) joins
// them in the tail and decode grids.
constexpr int64_t kHeads[][2] = {{1, 1}, {4, 1}, {8, 2}, {8, 8}, {6, 2}};
// Head dims with a partial vector (AVX-512: 16 lanes), FlashAttention's odd 40/59/111,
// and the largest supported one.
constexpr int64_t kTailDims[] = {1, 3, 8, 24, 40, 59, 72, 111, 200, 257, 384, 512};
// (q_len, kv_len): decode's q_len <= 16 and prefill tiles (flash's 120-row tile, 64-key tiles).
constexpr int64_t kTailShapes[][2] = {{1, 300}, {7, 513}, {16, 64}, {33, 65}, {65, 127}, {130, 200}};
// (head_dim, head_dim_v) with d_v != d_qk: MLA's prefill (192/128) and absorbed decode (576/512,
// the largest head_dim), V wider than K, and tails on either side.
constexpr int64_t kSplitDims[][2] = {{192, 128}, {576, 512}, {64, 128}, {40, 24}, {3, 17}, {128, 1}, {80, 200}};
// kv lengths around decode's key chunks: the longest power of two of 128..2048 keys that leaves 64
// (batch, kv head, chunk) tasks - 128-256 keys at 511..513 with these batches and heads, up to 512
// at 1500, 2048 at 4097 with 3 x 8 kv heads; and 2048-key chunks at 2049 keys with 8 x 8 (below).
constexpr int64_t kChunkLens[] = {511, 512, 513, 1500, 4097};

enum class MaskKind {
  None,
  Causal,
  CausalTopLeft,
  WindowCausal,
  WindowBoth,
  KvLens,
  KvLensCausal,
  WindowWide,  // a window of 2/3 of kv_len: its left edge falls inside a chunk
  KvLensCut,
  KvLensCutCausal  // kv_lens {kv_len - 1, 0, min(kv_len, 513)}: cut inside chunks
};
constexpr MaskKind kMasks[] = {MaskKind::None,       MaskKind::Causal, MaskKind::CausalTopLeft, MaskKind::WindowCausal,
                               MaskKind::WindowBoth, MaskKind::KvLens, MaskKind::KvLensCausal};
constexpr MaskKind kChunkMasks[] = {MaskKind::None,           MaskKind::Causal,     MaskKind::CausalTopLeft,
                                    MaskKind::WindowWide,     MaskKind::WindowBoth, MaskKind::KvLensCut,
                                    MaskKind::KvLensCutCausal};
const char* mask_name(MaskKind m) {
  switch (m) {
    case MaskKind::None: return "none";
    case MaskKind::Causal: return "causal";
    case MaskKind::CausalTopLeft: return "causal_tl";
    case MaskKind::WindowCausal: return "win16_0";
    case MaskKind::WindowBoth: return "win5_3";
    case MaskKind::KvLens: return "kvlens";
    case MaskKind::KvLensCausal: return "kvlens_causal";
    case MaskKind::WindowWide: return "win";  // named with its bounds by make_case
    case MaskKind::KvLensCut: return "kvlens_cut";
    case MaskKind::KvLensCutCausal: return "kvlens_cut_causal";
  }
  return "?";
}

struct Case {
  Problem p;
  std::string name;
};

Case make_case(int64_t sq, int64_t sk, int64_t d, int hi, int64_t batch, MaskKind mask, Layout layout, int64_t dv = 0) {
  Case c;
  Problem& p = c.p;
  p.batch = batch, p.q_heads = kHeads[hi][0], p.kv_heads = kHeads[hi][1];
  p.q_len = sq, p.kv_len = sk, p.head_dim = d, p.head_dim_v = dv, p.layout = layout;
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
    case MaskKind::WindowWide: p.window_left = 2 * sk / 3, p.window_right = 1; break;
    case MaskKind::KvLensCut:
    case MaskKind::KvLensCutCausal: {
      const int64_t lens[] = {sk - 1, 0, std::min<int64_t>(sk, 513)};
      for (int64_t b = 0; b < batch; ++b) p.kv_lens.push_back(lens[b % 3]);
      if (mask == MaskKind::KvLensCutCausal) p.causal = CausalAlign::BottomRight;
      break;
    }
  }
  std::ostringstream name;  // (a stream: GCC 12 warns falsely on chained string +)
  name << "q" << sq << "_k" << sk << "_d" << d;
  if (dv) name << "v" << dv;
  name << "_h" << p.q_heads << "x" << p.kv_heads << "_b" << batch << "_";
  if (mask == MaskKind::WindowWide) {
    name << "win" << p.window_left << "_" << p.window_right;
  } else {
    name << mask_name(mask);
  }
  name << "_" << to_string(layout);
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
  cases.push_back(make_case(17, 300, 64, 4, 2, MaskKind::Causal, Layout::BHSD));
  // Vector tails: every tail head_dim with every mask; shapes, heads, batch and layout
  // cycle at periods co-prime with the 7 masks.
  int t = 0;
  for (int64_t d : kTailDims)
    for (MaskKind m : kMasks) {
      const int64_t* sh = kTailShapes[t % 6];
      const int hi = t % 5;
      const int64_t batch = 1 + (t / 5) % 3;
      const Layout layout = (t / 7 + t) % 2 ? Layout::BSHD : Layout::BHSD;
      ++t;
      if (test::small_mode() && (t % 4 != 0 || d > 257)) continue;
      cases.push_back(make_case(sh[0], sh[1], d, hi, batch, m, layout));
    }
  // d_v != d_qk: every pair with every mask, decode and prefill shapes cycling.
  int v = 0;
  for (const auto& dd : kSplitDims)
    for (MaskKind m : kMasks) {
      const int64_t* sh = kTailShapes[v % 6];
      const int hi = v % 5;
      const Layout layout = (v / 6) % 2 ? Layout::BSHD : Layout::BHSD;
      ++v;
      if (test::small_mode() && (v % 3 != 0 || dd[0] > 257)) continue;
      cases.push_back(make_case(sh[0], sh[1], dd[0], hi, 1 + v % 2, m, layout, dd[1]));
    }
  // decode's chunk merge: q_len 1..16 at each kv length around the chunk size; the other
  // axes cycle at periods 12, 7, 5 (co-prime), batch and layout change every 12 cases.
  int c = 0;
  for (int64_t sk : kChunkLens)
    for (int64_t sq = 1; sq <= 16; ++sq) {
      const int64_t d = kTailDims[c % 12];
      const MaskKind m = kChunkMasks[c % 7];
      const int hi = c % 5;
      const int64_t batch = 1 + (c / 12) % 3;
      const Layout layout = (c / 12 + c) % 2 ? Layout::BSHD : Layout::BHSD;
      ++c;
      if (test::small_mode() && (c % 3 != 0 || sk > 1500 || d > 257)) continue;  // head dims 8, 59, 200
      cases.push_back(make_case(sq, sk, d, hi, batch, m, layout));
    }
  // Past decode's longest chunk: 8 sequences x 8 kv heads x 2 chunks of 2048 keys.
  const std::pair<int64_t, MaskKind> past[] = {
      {1, MaskKind::KvLensCutCausal}, {5, MaskKind::Causal}, {16, MaskKind::WindowWide}};
  for (const auto& [sq, m] : past) {
    if (!test::small_mode() || sq == 5) cases.push_back(make_case(sq, 2049, 40, 3, 8, m, Layout::BHSD));
  }
  return cases;
}

struct Param {
  const Kernel* kernel;
  Case c;
};

// Readable test output instead of gtest's byte dump.
void PrintTo(const Param& p, std::ostream* os) { *os << test::variant_name(*p.kernel) << " " << p.c.p.describe(); }

std::vector<Param> params() {
  std::vector<Param> out;
  // Every variant: the SIMD kernels once per built target (those this CPU cannot run skip).
  // A quarter of the cases again with bf16 storage, another quarter with f16.
  std::vector<Case> cases = grid();
  const size_t n = cases.size();
  for (size_t i = 0; i < n; ++i) {
    if (i % 4 != 1 && i % 4 != 3) continue;
    Case c = cases[i];
    c.p.dtype = i % 4 == 1 ? DType::BF16 : DType::F16;
    c.name += std::string("_") + to_string(c.p.dtype);
    cases.push_back(std::move(c));
  }
  for (const Kernel* k : variants())
    for (Case c : cases) {
      const std::optional<DType> d = test::case_dtype(*k, c.p.dtype);
      if (!d) continue;
      if (*d != c.p.dtype) c.p.dtype = *d, c.name += "_as_" + std::string(to_string(*d));
      out.push_back({k, c});
    }
  return out;
}

class KernelAgreement : public ::testing::TestWithParam<Param> {};

// Which grid cases each kernel must run: its declared capabilities (Kernel::capabilities: patterns,
// d_v != d, quantized and paged caches, the integer-codes-only cache, the q_len and head-dim limits,
// the arithmetic) - read here apart from the kernels' supports(), so a kernel whose supports() refuses
// more than it declares fails its cases instead of skipping them. A kernel unavailable here (no CUDA
// device, a CPU without its unit) skips.
bool must_run(const Kernel& k, const Problem& p) {
  const Capabilities c = k.capabilities();
  if (p.sparse() && !c.patterns) return false;
  if (p.dim_v() != p.head_dim && !c.head_dim_v) return false;
  if (p.kv_quantized() && !c.kv_quant) return false;
  if (p.kv_paged() && !c.paged) return false;
  if (c.kv_int_codes_only && !(p.kv_quantized() && kv_int_dot(p.kv_dtype))) return false;
  if (c.max_q_len > 0 && p.q_len > c.max_q_len) return false;
  if (c.max_head_dim > 0 && std::max(p.head_dim, p.dim_v()) > c.max_head_dim) return false;
  if (k.name() == "cuda_flash_bf16") {  // a sparse pattern's block holds whole groups (its description)
    if (p.sparse() && 64 % (p.q_heads / p.kv_heads) != 0) return false;
  }
  if ((c.arithmetic == Arithmetic::Int8Products || c.arithmetic == Arithmetic::Int8Bf16Products) &&
      p.dtype != DType::F32)
    return false;  // flash_int8, flash_int8_amx: "f32 in" (Q and K rounded from float32)
  return true;     // bf16-only kernels: params() gives them the f32/bf16 cases at bf16 (case_dtype)
}

TEST_P(KernelAgreement, MatchesFloat64Reference) {
  const Kernel& k = *GetParam().kernel;
  const Problem& p = GetParam().c.p;
  if (Support a = k.available(); !a) GTEST_SKIP() << k.name() << " unavailable: " << a.reason;
  if (Support s = supports_problem(k, p); !s) {
    if (must_run(k, p))
      FAIL() << k.name() << " must run " << p.describe() << " (must_run) and refuses it: " << s.reason;
    GTEST_SKIP() << k.name() << " does not support this shape: " << s.reason;
  }
  Tensors t = random_tensors(p, 42);
  // At most 768 rows are checked (always the first and last of every head).
  const Agreement a = prepare_agreement(p, t.inputs, sample_rows(p, 768, 7));
  const int threads = static_cast<int>(std::max(2u, std::thread::hardware_concurrency()));
  const KernelCheck c = check_kernel(k, p, t.inputs, a, threads);
  EXPECT_EQ(c.verdict, Verdict::Pass) << p.describe() << ": " << c.reason;
  EXPECT_TRUE(c.errors.lse_checked);
}

// A kernel that keeps one head_dim refuses d_v != d_qk with a reason that names the field and
// exactly the kernels that run it (the list in session.cpp follows capabilities().head_dim_v).
TEST(HeadDimV, KernelsThatDoNotRunItSayWhichDo) {
  Problem p = test::shape(1, 4, 4, 40, 70, 192);
  p.head_dim_v = 128;
  std::string runs;
  for (const Kernel* k : registry()) {
    if (k->capabilities().head_dim_v) runs += std::string(k->name()) + " ";
  }
  for (const Kernel* k : variants()) {
    const Support s = supports_problem(*k, p);
    if (k->capabilities().head_dim_v) {
      EXPECT_TRUE(s || s.reason.find("head_dim_v") == std::string::npos) << k->name() << ": " << s.reason;
      continue;
    }
    ASSERT_FALSE(s) << k->name();
    EXPECT_NE(s.reason.find("head_dim_v != head_dim"), std::string::npos) << s.reason;
    for (const Kernel* r : registry()) {
      const bool named = s.reason.find(std::string(r->name()) + ",") != std::string::npos ||
                         s.reason.find(std::string(r->name()) + " ") != std::string::npos;
      EXPECT_EQ(named, r->capabilities().head_dim_v)
          << r->name() << " in: " << s.reason << " (runs it: " << runs << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, KernelAgreement, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return test::variant_name(*info.param.kernel) + "_" + info.param.c.name;
                         });

// Dispatch: with nothing named, the SIMD kernels use the widest target this CPU runs. A run
// that knows its CPU says which target that must be in ATTN_EXPECT_ISA (the aarch64 cross run
// under qemu: neon), so a build whose detection misses its vector unit fails here.
TEST(Dispatch, TheDefaultTargetIsTheWidestThisCpuRuns) {
  if (const char* isa = std::getenv("ATTN_ISA"); isa && *isa) GTEST_SKIP() << "ATTN_ISA=" << isa << " names one";
  const std::vector<std::string> runs = runnable_isas();
  ASSERT_FALSE(runs.empty());
  EXPECT_EQ(runs.front(), "scalar");
  EXPECT_EQ(best_isa(), runs.back());
  EXPECT_EQ(default_isa(), best_isa());
  if (const char* want = std::getenv("ATTN_EXPECT_ISA"); want && *want) {
    EXPECT_EQ(default_isa(), want) << "built: " << isa_names(built_isas()) << "; CPU features: " << cpu_isa_features();
  }
}

}  // namespace
}  // namespace attnlab
