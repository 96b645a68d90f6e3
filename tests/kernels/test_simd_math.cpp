// Tests for src/cpu/simd/vec_math.hpp, for every built target the CPU runs (through the
// target's probes, src/cpu/dispatch/target.hpp): exp/exp2 accuracy over a dense sweep of the softmax
// range (bounds documented in the header), special values, reductions (including the
// transposed sum) and the tail-safe partial loads/stores.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attnlab/isa.hpp"
#include "attnlab/kv_quant.hpp"
#include "attnlab/blocks/kv_read.hpp"
#include "cpu/dispatch/isa_internal.hpp"

namespace attnlab {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kFltMin = std::numeric_limits<float>::min();

// Position of f on the line of representable floats (monotone; -0 and +0 coincide).
int64_t float_order(float f) {
  int32_t i;
  std::memcpy(&i, &f, sizeof i);
  return i < 0 ? -static_cast<int64_t>(i & 0x7fffffff) : i;
}

float from_order(int64_t o) {
  const int32_t i = o < 0 ? static_cast<int32_t>(static_cast<uint32_t>(-o) | 0x80000000u) : static_cast<int32_t>(o);
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}

float next_by(float x, int steps) {  // `steps` representable floats towards +inf
  return from_order(float_order(x) + steps);
}

// One target's probes; skips the test when this CPU cannot run the target.
class SimdMath : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!cpu_runs_isa(GetParam())) GTEST_SKIP() << "this CPU cannot run " << GetParam();
    t_ = target_table_for(GetParam());
    ASSERT_NE(t_, nullptr);
    lanes_ = t_->lanes;
  }
  float exp2_1(float x) const {
    float y;
    t_->probes.exp2_n(&x, &y, 1);
    return y;
  }
  float exp_1(float x) const {
    float y;
    t_->probes.exp_n(&x, &y, 1);
    return y;
  }
  const TargetTable* t_ = nullptr;
  int lanes_ = 1;
};

struct Accuracy {
  int64_t max_ulp = 0;
  double max_rel = 0;
  float worst = 0;
  int64_t points = 0;
};

// Evaluates f (element-wise over n floats) on every `stride`-th float of [lo, hi] (4096
// at a time) against the double reference; results the reference puts below FLT_MIN are
// flushed by design and skipped.
template <class R>
Accuracy sweep(float lo, float hi, int stride, void (*f)(const float*, float*, size_t), R ref) {
  Accuracy acc;
  constexpr int kBlock = 4096;
  std::vector<float> in(kBlock), out(kBlock);
  float x = lo;
  bool done = false;
  while (!done) {
    int n = 0;
    for (; n < kBlock && !done; ++n) {
      in[n] = x;
      x = next_by(x, stride);
      done = x > hi;
    }
    f(in.data(), out.data(), static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
      const double e = ref(static_cast<double>(in[j]));
      const float ef = static_cast<float>(e);
      if (ef < kFltMin || std::isinf(ef)) continue;
      const int64_t ulp = std::llabs(float_order(out[j]) - float_order(ef));
      const double rel = std::fabs(out[j] - e) / e;
      if (ulp > acc.max_ulp) {
        acc.max_ulp = ulp;
        acc.worst = in[j];
      }
      acc.max_rel = std::max(acc.max_rel, rel);
      ++acc.points;
    }
  }
  return acc;
}

// Every 61st float: about 1.8e7 points per range below 0 (a second or so in all).
constexpr int kStride = 61;

TEST_P(SimdMath, Exp2AccuracyOnSoftmaxRange) {
  const Accuracy a = sweep(-126.f, 0.f, kStride, t_->probes.exp2_n, [](double x) { return std::exp2(x); });
  EXPECT_GT(a.points, 1000000);
  EXPECT_LE(a.max_ulp, 1) << "at x = " << a.worst;
  EXPECT_LE(a.max_rel, 0x1p-23);  // 1 ulp; ~8e-8 measured at -O3, ~1.03e-7 at -O2
}

TEST_P(SimdMath, Exp2AccuracyAboveZero) {
  const Accuracy a = sweep(0.f, 127.9f, kStride, t_->probes.exp2_n, [](double x) { return std::exp2(x); });
  EXPECT_LE(a.max_ulp, 1) << "at x = " << a.worst;
}

// The softmax's exp2 (x <= 0 or NaN) gives exp2's bits on that whole domain: every 997th
// float of [-200, 0], and the special values.
TEST_P(SimdMath, Exp2NonpositiveIsExp2BitForBit) {
  std::vector<float> xs = {-kInf,  -0.f,   0.f,    std::numeric_limits<float>::quiet_NaN(),  -126.f, -126.5f,
                           -127.f, -149.f, -1e30f, -std::numeric_limits<float>::denorm_min()};
  uint32_t bits;
  const float lo = -200.f;
  std::memcpy(&bits, &lo, sizeof bits);
  for (uint32_t b = bits; b > 0x80000000u; b = b >= 997 ? b - 997 : 0) {
    float x;
    std::memcpy(&x, &b, sizeof x);
    xs.push_back(x);
  }
  std::vector<float> want(xs.size()), got(xs.size());
  t_->probes.exp2_n(xs.data(), want.data(), xs.size());
  t_->probes.exp2_nonpositive_n(xs.data(), got.data(), xs.size());
  EXPECT_GT(xs.size(), 100000u);
  for (size_t i = 0; i < xs.size(); ++i) {
    if (std::isnan(want[i])) {
      ASSERT_TRUE(std::isnan(got[i])) << "x = " << xs[i];
    } else {
      ASSERT_EQ(std::memcmp(&want[i], &got[i], sizeof(float)), 0)
          << "x = " << xs[i] << ": " << got[i] << " vs " << want[i];
    }
  }
}

TEST_P(SimdMath, ExpAccuracyOnSoftmaxRange) {
  const Accuracy a = sweep(-87.336f, 0.f, kStride, t_->probes.exp_n, [](double x) { return std::exp(x); });
  EXPECT_GT(a.points, 1000000);
  EXPECT_LE(a.max_ulp, 1) << "at x = " << a.worst;
  EXPECT_LE(a.max_rel, 0x1p-23);
}

TEST_P(SimdMath, ExpAccuracyAboveZero) {
  const Accuracy a = sweep(0.f, 88.72f, kStride, t_->probes.exp_n, [](double x) { return std::exp(x); });
  EXPECT_LE(a.max_ulp, 1) << "at x = " << a.worst;
  EXPECT_LE(a.max_rel, 0x1p-23);
}

// softcap's tanh (score_mod.hpp) over both branches and the saturation, against double std::tanh: the
// header's bound, 3 ulp. Odd: the negative half mirrors the positive one.
TEST_P(SimdMath, TanhAccuracy) {
  const auto tanh_ref = [](double x) { return std::tanh(x); };
  const Accuracy small = sweep(1e-30f, 0.625f, kStride, t_->probes.tanh_n, tanh_ref);
  const Accuracy large = sweep(0.625f, 20.f, kStride, t_->probes.tanh_n, tanh_ref);
  EXPECT_GT(small.points + large.points, 1000000);
  EXPECT_LE(small.max_ulp, 3) << "at x = " << small.worst;
  EXPECT_LE(large.max_ulp, 3) << "at x = " << large.worst;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float in[] = {kInf, -kInf, 50.f, -50.f, 0.f, -0.5f, -3.f, nan}, out[8];
  t_->probes.tanh_n(in, out, 8);
  EXPECT_EQ(out[0], 1.f);
  EXPECT_EQ(out[1], -1.f);
  EXPECT_EQ(out[2], 1.f);
  EXPECT_EQ(out[3], -1.f);
  EXPECT_EQ(out[4], 0.f);
  EXPECT_NEAR(out[5], std::tanh(-0.5), 2e-7);
  EXPECT_NEAR(out[6], std::tanh(-3.0), 2e-7);
  EXPECT_TRUE(std::isnan(out[7]));
}

TEST_P(SimdMath, SpecialValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Exactly +0 for -inf and for everything whose result would be below FLT_MIN.
  for (float x : {-kInf, -1e30f, -1000.f, -150.f, -127.f, -126.01f}) {
    EXPECT_EQ(exp2_1(x), 0.f) << x;
    EXPECT_FALSE(std::signbit(exp2_1(x))) << x;
  }
  for (float x : {-kInf, -1e30f, -1000.f, -104.f, -88.f, -87.34f}) {
    EXPECT_EQ(exp_1(x), 0.f) << x;
  }
  EXPECT_EQ(exp2_1(-126.f), kFltMin);
  EXPECT_EQ(exp2_1(0.f), 1.f);
  EXPECT_EQ(exp2_1(-0.f), 1.f);
  EXPECT_EQ(exp_1(0.f), 1.f);
  EXPECT_EQ(exp2_1(-1.f), 0.5f);
  EXPECT_EQ(exp2_1(10.f), 1024.f);
  for (float x : {kInf, 128.f, 200.f, 1e30f}) EXPECT_EQ(exp2_1(x), kInf) << x;
  for (float x : {kInf, 88.8f, 200.f}) EXPECT_EQ(exp_1(x), kInf) << x;
  EXPECT_TRUE(std::isnan(exp2_1(nan)));
  EXPECT_TRUE(std::isnan(exp_1(nan)));
  EXPECT_TRUE(std::isnan(exp2_1(-nan)));
  EXPECT_TRUE(std::isnan(exp_1(-nan)));
}

TEST_P(SimdMath, SpecialValuesDoNotLeakAcrossLanes) {
  // Three vectors of the widest target (one lane per element with scalar).
  constexpr int kN = 48;
  float in[kN], out[kN];
  for (int i = 0; i < kN; ++i) in[i] = -static_cast<float>(i) * 0.25f;
  in[3] = -kInf;
  in[5] = std::numeric_limits<float>::quiet_NaN();
  in[7] = kInf;
  t_->probes.exp_n(in, out, kN);
  for (int i = 0; i < kN; ++i) {
    if (i == 3) {
      EXPECT_EQ(out[i], 0.f);
    } else if (i == 5) {
      EXPECT_TRUE(std::isnan(out[i]));
    } else if (i == 7) {
      EXPECT_EQ(out[i], kInf);
    } else {
      EXPECT_NEAR(out[i], std::exp(in[i]), 2e-7 * std::exp(in[i])) << i;
    }
  }
}

TEST_P(SimdMath, Reductions) {
  const int kLanes = lanes_;
  std::vector<float> in(kLanes);
  float expect_sum = 0.f;
  for (int i = 0; i < kLanes; ++i) {
    in[i] = static_cast<float>((i * 7) % kLanes) - 5.5f;  // exact in float, max not at 0
    expect_sum += in[i];
  }
  EXPECT_EQ(t_->probes.reduce_sum(in.data()), expect_sum);
  EXPECT_EQ(t_->probes.reduce_max(in.data()), static_cast<float>(kLanes - 1) - 5.5f);
  std::vector<float> minus_inf(kLanes, -kInf);
  EXPECT_EQ(t_->probes.reduce_max(minus_inf.data()), -kInf);
  in[kLanes - 1] = 1000.f;
  EXPECT_EQ(t_->probes.reduce_max(in.data()), 1000.f);
}

TEST_P(SimdMath, TransposeSumPutsEachRowSumInItsLane) {
  // Distinct integer-valued entries: every sum is exact, every lane distinguishable.
  const int kLanes = lanes_;
  std::vector<float> rows(kLanes * kLanes), lanes(kLanes), expect(kLanes);
  for (int i = 0; i < kLanes; ++i) {
    expect[i] = 0.f;
    for (int j = 0; j < kLanes; ++j) {
      rows[i * kLanes + j] = static_cast<float>(i * 100 + j * j);
      expect[i] += rows[i * kLanes + j];
    }
  }
  t_->probes.transpose_sum(rows.data(), lanes.data());
  for (int i = 0; i < kLanes; ++i) EXPECT_EQ(lanes[i], expect[i]) << "lane " << i;
}

TEST_P(SimdMath, PartialLoadsAndStoresStayInBounds) {
  // Every n, at the very end of an allocation padded by guard values: the load must not
  // pick up the guards (it would show up in the lanes >= n) and the store must not
  // overwrite them.
  constexpr float kGuard = 12345.f;
  const int kLanes = lanes_;
  for (int n = 0; n <= kLanes; ++n) {
    std::vector<float> buf(n + kLanes, kGuard);
    for (int i = 0; i < n; ++i) buf[i] = static_cast<float>(i + 1);
    std::vector<float> lanes(kLanes);
    t_->probes.load_partial(buf.data(), n, 0.f, lanes.data());
    for (int i = 0; i < kLanes; ++i) EXPECT_EQ(lanes[i], i < n ? i + 1.f : 0.f) << n << " " << i;
    t_->probes.load_partial(buf.data(), n, -kInf, lanes.data());
    for (int i = 0; i < kLanes; ++i) EXPECT_EQ(lanes[i], i < n ? i + 1.f : -kInf) << n << " " << i;

    std::vector<float> dst(n + kLanes, kGuard);
    t_->probes.store_partial(dst.data(), -1.f, n);
    for (int i = 0; i < n + kLanes; ++i) EXPECT_EQ(dst[i], i < n ? -1.f : kGuard) << n << " " << i;
  }
}

// keep_bits: lane j keeps its value where bit j is set, else the fill (-inf for a masked score);
// bits above the vector's lanes change nothing; NaN and Inf stay in their own lane.
TEST_P(SimdMath, KeepBitsSelectsLanesByBit) {
  const int kLanes = t_->lanes;
  std::vector<float> in(kLanes), out(kLanes);
  for (int i = 0; i < kLanes; ++i) in[i] = i % 5 == 3 ? std::nanf("") : i % 7 == 2 ? kInf : static_cast<float>(i + 1);
  std::vector<uint32_t> patterns = {0u, 1u, 0x5555u, 0xAAAAu, 0xFFFFu, 0xFFFFFFFFu, 0x8001u, 0x10000u};
  for (int j = 0; j < kLanes; ++j) patterns.push_back(1u << j);
  for (const uint32_t bits : patterns) {
    t_->probes.keep_bits(in.data(), bits, -kInf, out.data());
    for (int i = 0; i < kLanes; ++i) {
      const float want = bits >> i & 1u ? in[i] : -kInf;
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(out[i])) << std::hex << bits << " lane " << i;
      } else {
        EXPECT_EQ(out[i], want) << std::hex << bits << " lane " << i;
      }
    }
  }
}

// The tile engine reads a quantized cache in registers (src/cpu/simd/kv_load.hpp): every value
// of a row must be the read rule's (dequantize_row), bit for bit (NaN for NaN), for any bytes -
// random rows hold NaN/Inf/subnormal scales, every int8 and nibble, every fp8 code - at every
// vector offset and tail length.
TEST_P(SimdMath, QuantizedCacheRowsReadInRegistersAsTheRule) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte(0, 255);
  for (KvDType t : quantized_kv_dtypes()) {
    const int64_t step = kv_block_values(t);
    for (int64_t d : {1, 2, 7, 8, 15, 16, 17, 31, 32, 33, 64, 96, 128, 130, 256}) {
      if (d % step) continue;
      for (int round = 0; round < 20; ++round) {
        std::vector<std::byte> row(static_cast<size_t>(kv_row_bytes(t, d)));
        for (std::byte& b : row) b = static_cast<std::byte>(byte(rng));
        if (round == 0 && (t == KvDType::Fp8E4M3 || t == KvDType::Fp8E5M2)) {
          for (int64_t i = 0; i < d; ++i) row[i] = static_cast<std::byte>(i * 37 % 256);  // codes 0x7f, 0xff, ...
        }
        std::vector<float> want(static_cast<size_t>(d)), got(static_cast<size_t>(d), -1.f);
        dequantize_row(t, row.data(), d, want.data());
        t_->probes.kv_row(t, row.data(), d, got.data());
        for (int64_t i = 0; i < d; ++i) {
          const bool same = std::isnan(want[i]) ? std::isnan(got[i]) : std::memcmp(&want[i], &got[i], 4) == 0;
          ASSERT_TRUE(same) << to_string(t) << " d " << d << " value " << i << ": rule " << want[i] << ", read "
                            << got[i];
        }
      }
    }
  }
}

// flash_int8 rounds Q and K in vectors (int8_dot.hpp: round_int8_row): the same codes and scale as
// round_int8's rule, bit for bit, at every length and tail - rows with exact ties (y = k + 0.5 and
// k - 0.5 after the division), the clamp's edge (amax itself: 127), a zero row, subnormals, signed
// zeros - and false exactly when the rule refuses (a NaN or Inf anywhere, tail included).
TEST_P(SimdMath, Int8RowsRoundInVectorsAsTheRule) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int64_t n : {1, 3, 8, 15, 16, 17, 31, 64, 72, 128, 130, 256, 576}) {
    for (int round = 0; round < 24; ++round) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = normal(rng) * (round % 3 == 0 ? 1e-3f : round % 3 == 1 ? 1.f : 1e30f);
      if (round == 1) {  // ties: amax 127 -> scale 1, values k +- 0.5 exactly
        for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 127) - 63.5f;
        x[0] = 127.f;
      }
      if (round == 2) std::fill(x.begin(), x.end(), 0.f);
      if (round == 3) {
        for (int64_t i = 0; i < n; ++i) x[i] = (i % 2 ? -1.f : 1.f) * 1e-40f * static_cast<float>(i + 1);  // subnormal
      }
      if (round == 4) x[static_cast<size_t>(n - 1)] = -0.f;
      if (round >= 20) {  // NaN / Inf at the first, the last and a middle position
        const float bad = round % 2 ? std::numeric_limits<float>::quiet_NaN() : -std::numeric_limits<float>::infinity();
        x[static_cast<size_t>(round == 20 ? 0 : round == 21 ? n - 1 : n / 2)] = bad;
      }
      std::vector<int8_t> want(static_cast<size_t>(n), 7), got(static_cast<size_t>(n), 9);
      float want_scale = -1.f, got_scale = -2.f;
      const bool want_ok = round_int8(x.data(), n, n, want.data(), &want_scale);
      const bool got_ok = t_->probes.round_int8_row(x.data(), n, got.data(), &got_scale);
      ASSERT_EQ(want_ok, got_ok) << "n " << n << " round " << round;
      if (!want_ok) continue;
      ASSERT_EQ(std::memcmp(&want_scale, &got_scale, 4), 0) << "n " << n << " round " << round;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(want[i], got[i]) << "n " << n << " round " << round << " value " << i << " x " << x[i];
      }
    }
  }
}

// flash_int8 rounds V per channel in vectors (int8_dot.hpp: round_v_rows): round_v_channels' codes and
// scales bit for bit, at every channel count and tail, over strided rows - exact ties (amax 127:
// scale 1, values k +- 0.5), a zero channel beside live ones, subnormals, one row, no row - and
// false exactly when the rule refuses (NaN or Inf at the first, last or a middle value).
TEST_P(SimdMath, Int8ChannelsRoundInVectorsAsTheRule) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int64_t dv : {1, 5, 16, 17, 64, 72, 128, 130}) {
    for (int64_t n : {0, 1, 3, 64, 97}) {
      for (int round = 0; round < 12; ++round) {
        const int64_t ld = dv + 3;
        std::vector<float> x(static_cast<size_t>(std::max<int64_t>(n, 1) * ld), 123.f);  // the gaps: never read
        for (int64_t j = 0; j < n; ++j)
          for (int64_t c = 0; c < dv; ++c) {
            float& v = x[j * ld + c];
            v = normal(rng) * (round % 3 == 0 ? 1e-3f : 1.f) * static_cast<float>(1 + c % 7);
            if (round == 1) v = j == 0 ? 127.f : static_cast<float>((j + c) % 127) - 63.5f;  // ties
            if (round == 2 && c % 3 == 0) v = 0.f;                                           // zero channels
            if (round == 3) v = (c % 2 ? -1.f : 1.f) * 1e-40f * static_cast<float>(j + 1);   // subnormal
          }
        if (round >= 9 && n > 0) {
          const float bad =
              round % 2 ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
          x[round == 9 ? 0 : round == 10 ? (n - 1) * ld + dv - 1 : (n / 2) * ld + dv / 2] = bad;
        }
        std::vector<int8_t> want(static_cast<size_t>(n * dv), 7), got(static_cast<size_t>(n * dv), 9);
        std::vector<float> want_sc(static_cast<size_t>(dv), -1.f), got_sc(static_cast<size_t>(dv), -2.f);
        const bool want_ok = round_v_channels(x.data(), ld, n, dv, want.data(), want_sc.data());
        const bool got_ok = t_->probes.round_v_rows(x.data(), ld, n, dv, got.data(), got_sc.data());
        ASSERT_EQ(want_ok, got_ok) << "dv " << dv << " n " << n << " round " << round;
        if (!want_ok) continue;
        ASSERT_EQ(std::memcmp(want_sc.data(), got_sc.data(), 4 * static_cast<size_t>(dv)), 0)
            << "dv " << dv << " n " << n << " round " << round;
        ASSERT_EQ(want, got) << "dv " << dv << " n " << n << " round " << round;
      }
    }
  }
}

// decode_i8's scores (int8_dot.hpp: score_rows_i8) are the rule's integers on every target, with
// the target's dot-product unit (vpdpbusd, NEON's sdot: where the CPU has it) and without it
// (vpmaddubsw; the rule), from the K rows and from a tile's words (prep_k_words): against the exact integer dot
// products of Q's and K's codes per block, combined in double, within a few float roundings of the magnitudes summed -
// one code off moves a score by its block's scales, far more. Every cache type with integer codes, head dims with
// partial vectors and slices (row types), keys with a large zero point and all-equal rows.
TEST_P(SimdMath, I8ScoresAreTheRulesIntegers) {
  if (!t_->probes.i8_score) GTEST_SKIP() << "no i8 probe";
  const std::string unit_isa = t_->probes.i8_score_unit;
  const bool unit_runs = !unit_isa.empty() && cpu_runs_isa(unit_isa);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(-2.f, 2.f);
  int checked = 0;
  for (KvDType t : {KvDType::Q8_0, KvDType::Q4_0, KvDType::U8, KvDType::U4}) {
    const bool block = t == KvDType::Q8_0 || t == KvDType::Q4_0;
    for (int64_t d : {32, 64, 96, 128, 160, 256, 37, 50, 71, 127}) {
      if (block && d % 32 != 0) continue;
      for (int round = 0; round < 6; ++round) {
        std::vector<float> q(static_cast<size_t>(d)), k(static_cast<size_t>(d));
        for (int64_t i = 0; i < d; ++i) q[i] = uni(rng), k[i] = uni(rng) + (round == 1 ? 40.f : 0.f);
        if (round == 2) std::fill(k.begin(), k.end(), 0.75f);
        std::vector<std::byte> kb(static_cast<size_t>(kv_row_bytes(t, d)) + 64);
        quantize_row(t, k.data(), d, kb.data());
        std::vector<int8_t> qc(static_cast<size_t>(d));
        std::vector<float> qs(static_cast<size_t>(d));
        ASSERT_TRUE(round_q_row(t, q.data(), d, qc.data(), qs.data()));
        const auto* u = reinterpret_cast<const uint8_t*>(kb.data());
        double want = 0, mag = 0;
        if (block) {
          const int64_t bytes = t == KvDType::Q8_0 ? 34 : 18;
          for (int64_t b = 0; b < d / 32; ++b) {
            const uint8_t* blk = u + b * bytes;
            int64_t dot = 0, size = 0;
            for (int i = 0; i < 32; ++i) {
              const int c = t == KvDType::Q8_0 ? static_cast<int8_t>(blk[2 + i])
                                               : (i < 16 ? blk[2 + i] & 0x0f : blk[2 + i - 16] >> 4) - 8;
              dot += qc[b * 32 + i] * c, size += std::abs(qc[b * 32 + i] * c);
            }
            const double scale = static_cast<double>(qs[b]) * kv_read::scale_f16(kb.data() + b * bytes);
            want += scale * static_cast<double>(dot), mag += std::fabs(scale) * static_cast<double>(size);
          }
        } else {
          int64_t dot = 0, size = 0, qsum = 0;
          for (int64_t i = 0; i < d; ++i) {
            const int c = t == KvDType::U8 ? u[8 + i] : (i % 2 ? u[8 + i / 2] >> 4 : u[8 + i / 2] & 0x0f);
            dot += qc[i] * c, size += std::abs(qc[i] * c), qsum += qc[i];
          }
          const double sc = kv_read::load_f32(kb.data()), zp = kv_read::load_f32(kb.data() + 4);
          want = (static_cast<double>(dot) - zp * static_cast<double>(qsum)) * qs[0] * sc;
          mag = (static_cast<double>(size) + std::fabs(zp * static_cast<double>(qsum))) * std::fabs(qs[0] * sc);
        }
        for (bool unit : {false, true}) {
          if (unit && !unit_runs) continue;
          for (bool words : {false, true}) {
            const float got = t_->probes.i8_score(t, unit, words, q.data(), d, kb.data());
            EXPECT_LE(std::fabs(got - want), 8 * std::numeric_limits<float>::epsilon() * mag + 1e-30)
                << to_string(t) << " d " << d << " round " << round
                << (unit ? " with " + unit_isa : " without the unit") << (words ? ", the tile's words" : "") << ": "
                << got << " want " << want;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// decode_i8's P rounding (int8_dot.hpp: round_p_row) is round_p_tile's rule bit for bit on every
// target: the codes and the quantum, unsigned (u8, u4, q8_0) and signed (q4_0), on softmax-like
// weights, exact ties (wmax 255: weights k + 1/2), zeros, subnormals, -0, and a NaN or an Inf at
// the first, the last and a middle key (no rounding: false).
TEST_P(SimdMath, PRowsRoundInVectorsAsTheRule) {
  constexpr int kKeys = 64;
  ASSERT_EQ(t_->probes.tile_keys, kKeys);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uni(0.f, 1.f);
  for (bool is_signed : {false, true}) {
    for (int round = 0; round < 40; ++round) {
      std::vector<float> p(kKeys), sc(kKeys);
      for (int j = 0; j < kKeys; ++j) {
        p[j] = std::exp2(-8.f * uni(rng));
        sc[j] = (0.5f + uni(rng)) * (round % 4 == 0 ? 1e-3f : 1.f) * (is_signed && uni(rng) < 0.5f ? -1.f : 1.f);
      }
      if (round == 1) {  // ties
        for (int j = 0; j < kKeys; ++j) p[j] = static_cast<float>(j % 100) + 0.5f, sc[j] = 1.f;
        p[0] = is_signed ? 127.f : 255.f;
      }
      if (round == 2) std::fill(p.begin(), p.end(), 0.f);
      if (round == 3) std::fill(sc.begin(), sc.end(), 1e-41f);  // subnormal weights
      if (round == 5) p[kKeys - 1] = -0.f;
      if (round >= 34) {
        const float bad = round % 2 ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
        (round < 36 ? p : sc)[round % 3 == 0 ? 0 : round % 3 == 1 ? kKeys - 1 : kKeys / 2] = bad;
      }
      std::vector<float> w(kKeys);
      for (int j = 0; j < kKeys; ++j) w[j] = p[j] * sc[j];
      std::vector<int32_t> want(kKeys, 7);
      alignas(64) uint8_t got[kKeys];
      std::fill(got, got + kKeys, uint8_t{9});
      float want_q = -1.f, got_q = -2.f;
      const bool want_ok = round_p_tile(w.data(), kKeys, is_signed, want.data(), &want_q);
      const bool got_ok = t_->probes.round_p_row(p.data(), sc.data(), is_signed, got, &got_q);
      ASSERT_EQ(want_ok, got_ok) << "signed " << is_signed << " round " << round;
      if (!want_ok) continue;
      ASSERT_EQ(std::memcmp(&want_q, &got_q, 4), 0) << "signed " << is_signed << " round " << round;
      for (int j = 0; j < kKeys; ++j) {
        const int32_t code = is_signed ? static_cast<int8_t>(got[j]) : got[j];
        ASSERT_EQ(want[j], code) << "signed " << is_signed << " round " << round << " key " << j << " w " << w[j];
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, SimdMath, ::testing::ValuesIn(built_isas()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace attnlab
