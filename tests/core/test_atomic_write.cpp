// Files the lab writes are written whole: a full disk is an I/O error naming the file and the
// reason, the previous file stays, and `attnlab sweep` into an unwritable folder exits with the
// I/O error code (4), not bad input (2).
#include "sweep_fixture.hpp"  // fresh_dir, peak_file

namespace attnlab::bench {
namespace {

TEST(AtomicWrite, FullDiskIsAnIoErrorNamingTheFileAndTheReason) {
  const std::string dir = fresh_dir("io");
  make_dirs(dir);
  const std::string path = dir + "/results.csv";
  write_file_atomic(path, "old\n");
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  // The temp file write_file_atomic writes first, routed to /dev/full: writes fail ENOSPC.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  fs::create_symlink("/dev/full", tmp);
  try {
    write_file_atomic(path, std::string(size_t{1} << 16, 'x'));
    ADD_FAILURE() << "a write to a full disk succeeded";
  } catch (const InvalidInput& e) {
    ADD_FAILURE() << "a full disk reported as bad input: " << e.what();
  } catch (const IoError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::strerror(ENOSPC)), std::string::npos) << msg;
  }
  EXPECT_EQ(read_text_file(path), "old\n") << "the previous file stays whole";
  EXPECT_FALSE(fs::exists(fs::symlink_status(tmp))) << "the temp file is removed";

  // A missing folder, and a file where a folder should be: I/O errors too.
  EXPECT_THROW(write_file_atomic(dir + "/missing/point.json", "{}"), IoError);
  EXPECT_THROW(make_dirs(path + "/points"), IoError);
}

TEST(SweepCli, UnwritableResultsFolderExitsWithTheIoErrorCode) {
  const std::string dir = fresh_dir("cli_io");
  make_dirs(dir);
  write_file_atomic(dir + "/file", "x");
  const std::string out = dir + "/file/run";
  const std::string cmd = std::string(ATTNLAB_EXE) + " sweep --experiment " + ATTNLAB_SOURCE_DIR +
                          "/experiments/quick.json --out " + out + " --peak-json " + peak_file() + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string text;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe)) text.append(buf.data(), n);
  const int status = pclose(pipe);
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), 4) << "4 = I/O error (2 would be bad input): " << text;
  EXPECT_NE(text.find(out), std::string::npos) << text;
  EXPECT_NE(text.find(std::strerror(ENOTDIR)), std::string::npos) << text;
}

}  // namespace
}  // namespace attnlab::bench
