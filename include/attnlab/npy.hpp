// .npy files (NumPy format 1.0 / 2.0 / 3.0), float32 or float64, C order.
// Reading rejects, with InvalidInput naming the file and the problem: bad magic,
// unsupported version, other dtypes, Fortran order, truncated data. float64 is
// converted to float32. Writing goes through write_file_atomic (synced temp file, then
// rename), so a file is whole or absent.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnlab/atomic_write.hpp"  // write_file_atomic (write_npy uses it)

namespace attnlab {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;
  std::string source_dtype;  // "<f4" or "<f8"
};

NpyArray read_npy(const std::string& path);
void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape);
// Parse from memory (the reader's core; `name` appears in messages).
NpyArray parse_npy(const std::string& bytes, const std::string& name);
std::string encode_npy(const float* data, const std::vector<int64_t>& shape);

}  // namespace attnlab
