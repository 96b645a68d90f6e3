// .npy files (NumPy format 1.0 / 2.0 / 3.0), float32 or float64, C order.
// Reading rejects, with InvalidInput naming the file and the problem: anything but a
// regular file (a device, pipe or folder), bad magic, unsupported version, a header over
// 64 KiB, dtypes other than '<f4' / '<f8' (the byte order must be written out), Fortran
// order, a shape over 2^36 elements, data shorter or longer than the shape says, more than
// the memory budget. Sizes are checked before any data is read. '<f4' data of 1 MiB or
// more is mapped in place (no copy; a file truncated while in use ends the process with
// exit 2 naming it), smaller data is read once into its final 64-byte aligned buffer.
// float64 is converted to float32.
// Writing goes through write_file_atomic (synced temp file, then rename), so a file is
// whole or absent; write_npy writes the data from the caller's buffer, uncopied.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnlab/atomic_write.hpp"  // write_file_atomic (write_npy uses it)
#include "attnlab/tensor.hpp"

namespace attnlab {

struct NpyArray {
  std::vector<int64_t> shape;
  FloatBuffer data;          // 64-byte aligned; writable (a mapping copies on write)
  std::string source_dtype;  // "<f4" or "<f8"
};

NpyArray read_npy(const std::string& path);
void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape);
// Parse from memory (the reader's core; `name` appears in messages).
NpyArray parse_npy(const std::string& bytes, const std::string& name);
std::string encode_npy(const float* data, const std::vector<int64_t>& shape);

}  // namespace attnlab
