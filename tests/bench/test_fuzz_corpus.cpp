// Every committed fuzz corpus input (tests/fuzz/corpus/<target>/: seeds, inputs the fuzzers
// found, issue reproductions) through the fuzz targets' own checks, in every build: a crash
// the fuzzers once found stays fixed without clang or libFuzzer (under `scripts/lab
// asan-test` with the sanitizers too). Plus the findings' expected outcomes, spelled out.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "attnlab/npy.hpp"
#include "attnlab/problem.hpp"
#include "bench/sweep/experiment.hpp"
#include "targets.hpp"

namespace attnlab {
namespace {

std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void replay(const std::string& target, std::string (*check)(std::string_view)) {
  const std::filesystem::path dir = std::filesystem::path(ATTNLAB_SOURCE_DIR) / "tests/fuzz/corpus" / target;
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    ++files;
    EXPECT_EQ(check(read_bytes(entry.path())), "") << entry.path();
  }
  EXPECT_GT(files, 0) << "no corpus in " << dir;
}

TEST(FuzzCorpus, Npy) { replay("npy", fuzz::check_npy); }
TEST(FuzzCorpus, Experiment) { replay("experiment", fuzz::check_experiment); }
TEST(FuzzCorpus, MaskFlags) { replay("mask_flags", fuzz::check_mask_flags); }

// Found by fuzz_npy: a (0, 4) array passed a null pointer to memcpy (UB, UBSan's nonnull check).
TEST(FuzzFindings, EmptyNpyArrayParses) {
  const NpyArray a = parse_npy(
      read_bytes(std::filesystem::path(ATTNLAB_SOURCE_DIR) / "tests/fuzz/corpus/npy/f4_empty.npy"), "f4_empty.npy");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(a.data.size(), 0u);
}

// Found by fuzz_npy: the reader accepts a 0-element array whatever its other dimensions
// (numpy writes such); the writer refused to write it back (its product overflowed 2^36).
TEST(FuzzFindings, EmptyArrayWithWideShapeRoundTrips) {
  const NpyArray a = parse_npy(
      read_bytes(std::filesystem::path(ATTNLAB_SOURCE_DIR) / "tests/fuzz/corpus/npy/found_empty_wide_shape.npy"),
      "wide.npy");
  const std::vector<int64_t> shape = {100000, 100000, 100000, 0};
  EXPECT_EQ(a.shape, shape);
  EXPECT_EQ(parse_npy(encode_npy(a.data.data(), a.shape), "again.npy").shape, shape);
}

// Found by fuzz_experiment: a number beyond double (nlohmann's out_of_range, not a parse_error)
// escaped as a foreign exception: `attnlab sweep` exited 3 ("error") instead of 2 (bad input).
TEST(FuzzFindings, JsonNumberOverflowIsInvalidInput) {
  try {
    bench::parse_experiment_text(R"({"description": "x", "q_len": 1e999})", "overflow", {"naive"});
    FAIL() << "accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("experiment overflow: not valid JSON"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace attnlab
