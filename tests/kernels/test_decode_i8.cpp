// decode_i8's integer P.V (src/cpu/simd/int8_dot.hpp: round_p_rows, pv_tile_i8) beyond the shared
// grids (test_kv_quant's cache grid, special values and planted reader bugs, test_paged, test_pattern
// run it on every cache type, mask and layout): the Int8Products baseline on a cache rounds P as
// the kernel does (verify.cpp: int8_cache_errors, round_p_tile's rule), so a test-only kernel of
// the same arithmetic passes with the rule and fails with a bug planted in it; and every target's
// kernel multiplies the rule's codes (its O sits on the rounded plain kernel's, not on float P's).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "attnlab/isa.hpp"
#include "attnlab/kernel.hpp"
#include "attnlab/kv_quant.hpp"
#include "attnlab/blocks/kv_read.hpp"
#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"
#include "attnlab/verify.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

using test::runnable;

// Whether this variant multiplies P.V in integers here: vpdpbusd where the target's VNNI unit runs,
// the rule's sums on the scalar and NEON targets (tiles.cpp: i8_pv_runs).
bool pv_in_integers(const Kernel& k) {
  const std::string isa(k.isa());
  if (isa == "avx512") return cpu_runs_isa("avx512_vnni");
  if (isa == "avx2") return cpu_runs_isa("avx_vnni");
  return true;
}

Problem cache_problem(int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d, KvDType t) {
  Problem p;
  p.batch = 1, p.q_heads = hq, p.kv_heads = hkv, p.q_len = sq, p.kv_len = sk, p.head_dim = d;
  p.kv_dtype = t;
  p.causal = CausalAlign::BottomRight;
  return p;
}

// Float inputs with V offset by `v_offset` (not centred values: a P.V error scales with them), then
// written into the cache type.
Tensors cache_inputs(const Problem& p, uint64_t seed, float v_offset) {
  Problem f = p;
  f.kv_dtype = KvDType::Same;
  Tensors floats = random_tensors(f, seed);
  for (int64_t h = 0; h < p.kv_heads; ++h)
    for (int64_t j = 0; j < p.kv_len; ++j) {
      float* v = const_cast<float*>(floats.inputs.v.row(0, h, j));
      for (int64_t i = 0; i < p.dim_v(); ++i) v[i] += v_offset;
    }
  return convert_inputs(p, floats.inputs);
}

KernelCheck check(const Kernel& k, const Problem& p, const Tensors& t, int threads = 2) {
  return test::check_all_rows(k, p, t, threads);
}

// Key j's V value in units of its scale, and the scale of its column block (u8 / u4: the row's).
double unit_of(KvDType t, const std::byte* row, int64_t i) {
  const auto* u = reinterpret_cast<const uint8_t*>(row);
  switch (t) {
    case KvDType::U8: return u[8 + i] - double{kv_read::load_f32(row + 4)};
    case KvDType::U4: return (i % 2 ? u[8 + i / 2] >> 4 : u[8 + i / 2] & 0x0f) - double{kv_read::load_f32(row + 4)};
    case KvDType::Q8_0: return static_cast<int8_t>(u[i / 32 * 34 + 2 + i % 32]);
    default: {
      const uint8_t* blk = u + i / 32 * 18 + 2;
      return (i % 32 < 16 ? blk[i % 32] & 0x0f : blk[i % 32 - 16] >> 4) - 8;
    }
  }
}
double scale_of(KvDType t, const std::byte* row, int64_t block) {
  if (t == KvDType::U8 || t == KvDType::U4) return kv_read::load_f32(row);
  return kv_read::scale_f16(row + block * (t == KvDType::Q8_0 ? 34 : 18));
}

// decode_i8's arithmetic written plainly: Q rounded by round_q_row, scores in float64 on it against
// the cache as stored, and P.V with P times V's scales rounded per whole 64-key tile and V scale block
// by round_p_tile (the zero points' share taken with the rounded weights) - with one bug planted.
enum class Bug {
  None,
  FloatP,              // no rounding of P at all (the float32 P.V)
  LevelsOffByOne,      // the quantum as wmax / (L + 1)
  TruncatedCodes,      // codes truncated, not rounded
  ZeroPointUnshifted,  // u8: the vector path's codes c - 128 without the zero point moved by 128
  StaleTile,           // a tile multiplies the previous tile's codes
};

class PlantedPv final : public Kernel {
 public:
  explicit PlantedPv(Bug bug) : bug_(bug) {}
  std::string_view name() const override { return "planted_pv"; }
  std::string_view description() const override { return "test-only decode_i8 arithmetic with one planted bug"; }
  const Capabilities& capabilities() const override {
    static constexpr Capabilities k{.head_dim_v = true, .kv_quant = true, .arithmetic = Arithmetic::Int8Products};
    return k;
  }
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext&) const override {
    const DequantizedKv dq = dequantize_kv(p, in);
    const KvDType t = p.kv_dtype;
    const bool row_type = t == KvDType::U8 || t == KvDType::U4;
    const int64_t d = p.head_dim, dv = p.dim_v(), nblk = row_type ? 1 : dv / 32, span = row_type ? dv : 32;
    std::vector<int8_t> qc(static_cast<size_t>(d));
    std::vector<float> qs(static_cast<size_t>(d));
    for (int64_t h = 0; h < p.q_heads; ++h) {
      const int64_t hk = p.kv_head_of(h);
      for (int64_t i = 0; i < p.q_len; ++i) {
        ASSERT_TRUE(round_q_row(t, in.q.row(0, h, i), d, qc.data(), qs.data()));
        const Interval iv = p.mask_for_batch(0).row(i);
        std::vector<double> s;
        double m = -INFINITY;
        for (int64_t j = iv.lo; j < iv.hi; ++j) {
          const float* k = dq.inputs.k.row(0, hk, j);
          double dot = 0;
          for (int64_t x = 0; x < d; ++x) dot += static_cast<double>(qc[x]) * qs[x / q_block_values(t, d)] * k[x];
          s.push_back(dot * p.effective_scale());
          m = std::max(m, s.back());
        }
        std::vector<float> pj(s.size());
        double l = 0;
        for (size_t x = 0; x < s.size(); ++x) pj[x] = static_cast<float>(std::exp(s[x] - m)), l += pj[x];
        std::vector<double> o(static_cast<size_t>(dv), 0.0);
        std::vector<int32_t> codes(static_cast<size_t>(nblk * 64)), prev;
        std::vector<float> quantum(static_cast<size_t>(nblk)), w(64);
        for (int64_t j = iv.lo; j < iv.hi;) {
          const int64_t x = j - iv.lo;
          const bool whole = j % 64 == 0 && j + 64 <= iv.hi && bug_ != Bug::FloatP;
          if (!whole) {
            const float* v = dq.inputs.v.row(0, hk, j);
            for (int64_t c = 0; c < dv; ++c) o[c] += double{pj[x]} * v[c];
            ++j;
            continue;
          }
          for (int64_t b = 0; b < nblk; ++b) {
            for (int y = 0; y < 64; ++y) {
              w[y] = pj[x + y] * static_cast<float>(scale_of(t, in.vq.row(0, hk, j + y), b));
            }
            ASSERT_TRUE(round_p_tile(w.data(), 64, p_codes_signed(t), &codes[b * 64], &quantum[b]));
            if (bug_ == Bug::LevelsOffByOne) quantum[b] *= p_codes_signed(t) ? 127.f / 128.f : 255.f / 256.f;
            if (bug_ == Bug::TruncatedCodes) {
              const float wmax = quantum[b] * (p_codes_signed(t) ? 127.f : 255.f);
              for (int y = 0; y < 64; ++y) {
                codes[b * 64 + y] =
                    wmax > 0 ? static_cast<int32_t>(w[y] * ((p_codes_signed(t) ? 127.f : 255.f) / wmax)) : 0;
              }
            }
          }
          const std::vector<int32_t> mine = codes;
          if (bug_ == Bug::StaleTile && !prev.empty()) codes = prev;
          prev = mine;
          for (int y = 0; y < 64; ++y) {
            const std::byte* vr = in.vq.row(0, hk, j + y);
            for (int64_t c = 0; c < dv; ++c) {
              const int64_t b = c / span;
              const double u = unit_of(t, vr, c) - (bug_ == Bug::ZeroPointUnshifted ? 128.0 : 0.0);
              o[c] += double{quantum[b]} * codes[b * 64 + y] * u;
            }
          }
          j += 64;
        }
        float* dst = out.o.row(0, h, i);
        for (int64_t c = 0; c < dv; ++c) dst[c] = static_cast<float>(o[c] / l);
        out.lse[h * p.q_len + i] = static_cast<float>(m + std::log(l));
      }
    }
  }

 private:
  Bug bug_;
};

// The shapes: GQA 4 (a 4-row panel), MHA (1 row), group 6 (6 rows: two passes of the AVX-512 rows),
// d 96 (a half chunk on AVX-512, a third on AVX2), d_v != d, q_len 2 (tiles the two rows see
// differently), 300 keys (4 whole tiles and a partial one).
std::vector<Problem> shapes(KvDType t) {
  std::vector<Problem> out;
  out.push_back(cache_problem(8, 2, 1, 300, 64, t));
  out.push_back(cache_problem(2, 2, 1, 300, 96, t));
  out.push_back(cache_problem(12, 2, 2, 300, 128, t));
  out.back().head_dim_v = 64;
  return out;
}

TEST(DecodeI8, PlantedPBugsFailUnderTheInt8Tolerance) {
  int ran = 0;
  for (KvDType t : {KvDType::U8, KvDType::U4, KvDType::Q8_0, KvDType::Q4_0}) {
    for (const Problem& p : shapes(t)) {
      const Tensors in = cache_inputs(p, 23, 1.5f);
      for (Bug bug : {Bug::None, Bug::LevelsOffByOne, Bug::TruncatedCodes, Bug::ZeroPointUnshifted, Bug::StaleTile}) {
        if (bug == Bug::ZeroPointUnshifted && t != KvDType::U8) continue;
        const KernelCheck c = check(PlantedPv(bug), p, in);
        EXPECT_EQ(c.verdict, bug == Bug::None ? Verdict::Pass : Verdict::Fail)
            << to_string(t) << " " << p.describe() << " bug " << static_cast<int>(bug) << " (O err " << c.errors.o_rel
            << ", tol " << c.tol.o_rel << ")";
        ++ran;
      }
      for (const Kernel* k : runnable("decode_i8")) {
        const KernelCheck c = check(*k, p, in);
        EXPECT_EQ(c.verdict, Verdict::Pass)
            << k->isa() << " " << to_string(t) << " " << p.describe() << ": " << c.reason;
      }
    }
  }
  EXPECT_GT(ran, 0);
}

double rms_diff(const Tensors& a, const Tensors& b, int64_t n) {
  double s = 0;
  for (int64_t x = 0; x < n; ++x) s += (double{a.o[x]} - b.o[x]) * (double{a.o[x]} - b.o[x]);
  return std::sqrt(s / static_cast<double>(n));
}

// Every target multiplies the rule's codes: its O is far closer to the plain kernel with P rounded
// than that is to the plain kernel with float P (a float32 score moves a code across a half now and
// then: the RMS, not the max). ATTN_I8_PV=0 puts every target back on float P.
TEST(DecodeI8, EveryTargetMultipliesTheRulesCodes) {
  int ran = 0;
  for (KvDType t : {KvDType::U8, KvDType::U4, KvDType::Q8_0, KvDType::Q4_0}) {
    for (const Problem& p : shapes(t)) {
      const Tensors in = cache_inputs(p, 29, 1.5f);
      const Tensors rounded = allocate_outputs(p), floated = allocate_outputs(p);
      RunContext ctx;
      PlantedPv(Bug::None).run(p, in.inputs, rounded.outputs, ctx);
      PlantedPv(Bug::FloatP).run(p, in.inputs, floated.outputs, ctx);
      const double gap = rms_diff(rounded, floated, p.o_elems());
      ASSERT_GT(gap, 0) << "rounding P changes O";
      for (const char* env : {"1", "0"}) {
        ASSERT_EQ(setenv("ATTN_I8_PV", env, 1), 0);
        for (const Kernel* k : runnable("decode_i8")) {
          const Tensors o = allocate_outputs(p);
          Session(*k, p, 2).run(in.inputs, o.outputs);
          const bool integers = env[0] == '1' && pv_in_integers(*k);
          const double near = rms_diff(o, integers ? rounded : floated, p.o_elems());
          EXPECT_LT(near, 0.25 * gap) << k->isa() << " " << to_string(t) << " ATTN_I8_PV=" << env << " " << p.describe()
                                      << ": not the " << (integers ? "rounded" : "float") << " P";
          ++ran;
        }
      }
      unsetenv("ATTN_I8_PV");
    }
  }
  EXPECT_GT(ran, 0);
}

}  // namespace
}  // namespace attnlab
