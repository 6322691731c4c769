// base/file_io.h: reads refuse what is not a regular file before reading; writes are atomic (the
// destination is the new file or the old one, never a truncated one) and leave no temporary.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "base/file_io.h"
#include "tests/support/files.h"

namespace fs = std::filesystem;
using stp::testing::expect_error;
using stp::testing::read_bytes;
using stp::testing::ScratchDir;
using stp::testing::write_bytes;

namespace {

// The names in `dir`, to see that no temporary was left.
std::vector<std::string> names(const fs::path& dir) {
  std::vector<std::string> n;
  for (const auto& e : fs::directory_iterator(dir)) n.push_back(e.path().filename().string());
  std::sort(n.begin(), n.end());
  return n;
}

}  // namespace

TEST(FileIo, ReadsRegularFilesAndRefusesStreamsBeforeReading) {
  ScratchDir dir;
  write_bytes(dir.file("a.txt"), std::string("ab\0cd", 5));
  EXPECT_EQ(stp::read_regular_file(dir.file("a.txt"), "test:"), std::string("ab\0cd", 5));
  fs::create_symlink(dir.file("a.txt"), dir.file("link"));
  EXPECT_EQ(stp::read_regular_file(dir.file("link"), "test:"), std::string("ab\0cd", 5));
  expect_error([] { stp::read_regular_file("/dev/zero", "test: data.path"); },
               {"test: data.path '/dev/zero' is a character device, not a regular file"});
  ASSERT_EQ(::mkfifo(dir.file("pipe").c_str(), 0600), 0);
  expect_error([&] { stp::read_regular_file(dir.file("pipe"), "test:"); }, {"pipe' is a FIFO"});
  expect_error([&] { stp::check_regular_file(dir.path().string(), "test:"); }, {"is a folder"});
  expect_error([&] { stp::read_regular_file(dir.file("missing"), "test:"); }, {"missing' does not exist"});
  EXPECT_EQ(stp::file_kind(dir.file("a.txt")), "");
  EXPECT_EQ(stp::file_kind("/dev/null"), "a character device");
}

TEST(FileIo, WriteReplacesTheFileWholeAndKeepsItsModeAndLinks) {
  ScratchDir dir;
  stp::write_file_atomic(dir.file("out.txt"), "first");
  EXPECT_EQ(read_bytes(dir.file("out.txt")), "first");
  ::chmod(dir.file("out.txt").c_str(), 0640);
  stp::write_file_atomic(dir.file("out.txt"), "second, longer");
  EXPECT_EQ(read_bytes(dir.file("out.txt")), "second, longer");
  EXPECT_EQ(fs::status(dir.file("out.txt")).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  fs::create_symlink("out.txt", dir.file("link.txt"));
  stp::write_file_atomic(dir.file("link.txt"), "through the link");
  EXPECT_TRUE(fs::is_symlink(dir.file("link.txt")));
  EXPECT_EQ(read_bytes(dir.file("out.txt")), "through the link");
  EXPECT_EQ(names(dir.path()), (std::vector<std::string>{"link.txt", "out.txt"}));
  stp::write_file_atomic("/dev/null", "into a device");
  expect_error([&] { stp::write_file_atomic(dir.path().string(), "x"); }, {"is a folder"});
  expect_error([&] { stp::write_file_atomic(dir.file("no/such/folder.txt"), "x"); }, {"no/such/folder.txt"});
  expect_error([] { stp::write_file_atomic("/dev/full", "x"); }, {"/dev/full", "No space left"});
}

// A write that fails midway (here: past the file-size limit, as a full disk would) leaves the
// earlier file as it was and no temporary beside it.
TEST(FileIo, AFailedWriteLeavesTheEarlierFile) {
  ScratchDir dir;
  write_bytes(dir.file("out.bin"), "earlier");
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* old_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  bool threw = false;
  try {
    stp::write_file_atomic(dir.file("out.bin"), std::string(1 << 16, 'x'));
  } catch (const stp::Error& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find("out.bin"), std::string::npos) << e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(threw);
  EXPECT_EQ(read_bytes(dir.file("out.bin")), "earlier");
  EXPECT_EQ(names(dir.path()), (std::vector<std::string>{"out.bin"}));
}
