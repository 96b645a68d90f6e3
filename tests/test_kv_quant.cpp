// The quantized KV-cache layouts (include/attnlab/kv_quant.hpp): blocks computed by hand
// against the bytes the writer produces, the readers' values, the FP8 grids, the error a
// round trip may make, and the special values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attnlab/kv_quant.hpp"
#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab {
namespace {

std::vector<uint8_t> quantized(KvDType t, const std::vector<float>& x) {
  std::vector<uint8_t> out(static_cast<size_t>(kv_row_bytes(t, static_cast<int64_t>(x.size()))), 0xAA);
  quantize_row(t, x.data(), static_cast<int64_t>(x.size()), reinterpret_cast<std::byte*>(out.data()));
  return out;
}

std::vector<float> dequantized(KvDType t, const std::vector<uint8_t>& row, int64_t dim) {
  std::vector<float> y(static_cast<size_t>(dim));
  dequantize_row(t, reinterpret_cast<const std::byte*>(row.data()), dim, y.data());
  return y;
}

// x_j = (j - 16) / 16, j = 0..31: the value of largest magnitude is x_0 = -1.
std::vector<float> ramp32() {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16) / 16.0f;
  return x;
}

TEST(KvQuant, Q8_0BlockAsGgmlWritesIt) {
  const auto b = quantized(KvDType::Q8_0, ramp32());
  ASSERT_EQ(b.size(), 34u);
  // d = amax / 127 = 1/127 as f16: 2^-7 * (1 + 8/1024) -> exponent 8, mantissa 8: 0x2008 (little endian).
  EXPECT_EQ(b[0], 0x08);
  EXPECT_EQ(b[1], 0x20);
  const auto q = [&](int j) { return static_cast<int8_t>(b[2 + j]); };
  EXPECT_EQ(q(0), -127);  // -1 * 127
  EXPECT_EQ(q(1), -119);  // -0.9375 * 127 = -119.06
  EXPECT_EQ(q(16), 0);
  EXPECT_EQ(q(20), 32);   // 0.25 * 127 = 31.75
  EXPECT_EQ(q(31), 119);  // 0.9375 * 127 = 119.06
  // Read back: d (the f16 scale) times q.
  const float d = std::ldexp(1.0f + 8.0f / 1024.0f, -7);
  const auto y = dequantized(KvDType::Q8_0, b, 32);
  EXPECT_EQ(y[0], -127.0f * d);
  EXPECT_EQ(y[20], 32.0f * d);
}

TEST(KvQuant, Q4_0BlockAsGgmlWritesIt) {
  const auto b = quantized(KvDType::Q4_0, ramp32());
  ASSERT_EQ(b.size(), 18u);
  // d = max / -8 = -1 / -8 = 0.125: f16 0x3000.
  EXPECT_EQ(b[0], 0x00);
  EXPECT_EQ(b[1], 0x30);
  // Byte j: value j in the low nibble, value j + 16 in the high one; nibble = min(15, (int)(x * 8 + 8.5)).
  EXPECT_EQ(b[2 + 0], 0x80);   // x0 = -1 -> 0, x16 = 0 -> 8
  EXPECT_EQ(b[2 + 1], 0x91);   // x1 = -0.9375 -> 1, x17 = 0.0625 -> 9
  EXPECT_EQ(b[2 + 15], 0xF8);  // x15 = -0.0625 -> 8, x31 = 0.9375 -> 16, clamped to 15
  const auto y = dequantized(KvDType::Q4_0, b, 32);
  EXPECT_EQ(y[0], -1.0f);    // (0 - 8) * 0.125
  EXPECT_EQ(y[17], 0.125f);  // (9 - 8) * 0.125
  EXPECT_EQ(y[31], 0.875f);  // (15 - 8) * 0.125: the clamp's cost
}

TEST(KvQuant, U8AndU4RowsScaleAndZeroPoint) {
  const std::vector<float> x = {0.0f, 1 / 7.0f, 2 / 7.0f, 3 / 7.0f, 4 / 7.0f, 5 / 7.0f, 6 / 7.0f, 1.0f};
  const auto b8 = quantized(KvDType::U8, x);
  ASSERT_EQ(b8.size(), 16u);
  float scale, zp;
  std::memcpy(&scale, b8.data(), 4);
  std::memcpy(&zp, b8.data() + 4, 4);
  EXPECT_EQ(scale, 1.0f / 255.0f);
  EXPECT_EQ(zp, 0.0f);
  EXPECT_EQ(std::vector<uint8_t>(b8.begin() + 8, b8.end()),
            (std::vector<uint8_t>{0, 36, 73, 109, 146, 182, 219, 255}));  // x * 255, to nearest
  const auto b4 = quantized(KvDType::U4, x);
  ASSERT_EQ(b4.size(), 12u);
  // x * 15 = 0, 2.14, 4.29, 6.43, 8.57, 10.71, 12.86, 15: the even one in the low nibble.
  EXPECT_EQ(std::vector<uint8_t>(b4.begin() + 8, b4.end()), (std::vector<uint8_t>{0x20, 0x64, 0xB9, 0xFD}));
  const auto y4 = dequantized(KvDType::U4, b4, 8);
  EXPECT_FLOAT_EQ(y4[4], 9.0f / 15.0f);
  // An offset row: the zero point carries the minimum.
  const std::vector<float> shifted = {-3.0f, -2.0f, -1.0f, 0.0f};
  const auto ys = dequantized(KvDType::U8, quantized(KvDType::U8, shifted), 4);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(ys[i], shifted[i], 3.0f / 255.0f / 2 * 1.0001f) << i;
  // A constant row reads back exactly.
  const auto yc = dequantized(KvDType::U4, quantized(KvDType::U4, {0.3f, 0.3f, 0.3f}), 3);
  for (float v : yc) EXPECT_EQ(v, 0.3f);
}

TEST(KvQuant, Fp8GridsAsOcpDefinesThem) {
  EXPECT_EQ(fp8_e4m3_to_float(0x7e), 448.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0xff)));
  EXPECT_EQ(fp8_e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_float(0xb8), -1.0f);
  EXPECT_EQ(fp8_e5m2_to_float(0x7b), 57344.0f);
  EXPECT_EQ(fp8_e5m2_to_float(0x7c), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(fp8_e5m2_to_float(0x7d)));
  EXPECT_EQ(fp8_e5m2_to_float(0x3c), 1.0f);
  EXPECT_EQ(fp8_e5m2_to_float(0x01), std::ldexp(1.0f, -16));
  // Every value of the grid writes back to its own code.
  for (int b = 0; b < 256; ++b) {
    const float e4 = fp8_e4m3_to_float(static_cast<uint8_t>(b)), e5 = fp8_e5m2_to_float(static_cast<uint8_t>(b));
    if (!std::isnan(e4)) {
      EXPECT_EQ(float_to_fp8_e4m3(e4), b) << b;
    }
    if (!std::isnan(e5)) {
      EXPECT_EQ(float_to_fp8_e5m2(e5), b) << b;
    }
  }
  // Nearest, ties to even; saturation past the maximum; NaN stays NaN.
  EXPECT_EQ(float_to_fp8_e4m3(1.0625f), 0x38);  // between 1 and 1.125: to the even 1
  EXPECT_EQ(float_to_fp8_e4m3(1.1875f), 0x3a);  // between 1.125 and 1.25: to the even 1.25
  EXPECT_EQ(float_to_fp8_e4m3(1.07f), 0x39);
  EXPECT_EQ(float_to_fp8_e4m3(1000.0f), 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(float_to_fp8_e5m2(1e6f), 0x7b);
  EXPECT_EQ(float_to_fp8_e5m2(std::numeric_limits<float>::infinity()), 0x7c);
  EXPECT_TRUE(std::isnan(fp8_e5m2_to_float(float_to_fp8_e5m2(std::nanf("")))));
  EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(1.0f, -11)), 0x00) << "below half the smallest subnormal: zero";
}

// What a round trip may cost, per layout, on uniform [-1, 1) rows: half a quantization step
// (plus the f16 scale's rounding), the fp8 grids' half ulp.
TEST(KvQuant, RoundTripErrorIsHalfAStep) {
  const int64_t dim = 128;
  std::vector<float> x(dim);
  fill_uniform(x.data(), dim, 5);
  for (KvDType t : quantized_kv_dtypes()) {
    const auto y = dequantized(t, quantized(t, x), dim);
    for (int64_t i = 0; i < dim; ++i) {
      float bound = 0;
      switch (t) {
        case KvDType::Q8_0: bound = 0.6f / 127; break;        // half a step, and the f16 scale: 127 * 2^-11 steps
        case KvDType::Q4_0: bound = 1.0f / 8 * 1.01f; break;  // one step: the clamp at +8
        case KvDType::U8: bound = 2.0f / 255 / 2 * 1.01f; break;
        case KvDType::U4: bound = 2.0f / 15 / 2 * 1.01f; break;
        case KvDType::Fp8E4M3: bound = std::fabs(x[i]) / 16 + std::ldexp(1.0f, -10); break;
        case KvDType::Fp8E5M2: bound = std::fabs(x[i]) / 8 + std::ldexp(1.0f, -17); break;
        case KvDType::Same: break;
      }
      EXPECT_LE(std::fabs(y[i] - x[i]), bound) << to_string(t) << " at " << i << ": " << x[i] << " -> " << y[i];
    }
  }
}

TEST(KvQuant, SpecialValuesPoisonTheirBlockOrRowOnly) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (KvDType t : {KvDType::Q8_0, KvDType::Q4_0}) {
    for (float bad : {nan, inf, -inf}) {
      std::vector<float> x(64, 0.5f);
      x[40] = bad;  // the second block
      const auto y = dequantized(t, quantized(t, x), 64);
      for (int i = 0; i < 32; ++i) EXPECT_TRUE(std::isfinite(y[i])) << to_string(t) << " " << i;
      for (int i = 32; i < 64; ++i) EXPECT_TRUE(std::isnan(y[i])) << to_string(t) << " " << i;
    }
    // An all-zero block: scale 0, every value reads back 0.
    const auto z = dequantized(t, quantized(t, std::vector<float>(32, 0.0f)), 32);
    for (float v : z) EXPECT_EQ(v, 0.0f);
  }
  for (KvDType t : {KvDType::U8, KvDType::U4}) {
    const auto y = dequantized(t, quantized(t, {0.1f, inf, 0.2f, 0.3f}), 4);
    for (float v : y) EXPECT_TRUE(std::isnan(v)) << to_string(t);
  }
  const auto f = dequantized(KvDType::Fp8E5M2, quantized(KvDType::Fp8E5M2, {0.5f, nan, -inf}), 3);
  EXPECT_EQ(f[0], 0.5f);
  EXPECT_TRUE(std::isnan(f[1]));
  EXPECT_EQ(f[2], -inf);
}

TEST(KvQuant, NamesAndSizes) {
  for (KvDType t : quantized_kv_dtypes()) EXPECT_EQ(parse_kv_dtype(to_string(t)), t);
  EXPECT_EQ(parse_kv_dtype("dtype"), KvDType::Same);
  try {
    parse_kv_dtype("q8");
    ADD_FAILURE() << "accepted q8";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("kv_dtype: 'q8'; allowed: dtype, q8_0, q4_0, u8, u4, fp8_e4m3, fp8_e5m2"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(kv_row_bytes(KvDType::Q8_0, 128), 4 * 34);
  EXPECT_EQ(kv_row_bytes(KvDType::Q4_0, 128), 4 * 18);
  EXPECT_EQ(kv_row_bytes(KvDType::U8, 128), 136);
  EXPECT_EQ(kv_row_bytes(KvDType::U4, 128), 72);
  EXPECT_EQ(kv_row_bytes(KvDType::Fp8E4M3, 128), 128);
}

}  // namespace
}  // namespace attnlab
