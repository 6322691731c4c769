#include <sys/stat.h>

#include <filesystem>
#include <set>

#include "config/config.h"
#include "data/data.h"
#include "tests/data/pseudo_text.h"
#include "tests/support/files.h"

using namespace stp;
using stp::testing::expect_error;
using stp::testing::pseudo_text;
using stp::testing::ScratchDir;

namespace {

DataOptions opts(const std::string& path, const char* format, const char* sampling, int T, int vocab = 256) {
  return DataOptions{path, format, sampling, T, vocab, 42};
}

std::string llmc_file(std::int32_t magic, std::int32_t version, std::int32_t count,
                      const std::vector<std::uint16_t>& toks) {
  std::vector<std::int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  return stp::testing::as_bytes(header) + stp::testing::as_bytes(toks);
}

}  // namespace

TEST(Data, SequentialReadsTheDocumentedOffsets) {
  ScratchDir dir;
  const std::string bytes = pseudo_text(1000, 1);
  stp::testing::write_bytes(dir.file("d.txt"), bytes);
  const int T = 16, rows = 5;
  TokenDataset ds(opts(dir.file("d.txt"), "text", "sequential", T));
  ASSERT_EQ(ds.num_tokens(), 1000u);
  const std::uint64_t span = 1000 - T;
  std::vector<std::int32_t> in(rows * T), tg(rows * T);
  for (std::uint64_t b0 : {0ull, 7ull, 60ull, 61ull, 12345ull, (1ull << 62) + 3}) {
    ds.fill_batch(b0, rows, in.data(), tg.data());
    for (int r = 0; r < rows; ++r) {
      std::uint64_t b = b0 + r;
      std::uint64_t off = ((b % span) * T) % span;  // (b*T) mod (N-T), without overflow
      EXPECT_EQ(ds.sequence_offset(b), off);
      for (int t = 0; t < T; ++t) {
        ASSERT_EQ(in[r * T + t], static_cast<unsigned char>(bytes[off + t])) << "b=" << b << " t=" << t;
        ASSERT_EQ(tg[r * T + t], static_cast<unsigned char>(bytes[off + t + 1])) << "b=" << b << " t=" << t;
      }
    }
  }
  EXPECT_EQ(ds.sequence_offset(0), 0u);
  EXPECT_EQ(ds.sequence_offset(1), 16u);
  EXPECT_EQ(ds.sequence_offset(61), (61u * 16u) % 984u);
}

TEST(Data, SequenceIndexOrdersStepReplicaMicrobatchRow) {
  const int dp = 2, mbs = 3, micro = 4;
  std::uint64_t expected = 0;
  for (std::int64_t step = 1; step <= 3; ++step)
    for (int rep = 0; rep < dp; ++rep)
      for (int mb = 0; mb < micro; ++mb) {
        EXPECT_EQ(sequence_index(step, rep, mb, dp, micro, mbs), expected);
        expected += mbs;  // rows of this microbatch are expected .. expected + mbs - 1
      }
}

TEST(Data, RandomIsDeterministicInRangeAndMatchesTheFile) {
  ScratchDir dir;
  const std::string bytes = pseudo_text(5000, 2);
  stp::testing::write_bytes(dir.file("d.txt"), bytes);
  const int T = 32;
  TokenDataset a(opts(dir.file("d.txt"), "text", "random", T));
  TokenDataset b(opts(dir.file("d.txt"), "text", "random", T));
  DataOptions other = opts(dir.file("d.txt"), "text", "random", T);
  other.seed = 43;
  TokenDataset c(other);
  std::set<std::uint64_t> distinct;
  int same_as_other_seed = 0;
  for (std::uint64_t i = 0; i < 2000; ++i) {
    std::uint64_t off = a.sequence_offset(i);
    EXPECT_LT(off, 5000u - T);
    EXPECT_EQ(off, b.sequence_offset(i));
    EXPECT_EQ(off, splitmix64(splitmix64(42) ^ i) % (5000 - T));  // the documented hash
    same_as_other_seed += off == c.sequence_offset(i);
    distinct.insert(off);
  }
  EXPECT_GT(distinct.size(), 1500u);  // spread over the file, not a handful of offsets
  EXPECT_LT(same_as_other_seed, 20);
  std::vector<std::int32_t> in(3 * T), tg(3 * T);
  a.fill_batch(100, 3, in.data(), tg.data());
  for (int r = 0; r < 3; ++r) {
    std::uint64_t off = a.sequence_offset(100 + r);
    for (int t = 0; t < T; ++t) {
      EXPECT_EQ(in[r * T + t], static_cast<unsigned char>(bytes[off + t]));
      EXPECT_EQ(tg[r * T + t], static_cast<unsigned char>(bytes[off + t + 1]));
    }
  }
}

TEST(Data, TextFolderConcatenatesRegularFilesByName) {
  ScratchDir dir;
  std::filesystem::create_directories(dir.path() / "corpus" / "sub");
  stp::testing::write_bytes(dir.file("corpus/b"), "world!");
  stp::testing::write_bytes(dir.file("corpus/a"), "hello ");
  stp::testing::write_bytes(dir.file("corpus/sub/c"), "SKIPPED");
  std::filesystem::create_symlink(dir.file("corpus/a"), dir.file("corpus/a.link"));
  TokenDataset ds(opts(dir.file("corpus"), "text", "sequential", 4));
  std::string got;
  for (std::uint64_t i = 0; i < ds.num_tokens(); ++i) got += static_cast<char>(ds.token(i));
  EXPECT_EQ(got, "hello world!");
}

TEST(Data, U16AndLlmcFormats) {
  ScratchDir dir;
  std::vector<std::uint16_t> toks = {5, 50000, 7, 65535, 0, 1, 2, 3};
  stp::testing::write_bytes(dir.file("t.u16"), stp::testing::as_bytes(toks));
  TokenDataset u(opts(dir.file("t.u16"), "u16", "sequential", 3, 65536));
  ASSERT_EQ(u.num_tokens(), toks.size());
  for (std::size_t i = 0; i < toks.size(); ++i) EXPECT_EQ(u.token(i), toks[i]);
  stp::testing::write_bytes(dir.file("t.bin"), llmc_file(20240520, 1, 8, toks));
  TokenDataset l(opts(dir.file("t.bin"), "llmc", "sequential", 3, 65536));
  ASSERT_EQ(l.num_tokens(), toks.size());
  std::vector<std::int32_t> in(3), tg(3);
  l.fill_batch(1, 1, in.data(), tg.data());  // offset (1*3) mod 5 = 3
  EXPECT_EQ(in, (std::vector<std::int32_t>{65535, 0, 1}));
  EXPECT_EQ(tg, (std::vector<std::int32_t>{0, 1, 2}));
}

TEST(Data, BadInputsAreClearErrors) {
  ScratchDir dir;
  std::vector<std::uint16_t> toks = {1, 2, 3, 300, 4, 5};
  expect_error([&] { TokenDataset(opts(dir.file("missing.txt"), "text", "random", 4)); },
               {"missing.txt", "does not exist"});
  stp::testing::write_bytes(dir.file("short.txt"), "abcd");
  expect_error([&] { TokenDataset(opts(dir.file("short.txt"), "text", "random", 4)); },
               {"short.txt", "4 tokens", "seq_len + 1 = 5"});
  EXPECT_NO_THROW(TokenDataset(opts(dir.file("short.txt"), "text", "random", 3)));  // N = T + 1 is enough
  std::filesystem::create_directories(dir.path() / "empty");
  expect_error([&] { TokenDataset(opts(dir.file("empty"), "text", "random", 4)); }, {"empty", "no regular files"});
  expect_error([&] { TokenDataset(opts(dir.file("empty"), "u16", "random", 4)); }, {"folder", "u16"});
  stp::testing::write_bytes(dir.file("odd.u16"), "abc");
  expect_error([&] { TokenDataset(opts(dir.file("odd.u16"), "u16", "random", 1, 65536)); },
               {"odd.u16", "3 bytes", "uint16"});
  stp::testing::write_bytes(dir.file("big.u16"), stp::testing::as_bytes(toks));
  expect_error([&] { TokenDataset(opts(dir.file("big.u16"), "u16", "random", 2, 256)); },
               {"token 300", "position 3", "big.u16", "vocab_size 256"});
  stp::testing::write_bytes(dir.file("magic.bin"), llmc_file(1234, 1, 6, toks));
  expect_error([&] { TokenDataset(opts(dir.file("magic.bin"), "llmc", "random", 2, 1000)); },
               {"magic.bin", "magic 1234", "20240520"});
  stp::testing::write_bytes(dir.file("version.bin"), llmc_file(20240520, 2, 6, toks));
  expect_error([&] { TokenDataset(opts(dir.file("version.bin"), "llmc", "random", 2, 1000)); }, {"version 2"});
  stp::testing::write_bytes(dir.file("count.bin"), llmc_file(20240520, 1, 7, toks));
  expect_error([&] { TokenDataset(opts(dir.file("count.bin"), "llmc", "random", 2, 1000)); },
               {"count.bin", "says 7 tokens", "1038 bytes", "1036 bytes"});
  stp::testing::write_bytes(dir.file("tiny.bin"), "xyz");
  expect_error([&] { TokenDataset(opts(dir.file("tiny.bin"), "llmc", "random", 2, 1000)); },
               {"shorter than the llm.c header"});
}

// data.path is a regular file or a folder: a character device such as /dev/zero never ends and a
// FIFO has no size, so either is refused by name before a byte is read; a link to a file is read.
TEST(Data, DevicesAndFifosAreRefusedBeforeTheyAreRead) {
  ScratchDir dir;
  for (const char* format : {"text", "u16", "llmc", "tok32"})
    expect_error([&] { TokenDataset(opts("/dev/zero", format, "random", 4, 65536)); },
                 {"data.path '/dev/zero' is a character device", "regular file"});
  ASSERT_EQ(::mkfifo(dir.file("pipe").c_str(), 0600), 0);
  expect_error([&] { TokenDataset(opts(dir.file("pipe"), "text", "random", 4)); }, {"pipe", "is a FIFO"});
  stp::testing::write_bytes(dir.file("text.txt"), "abcdefgh");
  std::filesystem::create_symlink(dir.file("text.txt"), dir.file("link.txt"));
  EXPECT_EQ(TokenDataset(opts(dir.file("link.txt"), "text", "random", 4)).num_tokens(), 8u);
}

TEST(Data, DefaultConfigReadsTheFortunes) {
  Config cfg = load_config_from_string("", "default");
  if (!std::filesystem::exists(cfg.data.path)) GTEST_SKIP() << cfg.data.path << " not installed";
  TokenDataset ds(DataOptions::from_config(cfg));
  EXPECT_GT(ds.num_tokens(), 1000000u);
  EXPECT_EQ(ds.options().seed, 1234u);
}
