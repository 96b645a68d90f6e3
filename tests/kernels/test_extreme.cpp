// Special values, for every registered kernel and for the CUDA kernels' device code under the
// host emulation (tests/cuda_emu.hpp). The rule (docs/operation.md,
// include/attnlab/blocks/online_softmax.hpp): NaN and Inf reach O and LSE exactly as in the float64
// reference, row by row and element by element; a fully masked row is O = 0, LSE = -inf
// whatever its inputs hold; values a row does not see never reach it.
//
// The special-value matrix plants ONE value at ONE place per case:
//   value   NaN, +Inf, -Inf, +1e30, -1e30 (1e30: scores ~1e29, finite in float but far past
//           exp's range without the max subtraction: one-hot rows that must stay finite)
//   tensor  Q, K, V
//   place   for K/V: the first key of a 64-key tile, lane 3 of its last 16-key vector, lane
//           15 of its second, lane 0 of its last, its last key (whether a vector max keeps
//           or drops a NaN depends on its lane and on the instruction order the compiler
//           picks; the tile is one where a row's running max is still -inf: the first one
//           row 0 sees, or 512..575 for q_len 1: a later decode chunk's first tile),
//           the last key of the batch entry's kv length, a key outside some rows' intervals
//           inside a tile they partly see, a key seen by only some rows of a register panel,
//           the only key some row sees; for Q: query rows at similar places (a fully masked
//           row for "masked")
//   q_len   128 (kv_len 200) and 1 (kv_len 1100: decode's key chunks - 128..512 keys here, so
//           512 starts one - and their merge)
// crossed in full (less the places a problem cannot have), with the mask (none, causal,
// window, kv_lens + causal), head_dim (16, 24, 72: vector tails) and the head_dim lane of the
// plant (0, 3, d - 5, d - 1: tail lanes) rotating so that every pair of factors meets
// (SpecialValueMatrix.CoversEveryPairOfFactors). Each case checks, for every row and element,
// that O and LSE are finite / NaN / +Inf / -Inf exactly where the reference is, and that the
// finite ones are within the tolerance (verify.hpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "attnlab/kernel.hpp"
#include "attnlab/verify.hpp"
#include "cuda_emu.hpp"
#include "test_util.hpp"

namespace attnlab {

// Test names and messages show the kernel's name, not its address.
void PrintTo(const Kernel* k, std::ostream* os) { *os << test::variant_name(*k); }

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

// Every registry variant (the SIMD kernels once per built target), then the emulated CUDA
// device code.
std::vector<const Kernel*> kernels_under_test() {
  std::vector<const Kernel*> ks = variants();
  ks.push_back(&test::emulated_cuda("naive"));
  ks.push_back(&test::emulated_cuda("flash"));
  ks.push_back(&test::emulated_cuda("flash_bf16"));
  ks.push_back(&test::emulated_cuda("decode"));
  return ks;
}

std::string kernel_name(const Kernel* k) { return test::variant_name(*k); }

// ---- running a kernel and comparing element classes ------------------------------------

enum class Class { Finite, Nan, PosInf, NegInf };

Class classify(double x) {
  if (std::isnan(x)) return Class::Nan;
  if (std::isinf(x)) return x > 0 ? Class::PosInf : Class::NegInf;
  return Class::Finite;
}

const char* to_string(Class c) {
  switch (c) {
    case Class::Finite: return "finite";
    case Class::Nan: return "NaN";
    case Class::PosInf: return "+Inf";
    case Class::NegInf: return "-Inf";
  }
  return "?";
}

// Runs k on `in` (outputs pre-filled with a finite sentinel, so an element the kernel does
// not write shows up wherever the reference is not exactly that value) and returns what
// disagrees with the reference: an element whose class differs, or the tolerance verdict.
// Empty when it agrees. `skip` gets the reason when the kernel cannot run the problem.
std::string run_and_compare(const Kernel& k, const Problem& p, const Inputs& in, std::string* skip) {
  if (const DType d = test::native_dtype(k); p.dtype == DType::F32 && d != DType::F32) {
    // A bf16-only kernel (flash_bf16): the same values rounded to its storage (NaN and Inf stay).
    Problem q = p;
    q.dtype = d;
    const Tensors c = convert_inputs(q, in);
    return run_and_compare(k, q, c.inputs, skip);
  }
  if (Support s = supports_problem(k, p); !s) {
    *skip = s.reason;
    return "";
  }
  const auto o = alloc_floats(static_cast<size_t>(p.q_elems()));
  const auto lse = alloc_floats(static_cast<size_t>(p.lse_elems()));
  std::fill(o.get(), o.get() + p.q_elems(), -12345.f);
  std::fill(lse.get(), lse.get() + p.lse_elems(), -12345.f);
  const Outputs out{make_view<float>(o.get(), p.batch, p.q_heads, p.q_len, p.head_dim, p.layout), lse.get()};
  Session session(k, p, 2);
  session.run(in, out);

  const Agreement a = prepare_agreement(p, in, all_rows(p));
  std::ostringstream why;
  int shown = 0;
  auto mismatch = [&](const RowId& id, const char* what, int64_t d, double got, double want) {
    if (classify(got) == classify(want)) return;
    if (shown++ < 4) {
      why << "\n    row (b=" << id.b << ", h=" << id.h << ", i=" << id.i << ") " << what;
      if (d >= 0) why << "[" << d << "]";
      why << ": got " << to_string(classify(got)) << " (" << got << "), reference " << to_string(classify(want));
    }
  };
  for (size_t r = 0; r < a.ref.rows.size(); ++r) {
    const RowId& id = a.ref.rows[r];
    const float* row = out.o.row(id.b, id.h, id.i);
    for (int64_t d = 0; d < p.head_dim; ++d) mismatch(id, "O", d, row[d], a.ref.o[r * p.head_dim + d]);
    mismatch(id, "LSE", -1, out.lse[(id.b * p.q_heads + id.h) * p.q_len + id.i], a.ref.lse[r]);
  }
  if (shown > 4) why << "\n    ... " << shown - 4 << " more elements of another class";
  const Errors e = measure(a.ref, as_const(out.o), out.lse, p);
  if (const std::string t = tolerance_for(k, p, in, a).why_failed(e); !t.empty()) why << "\n    " << t;
  return why.str();
}

// ---- the matrix ----------------------------------------------------------------------------

enum class Target { Q, K, V };
enum class Place { TileFirst, Lane3, Lane15, TileLast, Tail, Masked, PanelEdge, VecFirst, LoneKey };
enum class MaskKind { None, Causal, Window, KvLens };
constexpr int kValues = 5, kTargets = 3, kPlaces = 9, kQLens = 2, kMasks = 4, kDims = 3, kLanes = 4;
constexpr float kValueOf[kValues] = {std::numeric_limits<float>::quiet_NaN(), kInf, -kInf, 1e30f, -1e30f};
const char* const kValueName[kValues] = {"NaN", "PosInf", "NegInf", "Big", "NegBig"};
const char* const kTargetName[kTargets] = {"Q", "K", "V"};
const char* const kPlaceName[kPlaces] = {"tile_first", "lane3",      "lane15",       "tile_last", "tail",
                                         "masked",     "panel_edge", "vector_first", "lone_key"};
const char* const kMaskName[kMasks] = {"none", "causal", "window", "kvlens"};
constexpr int64_t kQLenOf[kQLens] = {128, 1};
constexpr int64_t kDimOf[kDims] = {16, 24, 72};
// The first row that sees the key planted at "panel_edge". Row 36, which does not, shares
// with it a flash panel (positions 36..38: 6 rows at GQA 2), a simd row group (36..39) and
// a cuda_flash thread's rows (36, 37).
constexpr int64_t kPanelRow = 37;

struct Case {
  int value = 0, target = 0, place = 0, qlen = 0, mask = 0, dim = 0, lane = 0;  // factor indices
  Problem p;
  int64_t b = 0, h = 0, pos = 0, d = 0;  // planted at Q[b, h, pos, d] or K/V[b, h, pos, d]
  std::string name() const {
    std::ostringstream s;
    s << kValueName[value] << " in " << kTargetName[target] << "[b=" << b << ", h=" << h
      << (target == 0 ? ", i=" : ", j=") << pos << ", d=" << d << "] (" << kPlaceName[place] << "), mask "
      << kMaskName[mask] << ", q_len " << p.q_len << ", kv_len " << p.kv_len << ", head_dim " << p.head_dim;
    return s.str();
  }
};

Problem problem_for(int qlen, int mask, int dim) {
  const int64_t q_len = kQLenOf[qlen], kv_len = q_len == 1 ? 1100 : 200;
  Problem p = test::shape(mask == 3 ? 2 : 1, 2, 1, q_len, kv_len, kDimOf[dim]);  // GQA 2/1
  switch (static_cast<MaskKind>(mask)) {
    case MaskKind::None: break;
    case MaskKind::Causal: p.causal = CausalAlign::BottomRight; break;
    case MaskKind::Window:
      p.window_left = q_len == 1 ? 600 : 40;
      p.window_right = 8;
      break;
    case MaskKind::KvLens:  // the plant goes to batch 1: q_len 128 gives fully masked rows 0..27
      p.kv_lens = {kv_len, q_len == 1 ? 777 : 100};
      p.causal = CausalAlign::BottomRight;
      break;
  }
  return p;
}

// Whether some row of batch b does not see key j while seeing another key of j's 64-key tile.
bool masked_in_partly_visible_tile(const Problem& p, int64_t b, int64_t j) {
  const int64_t t0 = j / 64 * 64;
  for (int64_t i = 0; i < p.q_len; ++i) {
    const Interval iv = p.visible(b, i);
    const bool sees_tile = std::max(iv.lo, t0) < std::min(iv.hi, t0 + 64);
    if (sees_tile && !(iv.lo <= j && j < iv.hi)) return true;
  }
  return false;
}

// The planted query row (Q) or key (K, V) of a place; -1 when the problem has no such place.
int64_t position_of(const Problem& p, Target target, Place place) {
  const int64_t b = p.batch - 1;
  const MaskSpec m = p.mask_for_batch(b);
  const bool decode = p.q_len == 1;
  const bool diagonal = p.causal != CausalAlign::None || p.window_left >= 0;
  if (target == Target::Q) {
    if (place == Place::Masked || place == Place::LoneKey) {  // a fully masked row / one key
      for (int64_t i = 0; i < p.q_len; ++i)
        if (m.row(i).size() == (place == Place::Masked ? 0 : 1)) return i;
      return -1;
    }
    if (decode) return place == Place::PanelEdge ? -1 : 0;
    const int64_t rows[] = {64, 67, 79, 63, 127, -1, kPanelRow, 48};
    return rows[static_cast<int>(place)];
  }
  // A row's first tile, where its running max is still -inf: tiles start at the first key
  // row 0 sees; with q_len 1 the first tile of a later decode chunk. Later tiles get the
  // tail, "masked" and "panel_edge" places.
  const int64_t tile = decode ? 512 : m.rows(0, p.q_len).lo;
  switch (place) {
    case Place::TileFirst: return tile;
    case Place::Lane3: return tile + 51;   // lane 3 of the tile's last 16-key vector
    case Place::Lane15: return tile + 31;  // lane 15 of its second vector
    case Place::TileLast: return tile + 63;
    case Place::VecFirst: return tile + 48;  // lane 0 of the last vector
    case Place::Tail: return m.kv_len - 1;
    case Place::Masked: {
      if (!diagonal && p.kv_lens.empty()) return -1;
      const int64_t j =
          decode ? (p.kv_lens.empty() ? 460 : 800) : (p.kv_lens.empty() ? (p.window_left >= 0 ? 90 : 100) : 110);
      return masked_in_partly_visible_tile(p, b, j) ? j : -1;
    }
    case Place::LoneKey: {  // the only key some row sees (its running max is -inf before)
      for (int64_t i = 0; i < p.q_len; ++i)
        if (m.row(i).size() == 1) return m.row(i).lo;
      return -1;
    }
    case Place::PanelEdge: {
      if (decode || !diagonal) return -1;
      const int64_t j = m.row(kPanelRow).hi - 1;
      const bool edge = m.row(kPanelRow).lo <= j && m.row(kPanelRow - 1).hi <= j;
      return edge ? j : -1;
    }
  }
  return -1;
}

// value x target x place x q_len in full; mask, head_dim and lane rotate (see the header).
std::vector<Case> matrix() {
  std::vector<Case> cases;
  int n = 0;
  for (int v = 0; v < kValues; ++v)
    for (int t = 0; t < kTargets; ++t)
      for (int pl = 0; pl < kPlaces; ++pl)
        for (int ql = 0; ql < kQLens; ++ql) {
          Case c;
          c.value = v, c.target = t, c.place = pl, c.qlen = ql;
          c.dim = n % kDims;
          c.lane = (n / 2 + 3 * v) % kLanes;
          c.pos = -1;
          for (int k = 0; k < kMasks && c.pos < 0; ++k) {  // the first mask that has the place
            c.mask = (n + k) % kMasks;
            c.p = problem_for(ql, c.mask, c.dim);
            c.pos = position_of(c.p, static_cast<Target>(t), static_cast<Place>(pl));
          }
          if (c.pos < 0) continue;
          const int64_t dim = c.p.head_dim;
          const int64_t lanes[kLanes] = {0, 3, dim - 5, dim - 1};
          c.d = lanes[c.lane];
          c.b = c.p.batch - 1;
          c.h = t == 0 ? 1 : 0;  // Q: the group's second head (flash interleaves the heads)
          cases.push_back(c);
          ++n;
        }
  return cases;
}

void plant(const Case& c, Tensors& t) {
  const ConstView& view = c.target == 0 ? t.inputs.q : c.target == 1 ? t.inputs.k : t.inputs.v;
  const_cast<float*>(view.row(c.b, c.h, c.pos))[c.d] = kValueOf[c.value];
}

TEST(SpecialValueMatrix, CoversEveryPairOfFactors) {
  const std::vector<Case> cases = matrix();
  const int sizes[] = {kValues, kTargets, kPlaces, kQLens, kMasks, kDims, kLanes};
  auto factors = [](const Case& c) {
    return std::vector<int>{c.value, c.target, c.place, c.qlen, c.mask, c.dim, c.lane};
  };
  // A pair no problem can have (e.g. Q at "panel_edge" with q_len 1) is exempt. Value,
  // head_dim and lane never decide whether a place exists (-1: any value).
  auto possible = [&](int fa, int a, int fb, int b) {
    for (int t = 0; t < kTargets; ++t)
      for (int pl = 0; pl < kPlaces; ++pl)
        for (int ql = 0; ql < kQLens; ++ql)
          for (int m = 0; m < kMasks; ++m) {
            if (position_of(problem_for(ql, m, 0), static_cast<Target>(t), static_cast<Place>(pl)) < 0) continue;
            const int f[] = {-1, t, pl, ql, m, -1, -1};
            if ((f[fa] < 0 || f[fa] == a) && (f[fb] < 0 || f[fb] == b)) return true;
          }
    return false;
  };
  int missing = 0;
  for (int fa = 0; fa < 7; ++fa)
    for (int fb = fa + 1; fb < 7; ++fb) {
      std::set<std::pair<int, int>> seen;
      for (const Case& c : cases) seen.insert({factors(c)[fa], factors(c)[fb]});
      for (int a = 0; a < sizes[fa]; ++a)
        for (int b = 0; b < sizes[fb]; ++b) {
          if (seen.count({a, b}) || !possible(fa, a, fb, b)) continue;
          ++missing;
          ADD_FAILURE() << "factors " << fa << " = " << a << " and " << fb << " = " << b << " never meet";
        }
    }
  EXPECT_EQ(missing, 0);
  std::printf("special-value matrix: %zu cases per kernel\n", cases.size());
}

// Runs matrix cases on k, each with its value planted (inputs seeded from seed, its place and
// target), against the reference element by element: a failure per disagreeing case (`with` after its
// name), the counts printed under `label`, the test skipped when none ran.
void check_cases(const Kernel& k, const std::vector<Case>& cases, uint64_t seed, const std::string& label,
                 const char* with = "") {
  int ran = 0, failed = 0;
  std::string skip;
  for (const Case& c : cases) {
    Tensors t = random_tensors(c.p, seed + c.place * 10 + c.target);
    plant(c, t);
    std::string why_skip;
    const std::string why = run_and_compare(k, c.p, t.inputs, &why_skip);
    if (!why_skip.empty()) {
      skip = why_skip;
      continue;
    }
    ++ran;
    if (!why.empty()) {
      ++failed;
      ADD_FAILURE() << k.name() << ", " << c.name() << with << ":" << why;
    }
  }
  std::printf("%s, %s: %d cases ran, %d failed\n", test::variant_name(k).c_str(), label.c_str(), ran, failed);
  if (ran == 0) GTEST_SKIP() << skip;
}

class SpecialValues : public ::testing::TestWithParam<std::tuple<const Kernel*, int>> {};

TEST_P(SpecialValues, MatchTheReferenceElementByElement) {
  const Kernel& k = *std::get<0>(GetParam());
  const int value = std::get<1>(GetParam());
  if (Support s = k.available(); !s) GTEST_SKIP() << s.reason;
  std::vector<Case> cases;
  for (const Case& c : matrix()) {
    if (c.value == value) cases.push_back(c);
  }
  check_cases(k, cases, 1000, kValueName[value]);
}

// Every other case of the matrix again under the score modifications (softcap 4, the standard ALiBi
// slopes, a sink logit: score_mod.hpp), for the kernels that state they run them: a NaN score stays
// NaN under softcap, an infinite one saturates at +-c (its row then finite), as the reference says.
class SpecialValuesScoreMods : public ::testing::TestWithParam<const Kernel*> {};

TEST_P(SpecialValuesScoreMods, MatchTheReferenceUnderTheModifications) {
  const Kernel& k = *GetParam();
  if (!k.capabilities().score_mods) GTEST_SKIP() << k.name() << " does not run score modifications";
  if (Support s = k.available(); !s) GTEST_SKIP() << s.reason;
  const std::vector<Case> all = matrix();
  std::vector<Case> cases;
  for (size_t n = 0; n < all.size(); n += test::small_mode() ? 6 : 2) {  // (sanitizer builds: every 6th)
    cases.push_back(all[n]);
    cases.back().p.softcap = 4.f, cases.back().p.alibi_standard = true, cases.back().p.sink_logits = {0.5f};
  }
  check_cases(k, cases, 2000, "score modifications", " with score modifications");
}

INSTANTIATE_TEST_SUITE_P(Kernels, SpecialValuesScoreMods, ::testing::ValuesIn(kernels_under_test()),
                         [](const ::testing::TestParamInfo<const Kernel*>& info) { return kernel_name(info.param); });

INSTANTIATE_TEST_SUITE_P(Kernels, SpecialValues,
                         ::testing::Combine(::testing::ValuesIn(kernels_under_test()), ::testing::Range(0, kValues)),
                         [](const ::testing::TestParamInfo<std::tuple<const Kernel*, int>>& info) {
                           return kernel_name(std::get<0>(info.param)) + "_" + kValueName[std::get<1>(info.param)];
                         });

// The comparison above can fail: naive with a planted NaN-handling bug of each common kind -
// NaN outputs zeroed (a NaN row taken for a masked one), Inf outputs turned to NaN, an O NaN
// column kept finite only in its last element - is caught on every case whose reference
// holds such an element, by the element classes themselves ("got finite ... reference NaN").
enum class Planted { NanToZero, InfToNan, LastNanColumnZero };
class PlantedNanBug final : public Kernel {
 public:
  explicit PlantedNanBug(Planted bug) : bug_(bug) {}
  std::string_view name() const override { return "planted_nan_bug"; }
  std::string_view description() const override { return "test: naive with a NaN-handling bug"; }
  size_t workspace_bytes(const Problem& p, int t) const override { return find_kernel("naive")->workspace_bytes(p, t); }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    find_kernel("naive")->run(p, in, out, ctx);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.q_heads; ++h)
        for (int64_t i = 0; i < p.q_len; ++i) {
          float* o = out.o.row(b, h, i);
          for (int64_t d = 0; d < p.head_dim; ++d) {
            if (bug_ == Planted::NanToZero && std::isnan(o[d])) o[d] = 0;
            if (bug_ == Planted::InfToNan && std::isinf(o[d])) o[d] = kNan;
            if (bug_ == Planted::LastNanColumnZero && d == p.head_dim - 1 && std::isnan(o[d])) o[d] = 0;
          }
        }
  }

 private:
  Planted bug_;
};

TEST(SpecialValuesPlanted, EveryPlantedNanBugIsCaught) {
  for (const Planted bug : {Planted::NanToZero, Planted::InfToNan, Planted::LastNanColumnZero}) {
    const PlantedNanBug k(bug);
    int affected = 0, caught = 0;
    for (const Case& c : matrix()) {
      if (c.value > 2) continue;  // NaN, +Inf, -Inf
      Tensors t = random_tensors(c.p, 1000 + c.place * 10 + c.target);
      plant(c, t);
      // Whether the reference holds an element the bug changes.
      const Agreement a = prepare_agreement(c.p, t.inputs, all_rows(c.p));
      bool hit = false;
      for (size_t r = 0; r < a.ref.rows.size(); ++r)
        for (int64_t d = 0; d < c.p.head_dim; ++d) {
          const double x = a.ref.o[r * c.p.head_dim + d];
          hit |= bug == Planted::NanToZero  ? std::isnan(x)
                 : bug == Planted::InfToNan ? std::isinf(x)
                                            : d == c.p.head_dim - 1 && std::isnan(x);
        }
      if (!hit) continue;
      ++affected;
      std::string skip;
      const std::string why = run_and_compare(k, c.p, t.inputs, &skip);
      ASSERT_TRUE(skip.empty()) << skip;
      const bool by_class = why.find(bug == Planted::InfToNan ? "got NaN" : "got finite") != std::string::npos;
      caught += by_class;
      EXPECT_TRUE(by_class) << c.name() << ": the planted bug was not reported by class:" << why;
    }
    EXPECT_GT(affected, 10) << "the matrix must hold cases the planted bug changes";
    EXPECT_EQ(caught, affected);
  }
}

// The same matrix with 16-bit storage: the values are planted in float32, then Q, K, V are
// rounded to the dtype (1e30 becomes inf in f16), and the kernel must match the reference on
// the stored values. Every third case per value, to bound the time.
class SpecialValues16 : public ::testing::TestWithParam<std::tuple<const Kernel*, DType>> {};

TEST_P(SpecialValues16, MatchTheReferenceOnTheStoredValues) {
  const Kernel& k = *std::get<0>(GetParam());
  const DType dtype = std::get<1>(GetParam());
  if (Support s = k.available(); !s) GTEST_SKIP() << s.reason;
  int ran = 0, n = 0;
  std::string skip;
  for (const Case& c : matrix()) {
    if (n++ % 3 != 0) continue;
    Tensors t = random_tensors(c.p, 1000 + c.place * 10 + c.target);
    plant(c, t);
    Problem p = c.p;
    p.dtype = dtype;
    const Tensors stored = convert_inputs(p, t.inputs);
    std::string why_skip;
    const std::string why = run_and_compare(k, p, stored.inputs, &why_skip);
    if (!why_skip.empty()) {
      skip = why_skip;
      continue;
    }
    ++ran;
    if (!why.empty()) ADD_FAILURE() << k.name() << ", " << c.name() << ", " << to_string(dtype) << ":" << why;
  }
  if (ran == 0) GTEST_SKIP() << skip;
}

INSTANTIATE_TEST_SUITE_P(Kernels, SpecialValues16,
                         ::testing::Combine(::testing::ValuesIn(kernels_under_test()),
                                            ::testing::Values(DType::BF16, DType::F16)),
                         [](const ::testing::TestParamInfo<std::tuple<const Kernel*, DType>>& info) {
                           return kernel_name(std::get<0>(info.param)) + "_" + to_string(std::get<1>(info.param));
                         });

// ---- special values beyond one plant ------------------------------------------------------

class Extreme : public ::testing::TestWithParam<const Kernel*> {
 protected:
  void SetUp() override {
    if (Support a = GetParam()->available(); !a) GTEST_SKIP() << a.reason;
  }
  // Runs the kernel and compares with the reference, unless it does not support the problem.
  void expect_reference(const Problem& p, const Tensors& t, const std::string& what) {
    std::string skip;
    const std::string why = run_and_compare(*GetParam(), p, t.inputs, &skip);
    if (!skip.empty()) {
      skipped_ = skip;
      return;
    }
    ++ran_;
    EXPECT_TRUE(why.empty()) << what << ", " << p.describe() << ":" << why;
  }
  // Call last: a test whose every problem was unsupported is a skip, not a pass.
  void skip_if_nothing_ran() {
    if (ran_ == 0) GTEST_SKIP() << skipped_;
  }

 private:
  int ran_ = 0;
  std::string skipped_;
};

TEST_P(Extreme, HugeScoresStayFiniteAndCorrect) {
  Problem p = test::shape(1, 4, 2, 9, 70, 32);
  p.causal = CausalAlign::BottomRight;
  p.scale = 1.0f;
  Tensors t = random_tensors(p, 11);
  // |q.k| up to ~1e4: q and k entries of magnitude ~20.
  for (int64_t n = 0; n < p.q_elems(); ++n) t.q[n] *= 20.f;
  for (int64_t n = 0; n < p.kv_elems(); ++n) t.k[n] *= 20.f;
  const Agreement a = prepare_agreement(p, t.inputs, all_rows(p));
  double max_abs_lse = 0;
  for (double l : a.ref.lse) max_abs_lse = std::max(max_abs_lse, std::fabs(l));
  ASSERT_GT(max_abs_lse, 1000.0);  // the test really reaches large scores
  expect_reference(p, t, "scores ~1e4");
  skip_if_nothing_ran();
}

// Every masked K and V element holds NaN (then +Inf, -Inf): past kv_lens, outside the
// window, a batch entry with kv_len 0. Nothing may reach any row.
TEST_P(Extreme, MaskedPositionsNeverLeak) {
  for (const int64_t q_len : {5, 70}) {
    Problem p = test::shape(2, 2, 2, q_len, 130, 24);
    p.kv_lens = {97, 0};
    p.window_left = 3, p.window_right = 0;
    for (const float value : {kNan, kInf, -kInf}) {
      Tensors t = random_tensors(p, 6);
      int64_t planted = 0;
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t j = 0; j < p.kv_len; ++j) {
          bool seen = false;
          for (int64_t i = 0; i < p.q_len; ++i) seen = seen || (p.visible(b, i).lo <= j && j < p.visible(b, i).hi);
          if (seen) continue;
          ++planted;
          for (int64_t h = 0; h < p.kv_heads; ++h)
            for (int64_t d = 0; d < p.head_dim; ++d) {
              const_cast<float*>(t.inputs.k.row(b, h, j))[d] = value;
              const_cast<float*>(t.inputs.v.row(b, h, j))[d] = value;
            }
        }
      ASSERT_GT(planted, p.kv_len);
      const Agreement a = prepare_agreement(p, t.inputs, all_rows(p));
      for (double l : a.ref.lse) ASSERT_FALSE(std::isnan(l));  // the reference sees none of them
      expect_reference(p, t, "every masked K/V element " + std::to_string(value));
    }
  }
  skip_if_nothing_ran();
}

// Scores of -inf (and of -1e29, which underflow): such a key has p = 0, but 0 * V_j is still
// computed, so a NaN or Inf in its V row reaches that O column; a row whose visible scores are
// ALL -inf is 0/0 = NaN (O and LSE), while a fully masked row stays O = 0, LSE = -inf.
TEST_P(Extreme, ZeroWeightKeysStillMultiplyTheirValues) {
  struct Shape {
    int64_t q_len, kv_len;
    CausalAlign causal;
  };
  for (const Shape& s : {Shape{1, 1100, CausalAlign::None}, Shape{90, 150, CausalAlign::TopLeft}}) {
    Problem p = test::shape(1, 2, 1, s.q_len, s.kv_len, 24);
    p.causal = s.causal;
    if (s.causal == CausalAlign::TopLeft) p.window_left = 40;  // rows 0..39 see key 0
    for (const float low : {-kInf, -1e30f}) {
      Tensors t = random_tensors(p, 21);
      for (int64_t h = 0; h < p.q_heads; ++h)
        for (int64_t i = 0; i < p.q_len; ++i) const_cast<float*>(t.inputs.q.row(0, h, i))[0] = 1.f;
      // One zero-weight key with a NaN and an Inf in its V row (key 0: visible to some rows
      // of q_len 90; key 700: in a later decode chunk), ...
      const int64_t j = s.q_len == 1 ? 700 : 0;
      const_cast<float*>(t.inputs.k.row(0, 0, j))[0] = low;
      const_cast<float*>(t.inputs.v.row(0, 0, j))[5] = kNan;
      const_cast<float*>(t.inputs.v.row(0, 0, j))[17] = kInf;
      expect_reference(p, t, "one key scored " + std::to_string(low));
      // ... then all keys of a row's first tile, before keys with finite scores (q_len 90:
      // keys 0..87, so row 90's first tile [24, 88) of a 64-key tiling from its 32-row
      // block's first key 24 holds only them; q_len 1: whole decode chunks from key 512) ...
      const int64_t from = s.q_len == 1 ? 512 : 0, to = s.q_len == 1 ? 1024 : 88;
      for (int64_t k = from; k < to; ++k) const_cast<float*>(t.inputs.k.row(0, 0, k))[0] = low;
      expect_reference(
          p, t, "keys " + std::to_string(from) + ".." + std::to_string(to - 1) + " scored " + std::to_string(low));
      // ... then every key: rows with visible keys are NaN throughout.
      for (int64_t k = 0; k < p.kv_len; ++k) const_cast<float*>(t.inputs.k.row(0, 0, k))[0] = low;
      expect_reference(p, t, "every key scored " + std::to_string(low));
    }
  }
  skip_if_nothing_ran();
}

INSTANTIATE_TEST_SUITE_P(Kernels, Extreme, ::testing::ValuesIn(kernels_under_test()),
                         [](const ::testing::TestParamInfo<const Kernel*>& info) { return kernel_name(info.param); });

}  // namespace
}  // namespace attnlab
