#include "attnlab/atomic_write.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "attnlab/problem.hpp"

namespace attnlab {

namespace {

[[noreturn]] void io_fail(const std::string& path, const std::string& step, int err) {
  throw IoError(path + ": " + step + " failed: " + std::strerror(err) + " (errno " + std::to_string(err) + ")");
}

// Persists the rename: a file's name lives in its folder, so the folder is synced too.
// Filesystems that cannot sync a folder say EINVAL or ENOTSUP; the file itself is synced.
void sync_parent(const std::string& path) {
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) io_fail(path, "opening its folder " + dir + " to sync it", errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL && err != ENOTSUP) io_fail(path, "syncing its folder " + dir, err);
}

}  // namespace

void write_file_atomic(const std::string& path, std::initializer_list<std::string_view> parts) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) io_fail(path, "creating the temp file " + tmp, errno);
  auto abandon = [&](const std::string& step, int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    io_fail(path, step, err);
  };
  for (std::string_view part : parts) {
    while (!part.empty()) {
      const ssize_t n = ::write(fd, part.data(), part.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        abandon("writing", errno);
      }
      part.remove_prefix(static_cast<size_t>(n));
    }
  }
  if (::fsync(fd) != 0) abandon("syncing", errno);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    io_fail(path, "closing", err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    io_fail(path, "renaming " + tmp + " into place", err);
  }
  sync_parent(path);
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  write_file_atomic(path, {std::string_view(contents)});
}

}  // namespace attnlab
