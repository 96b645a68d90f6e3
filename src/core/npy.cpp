#include "attnlab/npy.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string_view>

#include "attnlab/limits.hpp"
#include "attnlab/problem.hpp"

namespace attnlab {

namespace {
[[noreturn]] void fail(const std::string& name, const std::string& what) { throw InvalidInput(name + ": " + what); }

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

// numpy itself refuses headers above 10000 bytes by default; a shape never needs more.
constexpr size_t kMaxHeaderLen = size_t{1} << 16;
static_assert(std::endian::native == std::endian::little,
              "'<f4' data is read in place: the host must be little-endian");

// What the header says about the data that follows it.
struct NpyHeader {
  std::vector<int64_t> shape;
  std::string dtype;      // "<f4", "<f8", "<f2" or "<u2"
  size_t elem = 0;        // bytes per element
  size_t count = 0;       // elements
  size_t data_start = 0;  // offset of the data in the file
};

// Magic, version and header length from the file's first bytes (`head`, up to 12 of them);
// checks the header fits in `file_size` bytes. Returns {header start, header length}.
std::pair<size_t, size_t> read_preamble(std::string_view head, uint64_t file_size, const std::string& name) {
  if (head.size() < 10 || head.substr(0, 6) != std::string_view("\x93NUMPY", 6)) {
    fail(name, "not a .npy file (bad magic; expected \\x93NUMPY)");
  }
  const auto byte = [&](size_t i) { return static_cast<size_t>(static_cast<unsigned char>(head[i])); };
  const size_t major = byte(6);
  size_t start = 10, len = byte(8) | byte(9) << 8;
  if (major == 2 || major == 3) {
    if (head.size() < 12) fail(name, "truncated header");
    start = 12;
    len |= byte(10) << 16 | byte(11) << 24;
  } else if (major != 1) {
    fail(name, "unsupported .npy version " + std::to_string(major) + "; allowed: 1, 2, 3");
  }
  if (len > kMaxHeaderLen) {
    fail(name, "header length " + std::to_string(len) + " is too large; allowed: at most " +
                   std::to_string(kMaxHeaderLen) + " bytes");
  }
  if (file_size < start + len) fail(name, "truncated header");
  return {start, len};
}

// What a reader accepts: float data; a mask (bool or uint8); a K/V cache (float data, or a
// quantized cache's raw rows as uint8).
enum class NpyKind { Float, Mask, Cache };

NpyHeader parse_header(const std::string& header, size_t data_start, const std::string& name,
                       NpyKind kind = NpyKind::Float) {
  NpyHeader h;
  h.data_start = data_start;
  std::string descr = dict_value(header, "descr", name);
  if (descr.size() >= 2 && (descr.front() == '\'' || descr.front() == '"')) descr = descr.substr(1, descr.size() - 2);
  // The byte order must be written out: '=' (native) or none would make the file's meaning
  // depend on the machine that wrote it.
  if (kind == NpyKind::Mask) {  // a mask file (read_npy_mask): bool or uint8 only
    if (descr != "|b1" && descr != "|u1") {
      fail(name, "dtype '" + descr + "' is not a mask; allowed: bool ('|b1') or uint8 ('|u1'), nonzero = attend");
    }
    h.dtype = descr;
    h.elem = 1;
  } else if (kind == NpyKind::Cache && descr == "|u1") {  // a quantized cache's rows (read_npy_cache)
    h.dtype = descr;
    h.elem = 1;
  } else if (descr == "<f4" || descr == "<f8" || descr == "<f2" || descr == "<u2") {
    h.dtype = descr;
    h.elem = descr == "<f4" ? 4 : descr == "<f8" ? 8 : 2;
  } else {
    fail(name, "dtype '" + descr +
                   "' is not supported; allowed: float32 ('<f4'), float64 ('<f8'), "
                   "float16 ('<f2') or raw bfloat16 bits ('<u2'), little-endian with the byte order "
                   "written out (np.save(f, a.astype('<f4')))" +
                   (kind == NpyKind::Cache ? std::string(", or a quantized cache's rows as uint8 ('|u1')") : ""));
  }
  const std::string fortran = dict_value(header, "fortran_order", name);
  if (fortran == "True") fail(name, "Fortran order is not supported; allowed: C order (np.ascontiguousarray)");
  if (fortran != "False") fail(name, "fortran_order '" + fortran + "' is not True or False");

  std::string shape = dict_value(header, "shape", name);
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')') fail(name, "malformed shape " + shape);
  const std::string text = shape;
  shape = shape.substr(1, shape.size() - 2);
  std::stringstream ss(shape);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    tok = trim(tok);
    if (tok.empty()) continue;
    if (tok.size() > 18 || tok.find_first_not_of("0123456789") != std::string::npos) {
      fail(name, "malformed shape entry '" + tok + "'; allowed: integers >= 0");
    }
    h.shape.push_back(std::stoll(tok));
  }
  // An empty array has 0 elements whatever its other dimensions are.
  int64_t count = std::count(h.shape.begin(), h.shape.end(), 0) > 0 ? 0 : 1;
  bool fits = true;
  for (int64_t n : h.shape) {
    const auto next = checked_product({count, n}, kMaxTensorElems);
    fits = fits && next.has_value();
    if (fits) count = *next;
  }
  if (!fits) {
    fail(name, "shape " + text + " has more than " + pow2_text(kMaxTensorElems) + " elements; allowed: at most " +
                   pow2_text(kMaxTensorElems) + " elements");
  }
  h.count = static_cast<size_t>(count);
  return h;
}

// The data must be exactly what the header describes: a shorter file is truncated, a longer
// one holds bytes nobody asked for (a concatenated or corrupt file).
void check_data_size(const NpyHeader& h, uint64_t file_size, const std::string& name) {
  const uint64_t need = h.count * h.elem, have = file_size - h.data_start;
  if (have < need) {
    fail(name, "truncated data: shape needs " + std::to_string(need) + " bytes of " + h.dtype +
                   " after the header, file has " + std::to_string(have));
  }
  if (have > need) {
    fail(name, std::to_string(have - need) + " trailing bytes after the data (shape needs " + std::to_string(need) +
                   " bytes of " + h.dtype + "); allowed: exactly the shape's data");
  }
}

// The array without its data, once the memory budget allows the data.
NpyArray empty_array(const NpyHeader& h, const std::string& name) {
  const size_t kept = h.elem <= 2 ? h.elem : sizeof(float);  // 8- and 16-bit data stay as they are
  const std::string why =
      over_memory_budget(static_cast<int64_t>(h.count * kept), h.elem == 2 ? "the array" : "the array as float32");
  if (!why.empty()) fail(name, why);
  NpyArray arr;
  arr.shape = h.shape;
  arr.source_dtype = h.dtype;
  return arr;
}

// Mapped inputs. '<f4' data at a 64-byte aligned offset (numpy pads its headers to 64) is
// used in place, from the page cache: no copy and no fresh pages to fault in, which were
// most of the cost of loading a file. Private and writable: a write copies the page, the
// file never changes. A mapped file truncated by another process while in use raises
// SIGBUS on the vanished pages; on_sigbus turns that into the bad-input exit (2) naming
// the file instead of a crash.
namespace mapped {
constexpr int kSlots = 32;                     // mappings alive at once; more are read instead
constexpr size_t kMinBytes = size_t{1} << 20;  // smaller data is read: a mapping buys nothing
std::atomic<uintptr_t> lo[kSlots], hi[kSlots];
char names[kSlots][256];
struct sigaction previous;

void write_err(const char* text) {
  for (size_t n = std::strlen(text); n > 0;) {
    const ssize_t w = ::write(2, text, n);
    if (w <= 0) return;
    text += w, n -= static_cast<size_t>(w);
  }
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const auto at = reinterpret_cast<uintptr_t>(info->si_addr);
  for (int i = 0; i < kSlots; ++i) {
    if (at >= lo[i].load() && at < hi[i].load()) {
      write_err("error: ");
      write_err(names[i]);
      write_err(
          ": the file shrank while it was in use (truncated by another process); allowed: "
          "input files that stay unchanged while attnlab runs\n");
      ::_exit(2);
    }
  }
  // Not a mapped input: whatever would have happened without this handler.
  if (previous.sa_flags & SA_SIGINFO) {
    previous.sa_sigaction(sig, info, context);
  } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(sig);
  } else {
    ::sigaction(SIGBUS, &previous, nullptr);  // the faulting access repeats and ends the process
  }
}

// A free slot for [begin, end) of `name`, or -1.
int claim(uintptr_t begin, uintptr_t end, const std::string& name) {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &previous);
  });
  static std::mutex m;
  const std::lock_guard lock(m);
  for (int i = 0; i < kSlots; ++i) {
    if (hi[i].load() != 0) continue;
    const size_t n = std::min(name.size(), sizeof names[i] - 1);
    std::memcpy(names[i], name.data(), n);
    names[i][n] = '\0';
    lo[i].store(begin);
    hi[i].store(end);
    return i;
  }
  return -1;
}

// The data of a checked '<f4' file, mapped; an empty buffer when it is not worth mapping or
// the mapping fails (the caller reads the file instead).
FloatBuffer map_data(int fd, uint64_t file_size, const NpyHeader& h, const std::string& name) {
  if (h.elem != 4 || h.data_start % 64 != 0 || h.count * 4 < kMinBytes) return {};
  const auto len = static_cast<size_t>(file_size);
  void* base = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  if (base == MAP_FAILED) return {};
  const auto begin = reinterpret_cast<uintptr_t>(base);
  const int slot = claim(begin, begin + len, name);
  if (slot < 0) {
    ::munmap(base, len);
    return {};
  }
  // Page tables now, read-only (MAP_POPULATE would copy every page of a writable private
  // mapping); advice only, on kernels without it the pages fault in on first use.
  ::madvise(base, len, MADV_POPULATE_READ);
  return FloatBuffer(reinterpret_cast<float*>(static_cast<char*>(base) + h.data_start), h.count, [=] {
    hi[slot].store(0);
    lo[slot].store(0);
    ::munmap(base, len);
  });
}
}  // namespace mapped

void f8_to_f4(const char* src, size_t count, float* dst) {
  for (size_t i = 0; i < count; ++i) {
    double d;
    std::memcpy(&d, src + i * 8, 8);
    dst[i] = static_cast<float>(d);
  }
}

// Closes on every path.
struct Fd {
  int fd;
  ~Fd() { ::close(fd); }
};

// Reads exactly `bytes` at `offset` (a file that shrank meanwhile is truncated).
void pread_all(int fd, char* dst, size_t bytes, uint64_t offset, const std::string& name) {
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, dst, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(name, std::string("read failed: ") + std::strerror(errno));
    if (n == 0) fail(name, "truncated data: the file shrank while it was read");
    dst += n, bytes -= static_cast<size_t>(n), offset += static_cast<uint64_t>(n);
  }
}

// The header bytes of an array of `shape`, padded so the data starts on a 64-byte boundary.
std::string npy_header(const std::vector<int64_t>& shape, size_t* count, const char* descr = "<f4") {
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (";
  int64_t n = std::count(shape.begin(), shape.end(), 0) > 0 ? 0 : 1;  // as the reader: empty is empty
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += (i ? ", " : "") + std::to_string(shape[i]);
    const auto next = checked_product({n, shape[i]}, kMaxTensorElems);
    if (!next) throw InvalidInput("write_npy: shape entry " + std::to_string(shape[i]) + " is negative or too large");
    n = *next;
  }
  *count = static_cast<size_t>(n);
  if (shape.size() == 1) dict += ",";
  dict += "), }";
  const size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>((dict.size() >> 8) & 0xff);
  return out + dict;
}
}  // namespace

NpyArray parse_npy(const std::string& bytes, const std::string& name) {
  const auto [start, len] = read_preamble(std::string_view(bytes).substr(0, 12), bytes.size(), name);
  const NpyHeader h = parse_header(bytes.substr(start, len), start + len, name);
  check_data_size(h, bytes.size(), name);
  NpyArray arr = empty_array(h, name);
  const char* src = bytes.data() + h.data_start;
  if (h.elem == 2) {
    arr.bits16.resize(h.count);
    if (h.count > 0) std::memcpy(arr.bits16.data(), src, h.count * 2);  // (data() of an empty vector may be null)
    return arr;
  }
  arr.data = FloatBuffer(h.count);
  if (h.elem == 4) {
    std::memcpy(arr.data.data(), src, h.count * 4);
  } else {
    f8_to_f4(src, h.count, arr.data.data());
  }
  return arr;
}

namespace {
// kind: what the file may hold (bool and uint8 kept in bytes8).
NpyArray read_npy_file(const std::string& path, NpyKind kind) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
  const Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (f.fd < 0) fail(path, std::string("cannot open for reading: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) fail(path, std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) {
    fail(path, std::string("is not a regular file (") +
                   (S_ISDIR(st.st_mode)    ? "a directory"
                    : S_ISFIFO(st.st_mode) ? "a pipe"
                    : S_ISCHR(st.st_mode)  ? "a character device"
                                           : "a special file") +
                   "); allowed: a regular .npy file");
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  std::string head(std::min<uint64_t>(size, 12), '\0');
  pread_all(f.fd, head.data(), head.size(), 0, path);
  const auto [start, len] = read_preamble(head, size, path);
  std::string header(len, '\0');
  pread_all(f.fd, header.data(), len, start, path);
  const NpyHeader h = parse_header(header, start + len, path, kind);
  check_data_size(h, size, path);
  NpyArray arr = empty_array(h, path);
  if (h.elem == 1) {
    arr.bytes8.resize(h.count);
    if (h.count > 0) pread_all(f.fd, reinterpret_cast<char*>(arr.bytes8.data()), h.count, h.data_start, path);
    return arr;
  }
  if (h.elem == 2) {
    arr.bits16.resize(h.count);
    pread_all(f.fd, reinterpret_cast<char*>(arr.bits16.data()), h.count * 2, h.data_start, path);
    return arr;
  }
  arr.data = mapped::map_data(f.fd, size, h, path);
  if (!arr.data.empty()) return arr;
  arr.data = FloatBuffer(h.count);
  if (h.elem == 4) {  // straight into the final buffer
    pread_all(f.fd, reinterpret_cast<char*>(arr.data.data()), h.count * 4, h.data_start, path);
    return arr;
  }
  constexpr size_t kChunk = size_t{1} << 17;  // doubles per read
  std::vector<char> buf(std::min(h.count, kChunk) * 8);
  for (size_t done = 0; done < h.count;) {
    const size_t n = std::min(kChunk, h.count - done);
    pread_all(f.fd, buf.data(), n * 8, h.data_start + done * 8, path);
    f8_to_f4(buf.data(), n, arr.data.data() + done);
    done += n;
  }
  return arr;
}

}  // namespace

NpyArray read_npy_mask(const std::string& path) { return read_npy_file(path, NpyKind::Mask); }

NpyArray read_npy(const std::string& path) { return read_npy_file(path, NpyKind::Float); }

NpyArray read_npy_cache(const std::string& path) { return read_npy_file(path, NpyKind::Cache); }

void widen_to_float(NpyArray& a) {
  if (!a.is16()) return;
  a.data = FloatBuffer(a.bits16.size());
  const bool half = a.source_dtype == "<f2";
  for (size_t i = 0; i < a.bits16.size(); ++i) {
    a.data[i] = half ? to_float(f16{a.bits16[i]}) : to_float(bf16{a.bits16[i]});
  }
  a.bits16 = {};
}

std::string encode_npy(const float* data, const std::vector<int64_t>& shape) {
  size_t count = 0;
  std::string out = npy_header(shape, &count);
  out.append(reinterpret_cast<const char*>(data), count * sizeof(float));
  return out;
}

void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  size_t count = 0;
  const std::string header = npy_header(shape, &count);
  write_file_atomic(path, {header, std::string_view(reinterpret_cast<const char*>(data), count * sizeof(float))});
}

void write_npy16(const std::string& path, const uint16_t* bits, const std::vector<int64_t>& shape, DType dtype) {
  if (dtype == DType::F32) throw InvalidInput("write_npy16: dtype f32; allowed: bf16 or f16");
  size_t count = 0;
  const std::string header = npy_header(shape, &count, dtype == DType::F16 ? "<f2" : "<u2");
  write_file_atomic(path, {header, std::string_view(reinterpret_cast<const char*>(bits), count * 2)});
}

}  // namespace attnlab
