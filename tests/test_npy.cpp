// .npy reading and writing: round trips and every rejection with its message.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "attnlab/npy.hpp"
#include "attnlab/problem.hpp"

namespace attnlab {
namespace {

std::string header_v1(const std::string& dict) {
  std::string h = dict;
  size_t total = 10 + h.size() + 1;
  h.append((64 - total % 64) % 64, ' ');
  h += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(h.size() & 0xff);
  out += static_cast<char>(h.size() >> 8);
  return out + h;
}

void expect_reject(const std::string& bytes, const std::string& fragment) {
  try {
    parse_npy(bytes, "x.npy");
    FAIL() << "accepted; expected an error containing: " << fragment;
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("x.npy: ", 0), 0u) << e.what();
  }
}

TEST(Npy, RoundTripFloat32) {
  const float data[6] = {1, -2, 3.5f, 0, 1e-30f, -7};
  const NpyArray a = parse_npy(encode_npy(data, {2, 3}), "a");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(0, std::memcmp(a.data.data(), data, sizeof data));
  const NpyArray b = parse_npy(encode_npy(data, {6}), "b");
  EXPECT_EQ(b.shape, (std::vector<int64_t>{6}));
  EXPECT_EQ(encode_npy(data, {6}).size() % 64, 24u);  // data starts 64-byte aligned
}

TEST(Npy, Float64IsConverted) {
  std::string bytes = header_v1("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }");
  const double d[2] = {0.5, -3.25};
  bytes.append(reinterpret_cast<const char*>(d), sizeof d);
  const NpyArray a = parse_npy(bytes, "f8");
  EXPECT_EQ(a.source_dtype, "<f8");
  EXPECT_EQ(a.data, (std::vector<float>{0.5f, -3.25f}));
}

TEST(Npy, Version2HeaderIsRead) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1), }";
  std::string bytes = "\x93NUMPY";
  bytes += '\x02';
  bytes += '\x00';
  const uint32_t len = static_cast<uint32_t>(dict.size());
  bytes.append(reinterpret_cast<const char*>(&len), 4);
  bytes += dict;
  const float one = 1.f;
  bytes.append(reinterpret_cast<const char*>(&one), 4);
  EXPECT_EQ(parse_npy(bytes, "v2").data[0], 1.f);
}

TEST(Npy, Rejections) {
  const std::string ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
  std::string good = header_v1(ok) + std::string(16, '\0');
  EXPECT_NO_THROW(parse_npy(good, "x.npy"));
  expect_reject("PK\x03\x04 not numpy at all", "bad magic");
  std::string v9 = good;
  v9[6] = 9;
  expect_reject(v9, "unsupported .npy version 9");
  expect_reject(header_v1("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 2), }") + std::string(16, '\0'),
                "dtype '<i4' is not supported; allowed: float32");
  expect_reject(header_v1("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }") + std::string(16, '\0'),
                "Fortran order is not supported");
  expect_reject(header_v1(ok) + std::string(15, '\0'), "truncated data");
  expect_reject(good.substr(0, 20), "truncated header");
  expect_reject(header_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }"), "malformed shape");
}

TEST(Npy, WriteIsAtomicAndLeavesNoTempFile) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("attn_npy_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const float x[3] = {1, 2, 3};
  write_npy((dir / "x.npy").string(), x, {3});
  EXPECT_EQ(read_npy((dir / "x.npy").string()).data, (std::vector<float>{1, 2, 3}));
  int files = 0;
  for ([[maybe_unused]] auto& e : fs::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1);
  EXPECT_THROW(write_npy((dir / "missing" / "y.npy").string(), x, {3}), InvalidInput);
  EXPECT_THROW(read_npy((dir / "nope.npy").string()), InvalidInput);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace attnlab
