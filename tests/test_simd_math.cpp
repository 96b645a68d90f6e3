// Tests for src/cpu/simd/vec_math.hpp: exp/exp2 accuracy over a dense sweep of the
// softmax range (bounds documented in the header), special values, reductions (including
// the transposed sum) and the tail-safe partial loads/stores.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/simd/vec_math.hpp"

namespace attnlab::simd {
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
  const int32_t i = o < 0 ? static_cast<int32_t>(static_cast<uint32_t>(-o) | 0x80000000u)
                          : static_cast<int32_t>(o);
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}

float next_by(float x, int steps) {  // `steps` representable floats towards +inf
  return from_order(float_order(x) + steps);
}

float lane0(Batch v) {
  alignas(64) float lanes[kLanes];
  v.store_aligned(lanes);
  return lanes[0];
}

struct Accuracy {
  int64_t max_ulp = 0;
  double max_rel = 0;
  float worst = 0;
  int64_t points = 0;
};

// Evaluates f on every `stride`-th float of [lo, hi] (16 at a time) against the double
// reference; results the reference puts below FLT_MIN are flushed by design and skipped.
template <class F, class R>
Accuracy sweep(float lo, float hi, int stride, F f, R ref) {
  Accuracy acc;
  alignas(64) float in[kLanes], out[kLanes];
  float x = lo;
  bool done = false;
  while (!done) {
    int n = 0;
    for (; n < kLanes && !done; ++n) {
      in[n] = x;
      x = next_by(x, stride);
      done = x > hi;
    }
    store_partial(out, f(load_partial(in, n)), n);
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

TEST(SimdMath, Exp2AccuracyOnSoftmaxRange) {
  const Accuracy a = sweep(-126.f, 0.f, kStride, [](Batch v) { return exp2(v); },
                           [](double x) { return std::exp2(x); });
  EXPECT_GT(a.points, 1000000);
  EXPECT_LE(a.max_ulp, 1) << "at x = " << a.worst;
  EXPECT_LE(a.max_rel, 0x1p-23);  // 1 ulp; ~8e-8 measured at -O3, ~1.03e-7 at -O2
}

TEST(SimdMath, Exp2AccuracyAboveZero) {
  const Accuracy a = sweep(0.f, 127.9f, kStride, [](Batch v) { return exp2(v); },
                           [](double x) { return std::exp2(x); });
  EXPECT_LE(a.max_ulp, 1) << "at x = " << a.worst;
}

TEST(SimdMath, ExpAccuracyOnSoftmaxRange) {
  const Accuracy a = sweep(-87.336f, 0.f, kStride, [](Batch v) { return exp(v); },
                           [](double x) { return std::exp(x); });
  EXPECT_GT(a.points, 1000000);
  EXPECT_LE(a.max_ulp, 1) << "at x = " << a.worst;
  EXPECT_LE(a.max_rel, 0x1p-23);
}

TEST(SimdMath, ExpAccuracyAboveZero) {
  const Accuracy a = sweep(0.f, 88.72f, kStride, [](Batch v) { return exp(v); },
                           [](double x) { return std::exp(x); });
  EXPECT_LE(a.max_ulp, 1) << "at x = " << a.worst;
  EXPECT_LE(a.max_rel, 0x1p-23);
}

TEST(SimdMath, SpecialValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Exactly +0 for -inf and for everything whose result would be below FLT_MIN.
  for (float x : {-kInf, -1e30f, -1000.f, -150.f, -127.f, -126.01f}) {
    EXPECT_EQ(lane0(exp2(Batch(x))), 0.f) << x;
    EXPECT_FALSE(std::signbit(lane0(exp2(Batch(x))))) << x;
  }
  for (float x : {-kInf, -1e30f, -1000.f, -104.f, -88.f, -87.34f}) {
    EXPECT_EQ(lane0(exp(Batch(x))), 0.f) << x;
  }
  EXPECT_EQ(lane0(exp2(Batch(-126.f))), kFltMin);
  EXPECT_EQ(lane0(exp2(Batch(0.f))), 1.f);
  EXPECT_EQ(lane0(exp2(Batch(-0.f))), 1.f);
  EXPECT_EQ(lane0(exp(Batch(0.f))), 1.f);
  EXPECT_EQ(lane0(exp2(Batch(-1.f))), 0.5f);
  EXPECT_EQ(lane0(exp2(Batch(10.f))), 1024.f);
  for (float x : {kInf, 128.f, 200.f, 1e30f}) EXPECT_EQ(lane0(exp2(Batch(x))), kInf) << x;
  for (float x : {kInf, 88.8f, 200.f}) EXPECT_EQ(lane0(exp(Batch(x))), kInf) << x;
  EXPECT_TRUE(std::isnan(lane0(exp2(Batch(nan)))));
  EXPECT_TRUE(std::isnan(lane0(exp(Batch(nan)))));
  EXPECT_TRUE(std::isnan(lane0(exp2(Batch(-nan)))));
  EXPECT_TRUE(std::isnan(lane0(exp(Batch(-nan)))));
}

TEST(SimdMath, SpecialValuesDoNotLeakAcrossLanes) {
  alignas(64) float in[kLanes], out[kLanes];
  for (int i = 0; i < kLanes; ++i) in[i] = -static_cast<float>(i) * 0.25f;
  in[3] = -kInf;
  in[5] = std::numeric_limits<float>::quiet_NaN();
  in[7] = kInf;
  exp(Batch::load_aligned(in)).store_aligned(out);
  for (int i = 0; i < kLanes; ++i) {
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

TEST(SimdMath, Reductions) {
  alignas(64) float in[kLanes];
  float expect_sum = 0.f;
  for (int i = 0; i < kLanes; ++i) {
    in[i] = static_cast<float>((i * 7) % kLanes) - 5.5f;  // exact in float, max not at 0
    expect_sum += in[i];
  }
  const Batch v = Batch::load_aligned(in);
  EXPECT_EQ(reduce_sum(v), expect_sum);
  EXPECT_EQ(reduce_max(v), static_cast<float>(kLanes - 1) - 5.5f);
  EXPECT_EQ(reduce_max(Batch(-kInf)), -kInf);
  in[kLanes - 1] = 1000.f;
  EXPECT_EQ(reduce_max(Batch::load_aligned(in)), 1000.f);
}

TEST(SimdMath, TransposeSumPutsEachRowSumInItsLane) {
  // Distinct integer-valued entries: every sum is exact, every lane distinguishable.
  Batch rows[kLanes];
  alignas(64) float lanes[kLanes], expect[kLanes];
  for (int i = 0; i < kLanes; ++i) {
    expect[i] = 0.f;
    for (int j = 0; j < kLanes; ++j) {
      lanes[j] = static_cast<float>(i * 100 + j * j);
      expect[i] += lanes[j];
    }
    rows[i] = Batch::load_aligned(lanes);
  }
  transpose_sum(rows).store_aligned(lanes);
  for (int i = 0; i < kLanes; ++i) EXPECT_EQ(lanes[i], expect[i]) << "lane " << i;
}

TEST(SimdMath, PartialLoadsAndStoresStayInBounds) {
  // Every n, at the very end of an allocation padded by guard values: the load must not
  // pick up the guards (it would show up in the lanes >= n) and the store must not
  // overwrite them.
  constexpr float kGuard = 12345.f;
  for (int n = 0; n <= kLanes; ++n) {
    std::vector<float> buf(n + kLanes, kGuard);
    for (int i = 0; i < n; ++i) buf[i] = static_cast<float>(i + 1);
    alignas(64) float lanes[kLanes];
    load_partial(buf.data(), n).store_aligned(lanes);
    for (int i = 0; i < kLanes; ++i) EXPECT_EQ(lanes[i], i < n ? i + 1.f : 0.f) << n << " " << i;
    load_partial(buf.data(), n, -kInf).store_aligned(lanes);
    for (int i = 0; i < kLanes; ++i) EXPECT_EQ(lanes[i], i < n ? i + 1.f : -kInf) << n << " " << i;

    std::vector<float> dst(n + kLanes, kGuard);
    store_partial(dst.data(), Batch(-1.f), n);
    for (int i = 0; i < n + kLanes; ++i) EXPECT_EQ(dst[i], i < n ? -1.f : kGuard) << n << " " << i;
  }
}

}  // namespace
}  // namespace attnlab::simd
