// 16-bit storage: the conversions (exact widening, round-to-nearest-even narrowing, special
// values) against independent float64 arithmetic, and what a dtype changes in a Problem.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "attnlab/dtype.hpp"
#include "attnlab/kernel.hpp"
#include "attnlab/verify.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The f16 value of a bit pattern, from the format's definition (float64 arithmetic).
double f16_value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
  const double mag = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return sign ? -mag : mag;
}

// Round x to the nearest value of a set given by its neighbours lo <= x <= hi (ties: the
// one with an even last bit, told by `lo_even`).
double nearest(double x, double lo, double hi, bool lo_even) {
  const double dl = x - lo, dh = hi - x;
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return lo_even ? lo : hi;
}

TEST(Dtype, F16WideningIsExactForEveryPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = to_float(f16{static_cast<uint16_t>(h)});
    const int exp = (h >> 10) & 31;
    if (exp == 31) {
      if ((h & 1023) == 0)
        EXPECT_EQ(f, (h >> 15) ? -INFINITY : INFINITY);
      else
        EXPECT_TRUE(std::isnan(f)) << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), f16_value(static_cast<uint16_t>(h))) << h;
    EXPECT_EQ(to_f16(f).bits, h) << "round trip of pattern " << h;  // -0 included
  }
}

TEST(Dtype, Bf16WideningIsTheTopHalf) {
  for (uint32_t h = 0; h < 65536; h += 7) EXPECT_EQ(bits(to_float(bf16{static_cast<uint16_t>(h)})), h << 16);
}

// Narrowing against float64 rounding of the same value, over floats spread across every
// binade of float32 (and every f16 subnormal step near 2^-24).
TEST(Dtype, NarrowingRoundsToNearestEven) {
  uint64_t s = 12345;
  for (int n = 0; n < 400000; ++n) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float x = from_bits(static_cast<uint32_t>(s >> 32) & 0xffffffffu);
    if (!std::isfinite(x)) continue;
    // bf16: the neighbours of |x| are |x| with the low 16 bits cleared and one bf16 step
    // up (2^128 past the largest finite, where rounding up means inf).
    const double ax = std::fabs(static_cast<double>(x));
    const uint32_t t = bits(std::fabs(x)) & 0xffff0000u;
    const double lo = from_bits(t), hi = t + 0x10000u == 0x7f800000u ? 0x1p128 : from_bits(t + 0x10000u);
    double want = nearest(ax, lo, hi, ((t >> 16) & 1) == 0);
    if (want == 0x1p128) want = INFINITY;
    if (x < 0) want = -want;
    EXPECT_EQ(static_cast<double>(to_float(to_bf16(x))), want) << x;
  }
  // f16 across its range: every float in [2^-26, 65520] with a random mantissa.
  for (int n = 0; n < 200000; ++n) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const double e = -26.0 + 42.0 * static_cast<double>(s >> 11) / 9007199254740992.0;  // exponent
    const float x = static_cast<float>(std::exp2(e)) * ((s & 1) ? -1.f : 1.f);
    const float got = to_float(to_f16(x));
    // The two f16 neighbours of |x|: step 2^-24 below 2^-14, else 2^(floor(log2|x|) - 10).
    const double ax = std::fabs(static_cast<double>(x));
    const double step = ax < 0x1p-14 ? 0x1p-24 : std::ldexp(1.0, std::ilogb(ax) - 10);
    const double lo = std::floor(ax / step) * step, hi = lo + step;
    const bool lo_even = static_cast<int64_t>(lo / step) % 2 == 0;
    double want = nearest(ax, lo, hi, lo_even);
    if (want > 65504) want = INFINITY;
    EXPECT_EQ(static_cast<double>(got), x < 0 ? -want : want) << x;
  }
}

TEST(Dtype, SpecialValuesAndBoundaries) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {inf, -inf}) {
    EXPECT_EQ(to_float(to_bf16(x)), x);
    EXPECT_EQ(to_float(to_f16(x)), x);
  }
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(to_float(to_f16(std::nanf("")))));
  // A NaN whose payload sits in the dropped bits stays NaN (not inf).
  EXPECT_TRUE(std::isnan(to_float(to_bf16(from_bits(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(to_float(to_f16(from_bits(0x7f800001u)))));
  EXPECT_EQ(to_float(to_f16(65504.f)), 65504.f);
  EXPECT_EQ(to_float(to_f16(65519.f)), 65504.f);  // below the midpoint to 65536
  EXPECT_EQ(to_float(to_f16(65520.f)), inf);      // the tie rounds to even: inf
  EXPECT_EQ(to_float(to_f16(0x1p-25f)), 0.f);     // half the smallest subnormal: tie to 0
  EXPECT_EQ(to_float(to_f16(0x1.8p-25f)), 0x1p-24f);
  EXPECT_EQ(to_bf16(3.0e38f).bits, 0x7f62);    // 0x7f61b1e6: the dropped half is above the midpoint
  EXPECT_EQ(to_float(to_bf16(3.4e38f)), inf);  // past bf16's largest finite: inf
  EXPECT_EQ(bits(to_float(to_f16(-0.f))), 0x80000000u);
}

TEST(Dtype, ParseAndNames) {
  EXPECT_EQ(parse_dtype("bf16"), DType::BF16);
  EXPECT_EQ(parse_dtype("f16"), DType::F16);
  EXPECT_EQ(parse_dtype("f32"), DType::F32);
  try {
    parse_dtype("fp8");
    FAIL();
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("allowed: f32, bf16, f16"), std::string::npos) << e.what();
  }
}

TEST(Dtype, ProblemCountsTheStoredBytes) {
  Problem p = test::shape(1, 8, 2, 1, 4096, 128);
  const double f32_kv = p.kv_bytes(), f32_all = p.bytes_moved();
  p.dtype = DType::BF16;
  EXPECT_DOUBLE_EQ(p.kv_bytes(), f32_kv / 2);
  // Q halves too; O (q_elems floats) and LSE stay float32.
  EXPECT_DOUBLE_EQ(p.bytes_moved(), f32_all - f32_kv / 2 - 2.0 * p.q_elems());
  EXPECT_EQ(tensor_bytes(p), (p.q_elems() + 2 * p.kv_elems()) * 2 + (p.q_elems() + p.lse_elems()) * 4);
  EXPECT_NE(p.describe().find("dtype=bf16"), std::string::npos);
  EXPECT_DOUBLE_EQ(p.flops(), test::shape(1, 8, 2, 1, 4096, 128).flops());
}

// random_tensors at a 16-bit dtype holds the float32 draw rounded; the reference runs on
// those stored values, so a kernel that widened them exactly agrees to float32 accuracy.
TEST(Dtype, RandomTensorsAreTheRoundedFloat32Draw) {
  Problem p = test::shape(1, 2, 1, 5, 9, 24);
  const Tensors f = random_tensors(p, 4);
  for (DType d : {DType::BF16, DType::F16}) {
    p.dtype = d;
    const Tensors t = random_tensors(p, 4);
    ASSERT_EQ(t.inputs.dtype, d);
    ASSERT_EQ(t.inputs.q.data, nullptr);
    visit_inputs(t.inputs, [&](const auto& v) {
      for (int64_t j = 0; j < p.kv_len; ++j)
        for (int64_t c = 0; c < p.head_dim; ++c) {
          EXPECT_EQ(to_float(v.k.row(0, 0, j)[c]), round_to(d, f.inputs.k.row(0, 0, j)[c]));
          EXPECT_EQ(to_float(v.v.row(0, 0, j)[c]), round_to(d, f.inputs.v.row(0, 0, j)[c]));
        }
    });
  }
}

// A session refuses inputs of another dtype than its problem's (the kernel would read views
// that are not there).
TEST(Dtype, SessionRefusesInputsOfAnotherDtype) {
  Problem p = test::shape(1, 1, 1, 3, 3, 16);
  Tensors t = random_tensors(p, 1);
  p.dtype = DType::F16;
  Session s(kernel_or_throw("naive"), p, 1);
  EXPECT_THROW(s.run(t.inputs, t.outputs), InvalidInput);
}

}  // namespace
}  // namespace attnlab
