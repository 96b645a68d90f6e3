// The quantized KV-cache layouts (include/attnlab/kv_quant.hpp): blocks computed by hand
// against the bytes the writer produces, the readers' values, the FP8 grids, the error a
// round trip may make, and the special values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "attnlab/isa.hpp"
#include "attnlab/kernel.hpp"
#include "attnlab/kv_quant.hpp"
#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"
#include "attnlab/verify.hpp"
#include "test_util.hpp"

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

// ---- Quantized caches in the kernels (Problem::kv_dtype) ----

// The Q rule of integer K.Q (round_q_row): per 32-value block for q8_0 / q4_0, per row for u8 /
// u4; scale = amax / 127, codes round(x / scale) within +-127; a zero block is scale 0, codes 0;
// a row with a NaN or an Inf is not rounded.
TEST(KvQuant, QRowsRoundToInt8ByTheirBlock) {
  std::vector<float> x(64);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16) / 16.0f;  // amax 1 (x_0 = -1)
  for (int j = 32; j < 64; ++j) x[j] = 0.f;                                // an all-zero block
  x[40] = 0.f;
  std::vector<int8_t> q(64);
  std::vector<float> sc(64);
  ASSERT_TRUE(round_q_row(KvDType::Q8_0, x.data(), 64, q.data(), sc.data()));
  EXPECT_EQ(q_block_values(KvDType::Q8_0, 64), 32);
  EXPECT_FLOAT_EQ(sc[0], 1.0f / 127.0f);
  EXPECT_EQ(q[0], -127);
  EXPECT_EQ(q[16], 0);
  EXPECT_EQ(q[24], static_cast<int8_t>(std::roundf(0.5f / (1.0f / 127.0f))));  // 63.5 -> 64
  EXPECT_EQ(sc[1], 0.f);
  for (int j = 32; j < 64; ++j) EXPECT_EQ(q[j], 0);
  // u8 / u4: one block, the whole row; the largest magnitude is now 2 (x_63).
  x[63] = 2.0f;
  ASSERT_TRUE(round_q_row(KvDType::U8, x.data(), 64, q.data(), sc.data()));
  EXPECT_EQ(q_block_values(KvDType::U4, 64), 64);
  EXPECT_FLOAT_EQ(sc[0], 2.0f / 127.0f);
  EXPECT_EQ(q[63], 127);
  EXPECT_EQ(q[0], static_cast<int8_t>(std::roundf(-1.0f / (2.0f / 127.0f))));
  for (int8_t c : q) EXPECT_GE(c, -127);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    x[5] = bad;
    EXPECT_FALSE(round_q_row(KvDType::Q4_0, x.data(), 64, q.data(), sc.data())) << bad;
  }
  EXPECT_TRUE(kv_int_dot(KvDType::U4) && !kv_int_dot(KvDType::Fp8E4M3) && !kv_int_dot(KvDType::Same));
}

// decode_i8's P rounding by hand (round_p_tile): against the largest |w|, half to even, the same
// codes for the same weights times any power of two (the kernel's running max never changes them),
// signed with 127 levels for q4_0 alone, zeros to zeros, and no rounding of a NaN, an Inf, a
// negative weight (unsigned) or weights too small for a step.
TEST(KvQuant, PRoundsAgainstTheTilesLargestWeight) {
  std::vector<int32_t> codes(6);
  float q = 0.f;
  const std::vector<float> w = {255.f, 127.5f, 0.5f, 1.5f, 2.5f, 0.f};
  ASSERT_TRUE(round_p_tile(w.data(), 6, false, codes.data(), &q));
  EXPECT_EQ(codes, (std::vector<int32_t>{255, 128, 0, 2, 2, 0}));
  EXPECT_EQ(q, 1.f);
  std::vector<float> small = w;
  for (float& x : small) x = std::ldexp(x, -20);
  std::vector<int32_t> again(6);
  ASSERT_TRUE(round_p_tile(small.data(), 6, false, again.data(), &q));
  EXPECT_EQ(again, codes);
  EXPECT_EQ(q, std::ldexp(1.f, -20));
  const std::vector<float> sw = {-127.f, 63.5f, -0.5f, 10.f};
  ASSERT_TRUE(round_p_tile(sw.data(), 4, true, codes.data(), &q));
  EXPECT_EQ(std::vector<int32_t>(codes.begin(), codes.begin() + 4), (std::vector<int32_t>{-127, 64, 0, 10}));
  EXPECT_EQ(q, 1.f);
  const std::vector<float> zeros(6, 0.f);
  codes.assign(6, 9);
  ASSERT_TRUE(round_p_tile(zeros.data(), 6, false, codes.data(), &q));
  EXPECT_EQ(codes, std::vector<int32_t>(6, 0));
  EXPECT_EQ(q, 0.f);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> x = w;
    x[3] = bad;
    EXPECT_FALSE(round_p_tile(x.data(), 6, false, codes.data(), &q)) << bad;
  }
  const std::vector<float> negative = {3.f, -1.f};  // unsigned codes: a negative weight does not round
  EXPECT_FALSE(round_p_tile(negative.data(), 2, false, codes.data(), &q));
  EXPECT_TRUE(round_p_tile(negative.data(), 2, true, codes.data(), &q));
  const std::vector<float> tiny = {1e-44f, 3e-45f};  // 255 / wmax overflows: no step to round to
  EXPECT_FALSE(round_p_tile(tiny.data(), 2, false, codes.data(), &q));
  for (KvDType t : quantized_kv_dtypes()) EXPECT_EQ(p_codes_signed(t), t == KvDType::Q4_0) << to_string(t);
}

namespace kvcache {

Problem cache_shape(int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d, KvDType t) {
  Problem p;
  p.batch = b, p.q_heads = hq, p.kv_heads = hkv, p.q_len = sq, p.kv_len = sk, p.head_dim = d;
  p.kv_dtype = t;
  return p;
}

using test::runnable;

KernelCheck check(const Kernel& k, const Problem& p, const Tensors& t, int threads = 2) {
  return test::check_all_rows(k, p, t, threads);
}

}  // namespace kvcache

// Every cache type through naive, flash, decode and decode_i8 (its integer types; every target): decode's key chunks
// (300 and 1000 keys cross them), GQA and MQA, causal, a window, per-batch kv lengths (an empty one), d_v != d, chunked
// prefill (query rows over a longer cache), sparse patterns (sinks and a window: the block map's words and its
// gathered sink tile, read from the quantized rows), and a head dim that ends in a partial vector (row types, fp8).
TEST(KvCache, KernelsThatReadACacheAgreeOnEveryCacheType) {
  using kvcache::cache_shape;
  for (KvDType type : quantized_kv_dtypes()) {
    std::vector<Problem> shapes;
    shapes.push_back(cache_shape(2, 8, 2, 1, 300, 64, type));
    shapes.back().causal = CausalAlign::BottomRight;
    shapes.push_back(cache_shape(1, 4, 4, 3, 1000, 128, type));
    shapes.back().head_dim_v = 64;
    shapes.push_back(cache_shape(2, 6, 1, 2, 257, 32, type));
    shapes.back().kv_lens = {0, 200};
    shapes.back().window_left = 50, shapes.back().window_right = 0;
    shapes.push_back(cache_shape(1, 8, 2, 70, 333, 64, type));  // prefill of 70 rows after 263 cached
    shapes.back().causal = CausalAlign::BottomRight;
    shapes.push_back(cache_shape(1, 4, 2, 2, 700, 64, type));  // StreamingLLM: 4 sinks + a window
    shapes.back().sinks = 4, shapes.back().window_left = 100, shapes.back().window_right = 0;
    shapes.back().causal = CausalAlign::BottomRight;
    if (kv_block_values(type) == 1) shapes.push_back(cache_shape(1, 4, 2, 2, 130, 40, type));  // a vector's tail
    for (const Problem& p : shapes) {
      p.validate();
      const Tensors t = random_tensors(p, 11);
      for (const char* name : {"naive", "flash", "decode", "decode_i8"}) {
        for (const Kernel* k : kvcache::runnable(name)) {
          if (std::string_view(name).starts_with("decode") && p.q_len > 16) continue;  // prefill: decode refuses
          if (std::string_view(name) == "decode_i8" && !kv_int_dot(type)) continue;    // no integer codes
          const KernelCheck c = kvcache::check(*k, p, t);
          EXPECT_EQ(c.verdict, Verdict::Pass)
              << k->name() << "[" << k->isa() << "] " << p.describe() << ": " << c.reason << " (O err "
              << c.errors.o_rel << ", tol " << c.tol.o_rel << ")";
        }
      }
    }
  }
}

// The reference reads the quantized cache, not the float values it was written from: the
// kernels' O is far from the float inputs' attention for q4_0 and within float32 rounding of the
// dequantized cache's.
TEST(KvCache, TheReferenceReadsTheCacheNotTheFloatsItCameFrom) {
  Problem p = kvcache::cache_shape(1, 2, 2, 1, 64, 32, KvDType::Q4_0);
  const Tensors t = random_tensors(p, 3);
  Problem f = p;
  f.kv_dtype = KvDType::Same;
  const Tensors floats = random_tensors(f, 3);  // the same values, before quantization
  const Reference of_cache = reference(p, t.inputs), of_floats = reference(f, floats.inputs);
  double diff = 0;
  for (size_t i = 0; i < of_cache.o.size(); ++i) diff = std::max(diff, std::fabs(of_cache.o[i] - of_floats.o[i]));
  EXPECT_GT(diff, 1e-3) << "q4_0 moves O by its quantization error";
}

TEST(KvCache, OtherKernelsRefuseNamingTheOnesThatRead) {
  const Problem p = kvcache::cache_shape(1, 8, 8, 64, 64, 64, KvDType::Q8_0);
  for (const Kernel* k : variants()) {
    const Support s = supports_problem(*k, p);
    if (k->capabilities().kv_quant) continue;
    ASSERT_FALSE(s) << k->name();
    EXPECT_NE(s.reason.find("kv_dtype q8_0 (naive, flash, decode, decode_i8, cuda_decode read a quantized cache)"),
              std::string::npos)
        << s.reason;
  }
}

TEST(KvCache, BadProblemsNameTheField) {
  const auto error = [](const Problem& p) {
    try {
      p.validate();
    } catch (const InvalidInput& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  Problem p = kvcache::cache_shape(1, 2, 2, 1, 8, 40, KvDType::Q8_0);
  EXPECT_NE(error(p).find("head_dim: 40 is not a multiple of 32, the block of kv_dtype q8_0"), std::string::npos)
      << error(p);
  p.head_dim = 64, p.head_dim_v = 48, p.kv_dtype = KvDType::Q4_0;
  EXPECT_NE(error(p).find("head_dim_v: 48 is not a multiple of 32"), std::string::npos) << error(p);
  p.head_dim_v = 0, p.kv_dtype = KvDType::U8, p.dtype = DType::BF16;
  EXPECT_NE(error(p).find("kv_dtype: u8 with dtype bf16; allowed: dtype f32"), std::string::npos) << error(p);
  p.dtype = DType::F32, p.head_dim = 40;
  EXPECT_EQ(error(p), "accepted") << "u8 rows take any head_dim";
  // Bytes streamed are the cache's: q8_0 is 34 bytes per 32 values.
  const Problem q = kvcache::cache_shape(1, 8, 2, 1, 1024, 128, KvDType::Q8_0);
  EXPECT_DOUBLE_EQ(q.kv_bytes(), 2.0 * 1024 * 2 * (4 * 34));
  EXPECT_DOUBLE_EQ(q.kv_bytes_per_token(), 2.0 * 2 * (4 * 34));
}

// A NaN or Inf in a block poisons that block when read back; the rows that see that key get
// NaN in O as the reference has it, the others stay finite.
TEST(KvCache, SpecialValuesFollowTheReference) {
  for (KvDType type : {KvDType::Q8_0, KvDType::Q4_0, KvDType::U4, KvDType::Fp8E5M2}) {
    Problem p = kvcache::cache_shape(1, 4, 2, 2, 300, 64, type);
    p.causal = CausalAlign::BottomRight;
    Problem f = p;
    f.kv_dtype = KvDType::Same;
    Tensors floats = random_tensors(f, 5);
    const_cast<float*>(floats.inputs.k.row(0, 1, 299))[3] = std::numeric_limits<float>::quiet_NaN();  // the last key
    const Tensors t = convert_inputs(p, floats.inputs);
    for (const char* name : {"naive", "flash", "decode", "decode_i8"}) {
      for (const Kernel* k : kvcache::runnable(name)) {
        if (std::string_view(name) == "decode_i8" && !kv_int_dot(type)) continue;
        const KernelCheck c = kvcache::check(*k, p, t);
        EXPECT_EQ(c.verdict, Verdict::Pass) << name << " " << to_string(type) << ": " << c.reason;
      }
    }
    const Reference ref = reference(p, t.inputs);
    for (size_t r = 0; r < ref.rows.size(); ++r) {
      const RowId& id = ref.rows[r];
      const bool sees = p.kv_head_of(id.h) == 1 && id.i == 1;  // kv head 1, the row that sees key 299
      EXPECT_EQ(std::isnan(ref.o[r * ref.dim]), sees) << to_string(type) << " h" << id.h << " i" << id.i;
    }
  }
}

// fp8_e4m3's NaN code (0x7f; 0xff with the sign) wherever it lies: the tile engine reads a direct task's tile
// that holds none by a shorter rule (tiles.cpp: e4m3_finite, then Quant<T, true>), so a code at any lane of
// a K or V row, at any key of a tile (its first, its last, the cache's last), contiguous or paged (16-token
// blocks: a tile in runs), must still poison exactly what the reference's NaN poisons.
TEST(KvCache, Fp8E4M3NanCodesAnywhereFollowTheReference) {
  for (int64_t block : {0, 16}) {
    Problem c = kvcache::cache_shape(1, 4, 2, 2, 300, 64, KvDType::Fp8E4M3);
    c.causal = CausalAlign::BottomRight;
    Problem p = c, f = c;
    p.kv_block = block;
    f.kv_dtype = KvDType::Same;
    int planted = 0;
    for (bool in_v : {false, true}) {
      for (int64_t key : {0, 1, 63, 64, 127, 298, 299}) {
        for (int64_t lane : {0, 15, 16, 31, 63}) {
          Tensors floats = random_tensors(f, 5);
          const float nan = (++planted % 2 ? 1.f : -1.f) * std::numeric_limits<float>::quiet_NaN();
          const ConstView& view = in_v ? floats.inputs.v : floats.inputs.k;
          const_cast<float*>(view.row(0, 1, key))[lane] = nan;
          const Tensors contiguous = convert_inputs(c, floats.inputs);
          const Tensors paged = block ? page_kv(p, contiguous.inputs) : Tensors{};
          const Tensors& t = block ? paged : contiguous;
          const Reference ref = reference(p, t.inputs);
          ASSERT_TRUE(std::any_of(ref.o.begin(), ref.o.end(), [](double x) { return std::isnan(x); }));
          for (const char* name : {"flash", "decode"}) {
            for (const Kernel* k : kvcache::runnable(name)) {
              const KernelCheck r = kvcache::check(*k, p, t);
              EXPECT_EQ(r.verdict, Verdict::Pass)
                  << k->name() << "[" << k->isa() << "] " << (in_v ? "V" : "K") << " key " << key << " lane " << lane
                  << " block " << block << ": " << r.reason;
            }
          }
        }
      }
    }
  }
}

// An fp8 cache whose per-tensor scale is not 1 (the lab writes 1): the tile engine's kernels refuse it
// naming kv_scale; naive reads it.
TEST(KvCache, TileEngineRefusesAnFp8ScaleOtherThanOne) {
  const Problem p = kvcache::cache_shape(1, 4, 2, 1, 100, 32, KvDType::Fp8E4M3);
  Tensors t = random_tensors(p, 4);
  t.inputs.kv_scale = 2.0f;
  Tensors out = allocate_outputs(p);
  for (const char* name : {"flash", "decode"}) {
    for (const Kernel* k : kvcache::runnable(name)) {
      Session s(*k, p, 1);
      try {
        s.run(t.inputs, out.outputs);
        ADD_FAILURE() << k->name() << "[" << k->isa() << "] read a scale-2 cache";
      } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("kv_scale: "), std::string::npos) << e.what();
      }
    }
  }
  Session naive(kernel_or_throw("naive"), p, 1);
  EXPECT_NO_THROW(naive.run(t.inputs, out.outputs));
}

// Planted reader bugs: the agreement must catch each. A test kernel hands decode a copy of the
// cache with one defect a reader could have.
class PlantedCacheBug final : public test::Wrapped {
 public:
  // ZeroPointDropped (u8 / u4) and ScaleSquared (q8_0 / q4_0): what an integer K.Q that forgets
  // the zero point's sum(q) term or applies K's scale twice computes.
  enum Bug { WrongScale, BlockOffByOne, SwappedNibbles, StaleRow, ZeroPointDropped, ScaleSquared };
  PlantedCacheBug(const Kernel& inner, Bug bug) : Wrapped(inner), bug_(bug) {}
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    const int64_t rows = p.batch * p.kv_heads * p.kv_len, bytes = in.kq.dim;
    std::vector<std::byte> k(reinterpret_cast<const std::byte*>(in.kq.data),
                             reinterpret_cast<const std::byte*>(in.kq.data) + rows * bytes);
    for (int64_t r = 0; r < rows; ++r) {
      std::byte* row = k.data() + r * bytes;
      switch (bug_) {
        case WrongScale: row[0] ^= std::byte{0x04}; break;          // the f16 scale's mantissa
        case BlockOffByOne: std::memcpy(row, row + 18, 18); break;  // block 1 read for block 0
        case SwappedNibbles:
          for (int j = 2; j < 18; ++j) row[j] = (row[j] << 4) | (row[j] >> 4);  // value j+16 read as j
          break;
        case StaleRow:
          if (r % p.kv_len == p.kv_len - 1) std::memcpy(row, row - bytes, static_cast<size_t>(bytes));
          break;
        case ZeroPointDropped: std::memset(row + 4, 0, 4); break;  // u8 / u4: zp = 0
        case ScaleSquared:
          for (int64_t b = 0; b < bytes; b += p.kv_dtype == KvDType::Q8_0 ? 34 : 18) {
            uint16_t h;
            std::memcpy(&h, row + b, 2);
            const float d = to_float(f16{h});
            h = to_f16(d * d).bits;
            std::memcpy(row + b, &h, 2);
          }
          break;
      }
    }
    Inputs bad = in;
    bad.kq.data = k.data();
    inner_.run(p, bad, out, ctx);
  }

 private:
  Bug bug_;
};

TEST(KvCache, PlantedReaderBugsFail) {
  const Problem p = kvcache::cache_shape(1, 8, 2, 1, 300, 64, KvDType::Q4_0);
  const Tensors t = random_tensors(p, 9);
  for (const Kernel* k : kvcache::runnable("decode")) {
    for (auto bug : {PlantedCacheBug::WrongScale, PlantedCacheBug::BlockOffByOne, PlantedCacheBug::SwappedNibbles,
                     PlantedCacheBug::StaleRow}) {
      const PlantedCacheBug planted(*k, bug);
      EXPECT_EQ(kvcache::check(planted, p, t).verdict, Verdict::Fail) << "bug " << bug << " passed on " << k->isa();
    }
    EXPECT_EQ(kvcache::check(*k, p, t).verdict, Verdict::Pass) << "the same cache, read right";
  }
}

// The same for decode_i8 under its own, wider tolerance (int8 products: what rounding Q costs, derived):
// the reader bugs, a dropped zero point and a squared scale still fail on every target. Not
// WrongScale: a scale 2^-8 off (0.4%) moves O by 1.7e-4 of the row scale here, inside the 7e-4 that
// rounding Q to int8 (steps of 1/127 of each block's largest value) may - the float decode catches it.
TEST(KvCache, PlantedBugsFailUnderTheInt8Tolerance) {
  using B = PlantedCacheBug;
  const std::vector<std::pair<KvDType, std::vector<B::Bug>>> cases = {
      {KvDType::Q4_0, {B::BlockOffByOne, B::SwappedNibbles, B::StaleRow, B::ScaleSquared}},
      {KvDType::Q8_0, {B::ScaleSquared, B::StaleRow}},
      {KvDType::U8, {B::ZeroPointDropped, B::StaleRow}},
      {KvDType::U4, {B::ZeroPointDropped}}};
  int ran = 0;
  for (const auto& [type, bugs] : cases) {
    const Problem p = kvcache::cache_shape(1, 8, 2, 1, 300, 64, type);
    const Tensors t = random_tensors(p, 9);
    for (const Kernel* k : kvcache::runnable("decode_i8")) {
      for (B::Bug bug : bugs) {
        const PlantedCacheBug planted(*k, bug);
        const KernelCheck c = kvcache::check(planted, p, t);
        EXPECT_EQ(c.verdict, Verdict::Fail) << "bug " << bug << " passed on " << k->isa() << ", " << to_string(type)
                                            << " (O err " << c.errors.o_rel << ", tol " << c.tol.o_rel << ")";
      }
      EXPECT_EQ(kvcache::check(*k, p, t).verdict, Verdict::Pass) << k->isa() << ", " << to_string(type);
      ++ran;
    }
  }
  EXPECT_GT(ran, 0) << "decode_i8's scalar target runs everywhere";
}

// Without VNNI the avx2 and avx512 targets sum the same products with vpmaddubsw + vpmaddwd (q8_0's
// and u8's codes as magnitudes, their signs moved onto Q); ATTN_NO_VNNI=1 takes that path on a CPU
// that has VNNI, so both run here: every integer type, GQA and MHA, d 96 (a half chunk on avx512),
// u8's extreme codes 0 and 255 (each row's min and max) and q8_0's -128.
TEST(KvCache, Int8WithoutVnniAgreesToo) {
  // A CPU without VNNI runs the fallback either way: one pass (the emulated CPUs of bochs_check).
  const bool vnni = cpu_runs_isa("avx512_vnni") || cpu_runs_isa("avx_vnni");
  for (const char* env : {"1", "0"}) {
    if (!vnni && env[0] == '0') continue;
    ASSERT_EQ(setenv("ATTN_NO_VNNI", env, 1), 0);
    for (KvDType type : {KvDType::Q8_0, KvDType::Q4_0, KvDType::U8, KvDType::U4}) {
      for (int64_t heads : {2, 8}) {
        Problem p = kvcache::cache_shape(1, 8, heads, 2, 200, 96, type);
        p.causal = CausalAlign::BottomRight;
        Tensors t = random_tensors(p, 31);
        if (type == KvDType::Q8_0) {
          auto* k = const_cast<std::byte*>(t.inputs.kq.data);
          for (int64_t r = 0; r < p.kv_heads * p.kv_len; r += 5) k[r * t.inputs.kq.dim + 2 + r % 32] = std::byte{0x80};
        }
        for (const Kernel* k : kvcache::runnable("decode_i8")) {
          const KernelCheck c = kvcache::check(*k, p, t);
          EXPECT_EQ(c.verdict, Verdict::Pass) << "ATTN_NO_VNNI=" << env << " " << k->isa() << " " << to_string(type)
                                              << " kv_heads " << heads << ": " << c.reason;
        }
      }
    }
  }
  unsetenv("ATTN_NO_VNNI");
  EXPECT_EQ(kvcache::runnable("decode_i8").size(), kvcache::runnable("decode").size())
      << "decode_i8 runs on every target decode runs on (VNNI or not)";
}

// Special values through the integer paths (VNNI and vpmaddubsw, every target): a NaN in K or an Inf
// in V at the first and last key of a 64-key tile, a 4-key register block's last key and the last
// key, in the first and the last 32-value block of the row (the first and the second half of an
// AVX-512 chunk): the rows that see that key get what the reference gets, the others stay finite.
TEST(KvCache, Int8SpecialValuesAtEveryKeyAndBlockPosition) {
  const bool vnni = cpu_runs_isa("avx512_vnni") || cpu_runs_isa("avx_vnni");
  int ran = 0;
  for (const char* env : {"1", "0"}) {
    if (!vnni && env[0] == '0') continue;
    ASSERT_EQ(setenv("ATTN_NO_VNNI", env, 1), 0);
    for (KvDType type : {KvDType::Q8_0, KvDType::Q4_0, KvDType::U8, KvDType::U4}) {
      Problem p = kvcache::cache_shape(1, 4, 2, 2, 150, 64, type);
      p.causal = CausalAlign::BottomRight;
      Problem f = p;
      f.kv_dtype = KvDType::Same;
      for (int64_t j : {int64_t{0}, int64_t{3}, int64_t{63}, int64_t{64}, int64_t{149}}) {
        for (int64_t at : {int64_t{5}, int64_t{63}}) {
          Tensors floats = random_tensors(f, 41);
          const bool in_k = (j + at) % 2 == 0;
          float* row = const_cast<float*>((in_k ? floats.inputs.k : floats.inputs.v).row(0, 1, j));
          row[at] = in_k ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
          const Tensors t = convert_inputs(p, floats.inputs);
          for (const Kernel* k : kvcache::runnable("decode_i8")) {
            const KernelCheck c = kvcache::check(*k, p, t);
            EXPECT_EQ(c.verdict, Verdict::Pass) << "ATTN_NO_VNNI=" << env << " " << k->isa() << " " << to_string(type)
                                                << " key " << j << " value " << at << ": " << c.reason;
            ++ran;
          }
        }
      }
    }
  }
  unsetenv("ATTN_NO_VNNI");
  EXPECT_GT(ran, 0);
}

// A q8_0 cache another writer filled may hold the code -128 (the lab's and ggml's writers stop at
// -127): q8_0's integer path offsets codes by 128, so -128 is its edge; it must read as -128 d.
// Q rows with a NaN or an Inf cannot be rounded: their task multiplies in float32, and NaN / Inf
// reach O as the reference has them; a zero Q row (scale 0) and a constant K row agree too.
TEST(KvCache, Int8ScoresAtTheirEdges) {
  Problem p = kvcache::cache_shape(1, 4, 2, 2, 200, 64, KvDType::Q8_0);
  p.causal = CausalAlign::BottomRight;
  Tensors t = random_tensors(p, 21);
  auto* k = const_cast<std::byte*>(t.inputs.kq.data);
  for (int64_t r = 0; r < p.kv_heads * p.kv_len; r += 3) k[r * t.inputs.kq.dim + 2 + r % 32] = std::byte{0x80};
  for (const Kernel* dk : kvcache::runnable("decode_i8")) {
    const KernelCheck c = kvcache::check(*dk, p, t);
    EXPECT_EQ(c.verdict, Verdict::Pass) << dk->isa() << " code -128: " << c.reason;
  }
  for (KvDType type : {KvDType::Q4_0, KvDType::U8}) {
    for (int plant = 0; plant < 4; ++plant) {
      Problem pu = kvcache::cache_shape(1, 4, 2, 2, 200, 64, type);
      pu.causal = CausalAlign::BottomRight;
      Problem f = pu;
      f.kv_dtype = KvDType::Same;
      Tensors floats = random_tensors(f, 22);
      auto* q = const_cast<float*>(floats.inputs.q.data);
      auto* kf = const_cast<float*>(floats.inputs.k.row(0, 1, 150));
      switch (plant) {
        case 0: q[5] = std::numeric_limits<float>::quiet_NaN(); break;      // head 0, row 0
        case 1: q[64 + 7] = std::numeric_limits<float>::infinity(); break;  // head 0, row 1
        case 2: std::fill(q, q + 64, 0.f); break;
        case 3: std::fill(kf, kf + 64, 0.25f); break;
      }
      const Tensors tt = convert_inputs(pu, floats.inputs);
      for (const Kernel* dk : kvcache::runnable("decode_i8")) {
        const KernelCheck c = kvcache::check(*dk, pu, tt);
        EXPECT_EQ(c.verdict, Verdict::Pass)
            << dk->isa() << " " << to_string(type) << " plant " << plant << ": " << c.reason;
      }
    }
  }
}

}  // namespace
}  // namespace attnlab
