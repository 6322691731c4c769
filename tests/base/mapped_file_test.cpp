// base/mapped_file.h: a regular file's bytes through a read-only map; devices and FIFOs refused by
// kind before they are opened; releasing pages never changes what is read.
#include "base/mapped_file.h"

#include <sys/stat.h>

#include "tests/support/files.h"

using stp::MappedFile;
using stp::testing::expect_error;
using stp::testing::ScratchDir;

TEST(MappedFile, MapsTheBytesAndReleasingPagesKeepsThem) {
  ScratchDir dir;
  std::string bytes(3 * 4096 + 123, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 3);
  stp::testing::write_bytes(dir.file("f.bin"), bytes);
  MappedFile f(dir.file("f.bin"), "test:");
  ASSERT_EQ(f.size(), bytes.size());
  EXPECT_EQ(f.bytes(), bytes);
  f.release(100, 5000);  // the first 2 MiB block: the whole file
  f.release(0, f.size());
  f.advise_random();
  EXPECT_EQ(f.bytes(), bytes);
  MappedFile moved = std::move(f);
  EXPECT_EQ(moved.bytes(), bytes);
  EXPECT_EQ(moved.path(), dir.file("f.bin"));
}

TEST(MappedFile, AnEmptyFileMapsNothing) {
  ScratchDir dir;
  stp::testing::write_bytes(dir.file("empty"), "");
  MappedFile f(dir.file("empty"), "test:");
  EXPECT_EQ(f.size(), 0u);
  EXPECT_TRUE(f.bytes().empty());
  f.release(0, 10);
}

TEST(MappedFile, DevicesFifosFoldersAndMissingPathsAreRefused) {
  ScratchDir dir;
  expect_error([] { MappedFile("/dev/zero", "test: data.path"); },
               {"test: data.path '/dev/zero' is a character device"});
  ASSERT_EQ(::mkfifo(dir.file("pipe").c_str(), 0600), 0);
  expect_error([&] { MappedFile(dir.file("pipe"), "test:"); }, {"pipe", "is a FIFO"});
  expect_error([&] { MappedFile(dir.path().string(), "test:"); }, {"is a folder"});
  expect_error([&] { MappedFile(dir.file("nothing"), "test:"); }, {"nothing", "does not exist"});
}
