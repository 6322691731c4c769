// data/mapped_tokens.h: shards seen as one stream, read across their boundaries; the bound scan
// finds the lowest offender in parallel; headers that record different bounds are refused.
#include "data/mapped_tokens.h"

#include <cctype>
#include <cstring>
#include <fstream>

#include "data/data.h"
#include "data/token_file.h"
#include "data/token_formats.h"
#include "tests/support/files.h"

using namespace stp;
using stp::testing::expect_error;
using stp::testing::ScratchDir;

namespace {

std::vector<std::uint16_t> pattern16(std::size_t n, std::uint32_t seed) {
  std::vector<std::uint16_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint16_t>((i * 2654435761u + seed) % 50000);
  return v;
}

}  // namespace

TEST(MappedTokens, ShardsReadAsOneStreamAcrossBoundaries) {
  ScratchDir dir;
  const std::vector<std::uint16_t> all = pattern16(1000, 5);
  // Shards of 300, 0, 450 and 250 tokens: the empty one must not hide its neighbours.
  const std::vector<std::size_t> sizes = {300, 0, 450, 250};
  std::vector<std::string> files;
  std::size_t at = 0;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    files.push_back(dir.file("s" + std::to_string(k)));
    stp::testing::write_bytes(files.back(), stp::testing::as_bytes(std::vector<std::uint16_t>(
                                                all.begin() + long(at), all.begin() + long(at + sizes[k]))));
    at += sizes[k];
  }
  MappedTokens m(files, token_format("u16"), "test:");
  ASSERT_EQ(m.count(), all.size());
  ASSERT_EQ(m.shards(), 4u);
  EXPECT_EQ(m.shard_begin(2), 300u);
  EXPECT_EQ(m.shard_count(1), 0u);
  EXPECT_EQ(m.shard_of(299), 0u);
  EXPECT_EQ(m.shard_of(300), 2u);
  EXPECT_EQ(m.shard_of(999), 3u);
  EXPECT_EQ(m.file(3), files[3]);
  EXPECT_EQ(m.bound(), 0u);
  for (std::size_t i = 0; i < all.size(); ++i) ASSERT_EQ(m.at(i), all[i]) << i;
  std::vector<std::uint32_t> out(800);
  for (std::uint64_t i : {0ull, 290ull, 299ull, 300ull, 700ull}) {
    const std::size_t n = std::min<std::size_t>(out.size(), all.size() - i);
    m.read(i, n, out.data());
    for (std::size_t j = 0; j < n; ++j) ASSERT_EQ(out[j], all[i + j]) << i << "+" << j;
  }
  EXPECT_FALSE(m.find_at_least(50000));
  EXPECT_FALSE(m.find_at_least(65536));  // the width bounds it: no pass
}

// More than one part of the parallel scan (4 Mi elements each): the lowest offender wins, whatever
// part finishes first, and it is found in any shard.
TEST(MappedTokens, TheBoundScanFindsTheLowestOffender) {
  ScratchDir dir;
  std::vector<std::uint16_t> big((std::size_t(1) << 22) * 2 + 100, 7);
  big[(std::size_t(1) << 22) + 17] = 900;
  big.back() = 1000;
  stp::testing::write_bytes(dir.file("a"), stp::testing::as_bytes(std::vector<std::uint16_t>(10, 1)));
  stp::testing::write_bytes(dir.file("b"), stp::testing::as_bytes(big));
  MappedTokens m({dir.file("a"), dir.file("b")}, token_format("u16"), "test:");
  EXPECT_EQ(m.find_at_least(800), std::optional<std::uint64_t>(10 + (1u << 22) + 17));
  EXPECT_EQ(m.find_at_least(950), std::optional<std::uint64_t>(m.count() - 1));
  EXPECT_EQ(m.find_at_least(7), std::optional<std::uint64_t>(10));
  EXPECT_EQ(m.find_at_least(1), std::optional<std::uint64_t>(0));
  EXPECT_FALSE(m.find_at_least(1001));
  EXPECT_EQ(m.at(m.count() - 1), 1000u);  // the scan released pages; they read the same
}

TEST(MappedTokens, Tok32ShardsRecordOneVocabulary) {
  ScratchDir dir;
  write_token_file(dir.file("a.bin"), {1, 70000, 3}, 70001);
  write_token_file(dir.file("b.bin"), {4, 5}, 70001);
  write_token_file(dir.file("c.bin"), {6, 7}, 80000);
  MappedTokens same({dir.file("a.bin"), dir.file("b.bin")}, token_format("tok32"), "test:");
  EXPECT_EQ(same.bound(), 70001u);
  EXPECT_EQ(same.count(), 5u);
  EXPECT_EQ(same.at(1), 70000u);
  EXPECT_EQ(same.at(3), 4u);
  expect_error(
      [&] {
        MappedTokens({dir.file("a.bin"), dir.file("c.bin")}, token_format("tok32"), "test:");
      },
      {"c.bin", "records vocab_size 80000", "a.bin", "records 70001", "share one vocabulary"});
}

// A format other than the token formats: what a loss-mask file is (one byte per element after a
// header), read through the same class.
TEST(MappedTokens, AnyHeaderAndWidthMakeAFormat) {
  ScratchDir dir;
  stp::testing::write_bytes(dir.file("m1"), std::string("HDR") + std::string("\x01\x00\x01", 3));
  stp::testing::write_bytes(dir.file("m2"), std::string("HDR") + std::string("\x00\x02", 2));
  ShardFormat bytes{"test", 1, [](std::string_view b, const std::string&) { return ShardHeader{3, b.size() - 3, 0}; }};
  MappedTokens m({dir.file("m1"), dir.file("m2")}, bytes, "test:");
  std::vector<std::uint32_t> out(5);
  m.read(0, 5, out.data());
  EXPECT_EQ(out, (std::vector<std::uint32_t>{1, 0, 1, 0, 2}));
  EXPECT_EQ(m.find_at_least(2), std::optional<std::uint64_t>(4));
}

namespace {

// Resident kB of this process's mappings of `path` (/proc/self/smaps), -1 if it is not mapped.
long resident_kb(const std::string& path) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in = false, seen = false;
  long kb = 0;
  while (std::getline(smaps, line)) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) && line.find('-') < line.find(' ')) {
      in = line.size() >= path.size() && line.compare(line.size() - path.size(), path.size(), path) == 0;
      seen = seen || in;
    } else if (in && line.rfind("Rss:", 0) == 0) {
      kb += std::stol(line.substr(4));
    }
  }
  return seen ? kb : -1;
}

}  // namespace

// The bound scan and the reads give back the pages they map, so a pass over the whole stream, and
// reads all over it, leave almost nothing of it resident (the stream here is 24 MiB).
TEST(MappedTokens, ScansAndReadsLeaveLittleResident) {
  ScratchDir dir;
  const std::vector<std::uint16_t> toks = pattern16(std::size_t(12) << 20, 3);
  stp::testing::write_bytes(dir.file("big.u16"), stp::testing::as_bytes(toks));
  MappedTokens m({dir.file("big.u16")}, token_format("u16"), "test:");
  ASSERT_GE(resident_kb(dir.file("big.u16")), 0) << "the file is mapped";
  EXPECT_FALSE(m.find_at_least(50000));
  EXPECT_LE(resident_kb(dir.file("big.u16")), 4096) << "after the scan";
  std::vector<std::uint32_t> out(129);
  for (std::uint64_t k = 0; k < 2000; ++k) {
    const std::uint64_t i = splitmix64(k) % (m.count() - out.size());
    m.read(i, out.size(), out.data());
    ASSERT_EQ(out[5], toks[i + 5]);
  }
  EXPECT_LE(resident_kb(dir.file("big.u16")), 4096) << "after 2000 reads";
}
