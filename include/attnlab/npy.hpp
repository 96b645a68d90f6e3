// .npy files (NumPy format 1.0 / 2.0 / 3.0), C order: float32 or float64 (read as float32),
// float16 ('<f2') and raw bfloat16 bit patterns ('<u2': numpy has no bfloat16), both kept
// as their 16 bits (which dtype a '<u2' file means is the reader's call: --dtype bf16).
// Reading rejects, with InvalidInput naming the file and the problem: anything but a
// regular file (a device, pipe or folder), bad magic, unsupported version, a header over
// 64 KiB, dtypes other than '<f4' / '<f8' / '<f2' / '<u2' (the byte order must be written out), Fortran
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
  FloatBuffer data;              // '<f4' / '<f8': 64-byte aligned; writable (a mapping copies on write)
  std::vector<uint16_t> bits16;  // '<f2' / '<u2': the 16-bit patterns (data is then empty)
  std::vector<uint8_t> bytes8;   // '|b1' / '|u1' (read_npy_mask, read_npy_cache)
  std::string source_dtype;      // "<f4", "<f8", "<f2", "<u2" (or "|b1", "|u1": read_npy_mask, read_npy_cache)
  bool is16() const { return source_dtype == "<f2" || source_dtype == "<u2"; }
};

NpyArray read_npy(const std::string& path);
// A boolean mask file: bool ('|b1') or uint8 ('|u1') only, kept in bytes8.
NpyArray read_npy_mask(const std::string& path);
// K or V of a cache: float data as read_npy, or a quantized cache's raw rows as uint8 ('|u1',
// kept in bytes8; the last dimension is a row's bytes).
NpyArray read_npy_cache(const std::string& path);
// 16-bit data widened exactly into `data` ('<u2' as bf16 bits), for arrays read as float32
// whatever they hold (expected outputs); float data is left as it is.
void widen_to_float(NpyArray& a);
void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape);
// Parse from memory (the reader's core; `name` appears in messages).
NpyArray parse_npy(const std::string& bytes, const std::string& name);
std::string encode_npy(const float* data, const std::vector<int64_t>& shape);
// 16-bit data: '<f2' for f16, '<u2' (bit patterns) for bf16.
void write_npy16(const std::string& path, const uint16_t* bits, const std::vector<int64_t>& shape, DType dtype);

}  // namespace attnlab
