#include "attnlab/npy.hpp"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "attnlab/problem.hpp"

namespace attnlab {

namespace {
[[noreturn]] void fail(const std::string& name, const std::string& what) {
  throw InvalidInput(name + ": " + what);
}

std::string trim(std::string s) {
  const auto a = s.find_first_not_of(" \t\n");
  const auto b = s.find_last_not_of(" \t\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// Value of 'key' in the header dict, as raw text up to the next top-level comma/brace.
std::string dict_value(const std::string& header, const std::string& key, const std::string& name) {
  const std::string quoted1 = "'" + key + "'", quoted2 = "\"" + key + "\"";
  auto pos = header.find(quoted1);
  if (pos == std::string::npos) pos = header.find(quoted2);
  if (pos == std::string::npos) fail(name, "header has no '" + key + "' entry");
  pos = header.find(':', pos);
  if (pos == std::string::npos) fail(name, "malformed header near '" + key + "'");
  ++pos;
  int depth = 0;
  size_t end = pos;
  for (; end < header.size(); ++end) {
    const char c = header[end];
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
  }
  return trim(header.substr(pos, end - pos));
}
}  // namespace

NpyArray parse_npy(const std::string& bytes, const std::string& name) {
  static const char kMagic[] = "\x93NUMPY";
  if (bytes.size() < 10 || std::memcmp(bytes.data(), kMagic, 6) != 0) {
    fail(name, "not a .npy file (bad magic; expected \\x93NUMPY)");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) fail(name, "truncated header");
    header_len = 0;
    for (int i = 0; i < 4; ++i) header_len |= size_t(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    header_start = 12;
  } else {
    fail(name, "unsupported .npy version " + std::to_string(major) + "; allowed: 1, 2, 3");
  }
  if (bytes.size() < header_start + header_len) fail(name, "truncated header");
  const std::string header = bytes.substr(header_start, header_len);

  NpyArray arr;
  std::string descr = dict_value(header, "descr", name);
  if (descr.size() >= 2 && (descr.front() == '\'' || descr.front() == '"')) descr = descr.substr(1, descr.size() - 2);
  size_t elem = 0;
  if (descr == "<f4" || descr == "=f4" || descr == "f4") {
    elem = 4;
    arr.source_dtype = "<f4";
  } else if (descr == "<f8" || descr == "=f8" || descr == "f8") {
    elem = 8;
    arr.source_dtype = "<f8";
  } else {
    fail(name, "dtype '" + descr + "' is not supported; allowed: float32 ('<f4'), float64 ('<f8')");
  }
  const std::string fortran = dict_value(header, "fortran_order", name);
  if (fortran == "True") fail(name, "Fortran order is not supported; allowed: C order (np.ascontiguousarray)");
  if (fortran != "False") fail(name, "fortran_order '" + fortran + "' is not True or False");

  std::string shape = dict_value(header, "shape", name);
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')') fail(name, "malformed shape " + shape);
  shape = shape.substr(1, shape.size() - 2);
  std::stringstream ss(shape);
  std::string tok;
  size_t count = 1;
  while (std::getline(ss, tok, ',')) {
    tok = trim(tok);
    if (tok.empty()) continue;
    char* end = nullptr;
    const long long v = std::strtoll(tok.c_str(), &end, 10);
    if (*end != '\0' || v < 0) fail(name, "malformed shape entry '" + tok + "'");
    arr.shape.push_back(v);
    if (v != 0 && count > (size_t(1) << 40) / size_t(v)) fail(name, "shape too large");
    count *= size_t(v);
  }
  const size_t data_start = header_start + header_len;
  const size_t need = count * elem;
  if (bytes.size() - data_start < need) {
    fail(name, "truncated data: shape needs " + std::to_string(need) + " bytes, file has " +
                   std::to_string(bytes.size() - data_start));
  }
  arr.data.resize(count);
  const char* src = bytes.data() + data_start;
  if (elem == 4) {
    std::memcpy(arr.data.data(), src, need);
  } else {
    for (size_t i = 0; i < count; ++i) {
      double d;
      std::memcpy(&d, src + i * 8, 8);
      arr.data[i] = static_cast<float>(d);
    }
  }
  return arr;
}

NpyArray read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InvalidInput(path + ": cannot open for reading");
  std::stringstream buf;
  buf << f.rdbuf();
  return parse_npy(buf.str(), path);
}

std::string encode_npy(const float* data, const std::vector<int64_t>& shape) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  size_t count = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += (i ? ", " : "") + std::to_string(shape[i]);
    count *= size_t(shape[i]);
  }
  if (shape.size() == 1) dict += ",";
  dict += "), }";
  // Pad so the data starts on a 64-byte boundary, header ends with '\n'.
  size_t total = 10 + dict.size() + 1;
  const size_t pad = (64 - total % 64) % 64;
  dict.append(pad, ' ');
  dict += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>((dict.size() >> 8) & 0xff);
  out += dict;
  out.append(reinterpret_cast<const char*>(data), count * sizeof(float));
  return out;
}

void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  write_file_atomic(path, encode_npy(data, shape));
}

}  // namespace attnlab
