// .npy reading and writing: round trips and every rejection with its message.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>

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
  EXPECT_EQ(std::vector<float>(a.data.begin(), a.data.end()), (std::vector<float>{0.5f, -3.25f}));
}

TEST(Npy, SixteenBitDataIsKeptAsBits) {
  for (const char* descr : {"<f2", "<u2"}) {
    std::string bytes = header_v1(std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (3,), }");
    const uint16_t h[3] = {0x3c00, 0xc000, 0x7c00};  // f16: 1, -2, inf
    bytes.append(reinterpret_cast<const char*>(h), sizeof h);
    NpyArray a = parse_npy(bytes, "h");
    EXPECT_EQ(a.source_dtype, descr);
    EXPECT_TRUE(a.data.empty());
    EXPECT_EQ(a.bits16, (std::vector<uint16_t>{0x3c00, 0xc000, 0x7c00}));
    widen_to_float(a);
    if (std::string(descr) == "<f2") {
      EXPECT_EQ(std::vector<float>(a.data.begin(), a.data.end()), (std::vector<float>{1.f, -2.f, INFINITY}));
    } else {  // the same bits as bf16
      EXPECT_EQ(a.data[0], 0.0078125f);
    }
    expect_reject(bytes.substr(0, bytes.size() - 1), "truncated data");
  }
  // An empty 16-bit array (a fuzzer's find: a copy from a null destination).
  const NpyArray empty = parse_npy(header_v1("{'descr': '<f2', 'fortran_order': False, 'shape': (0,), }"), "e");
  EXPECT_TRUE(empty.bits16.empty());
  const auto dir = std::filesystem::temp_directory_path() / ("attn_npy16_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const uint16_t bits[4] = {1, 2, 3, 0xffff};
  write_npy16((dir / "b.npy").string(), bits, {2, 2}, DType::BF16);
  const NpyArray b = read_npy((dir / "b.npy").string());
  EXPECT_EQ(b.source_dtype, "<u2");
  EXPECT_EQ(b.bits16, (std::vector<uint16_t>{1, 2, 3, 0xffff}));
  EXPECT_THROW(write_npy16((dir / "c.npy").string(), bits, {4}, DType::F32), InvalidInput);
  std::filesystem::remove_all(dir);
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

TEST(Npy, HostileHeadersAreRefusedBeforeAnyDataIsRead) {
  const std::string ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
  const std::string good = header_v1(ok) + std::string(16, '\0');
  expect_reject(good + "x", "1 trailing bytes after the data (shape needs 16 bytes of <f4); allowed: exactly");
  // The byte order must be written out: '=' / none mean "whatever machine wrote it".
  for (const char* dtype : {">f4", "=f4", "f4", "|f4", ">f8", "=f8", ">f2", "f2", "<i2", "|u1", "<c8"}) {
    expect_reject(header_v1("{'descr': '" + std::string(dtype) + "', 'fortran_order': False, 'shape': (2, 2), }") +
                      std::string(16, '\0'),
                  "dtype '" + std::string(dtype) +
                      "' is not supported; allowed: float32 ('<f4'), float64 ('<f8'), "
                      "float16 ('<f2') or raw bfloat16 bits ('<u2'), little-endian");
  }
  // Shapes whose element count wraps or exceeds 2^36, and entries that are not integers.
  expect_reject(header_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }"),
                "has more than 2^36 (68719476736) elements");
  expect_reject(header_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (68719476737,), }"), "has more than 2^36");
  expect_reject(header_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }"),
                "malformed shape entry '99999999999999999999'");
  expect_reject(header_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (-4,), }"), "malformed shape entry '-4'");
  // A zero dimension makes an empty array, however large the others are.
  EXPECT_EQ(
      parse_npy(header_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 68719476737), }"), "e").data.size(),
      0u);
  // A huge declared shape over a short file is "truncated", not a huge allocation.
  expect_reject(header_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000,), }") + "abcd",
                "truncated data: shape needs 4000000000 bytes of <f4 after the header, file has 4");
  // Header lengths are bounded (version 2 allows 4 GiB headers).
  std::string v2 = "\x93NUMPY";
  v2 += '\x02';
  v2 += '\x00';
  v2 += std::string("\x00\x00\x00\x80", 4);  // 2^31
  expect_reject(v2 + ok, "header length 2147483648 is too large; allowed: at most 65536 bytes");
}

class NpyFiles : public ::testing::Test {
 protected:
  std::filesystem::path dir;
  void SetUp() override {
    dir = std::filesystem::temp_directory_path() / ("attn_npyf_" + std::to_string(::getpid()) + "_" +
                                                    ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
  std::string file(const std::string& name, const std::string& bytes) const {
    const std::string p = (dir / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  static void expect_read_fails(const std::string& path, const std::string& fragment) {
    try {
      read_npy(path);
      ADD_FAILURE() << "read " << path << "; expected an error containing: " << fragment;
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(path + ": " + fragment), std::string::npos) << e.what();
    }
  }
};

// `attnlab run --q /dev/zero` used to read forever: only regular files are read.
TEST_F(NpyFiles, OnlyRegularFilesAreRead) {
  expect_read_fails("/dev/zero", "is not a regular file (a character device); allowed: a regular .npy file");
  expect_read_fails(dir.string(), "is not a regular file (a directory)");
  const std::string fifo = (dir / "pipe.npy").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_read_fails(fifo, "is not a regular file (a pipe)");  // without waiting for a writer
  expect_read_fails((dir / "missing.npy").string(), "cannot open for reading: No such file or directory");
}

TEST_F(NpyFiles, FilesAreCheckedLikeBytes) {
  const std::string ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
  expect_read_fails(file("long.npy", header_v1(ok) + std::string(20, '\0')), "4 trailing bytes after the data");
  expect_read_fails(file("short.npy", header_v1(ok) + std::string(15, '\0')), "truncated data");
  expect_read_fails(file("tiny.npy", "\x93NUM"), "not a .npy file (bad magic");
  expect_read_fails(file("empty.npy", ""), "not a .npy file");
  expect_read_fails(file("big.npy", header_v1("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }") + "abcd"),
                    "dtype '>f4' is not supported");
}

// Data lands 64-byte aligned; float64 is converted chunk by chunk (more than one chunk here).
TEST_F(NpyFiles, ReadsIntoAlignedBuffersAndConvertsFloat64) {
  std::vector<float> f(1000);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i) * 0.25f - 7;
  const NpyArray a = read_npy(file("f4.npy", encode_npy(f.data(), {10, 100})));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data.data()) % 64, 0u);
  EXPECT_EQ(std::vector<float>(a.data.begin(), a.data.end()), f);
  const size_t n = (size_t{1} << 17) + 5;
  std::vector<double> d(n);
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<double>(i) + 0.5;
  const std::string bytes =
      header_v1("{'descr': '<f8', 'fortran_order': False, 'shape': (" + std::to_string(n) + ",), }") +
      std::string(reinterpret_cast<const char*>(d.data()), n * 8);
  const NpyArray b = read_npy(file("f8.npy", bytes));
  EXPECT_EQ(b.source_dtype, "<f8");
  ASSERT_EQ(b.data.size(), n);
  for (size_t i : {size_t{0}, size_t{1} << 17, n - 1}) EXPECT_EQ(b.data[i], static_cast<float>(d[i])) << i;
}

// Large '<f4' files are mapped, not copied: same values, 64-byte aligned, writable without
// changing the file; a file truncated by someone else while mapped ends the process with
// the bad-input exit and the file's name, not a crash.
TEST_F(NpyFiles, LargeFilesAreMappedSafely) {
  std::vector<float> f(size_t{1} << 19);  // 2 MiB: above the mapping threshold
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i % 1000) - 500.5f;
  const std::string path = file("big.npy", encode_npy(f.data(), {512, 1024}));
  {
    NpyArray a = read_npy(path);
    ASSERT_EQ(a.data.size(), f.size());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data.data()) % 64, 0u);
    EXPECT_EQ(std::memcmp(a.data.data(), f.data(), f.size() * 4), 0);
    a.data[0] = 42.f;
    NpyArray moved = std::move(a);
    EXPECT_EQ(moved.data[0], 42.f);
  }
  EXPECT_EQ(read_npy(path).data[0], f[0]) << "a write to the data changed the file";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const NpyArray m = read_npy(path);
        ::truncate(path.c_str(), 128);
        volatile float last = m.data[m.data.size() - 1];
        (void)last;
        std::exit(0);
      },
      ::testing::ExitedWithCode(2), "big.npy: the file shrank while it was in use");
}

TEST(Npy, WriteIsAtomicAndLeavesNoTempFile) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("attn_npy_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const float x[3] = {1, 2, 3};
  write_npy((dir / "x.npy").string(), x, {3});
  const NpyArray back = read_npy((dir / "x.npy").string());
  EXPECT_EQ(std::vector<float>(back.data.begin(), back.data.end()), (std::vector<float>{1, 2, 3}));
  int files = 0;
  for ([[maybe_unused]] auto& e : fs::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1);
  EXPECT_THROW(write_npy((dir / "missing" / "y.npy").string(), x, {3}), IoError);
  EXPECT_THROW(read_npy((dir / "nope.npy").string()), InvalidInput);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace attnlab
