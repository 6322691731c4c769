// Writing token files as the ids arrive (data/token_writer.h): one file equal to
// write_token_file's, shards of N tokens whose concatenation is the one file, loss masks of the
// documented bytes, stale shards of an earlier run removed, nothing left behind on failure.
#include <cstring>
#include <filesystem>

#include "data/token_file.h"
#include "data/token_writer.h"
#include "tests/support/files.h"

using namespace stp;
using stp::testing::expect_error;
using stp::testing::read_bytes;
using stp::testing::ScratchDir;
using stp::testing::write_bytes;

namespace {

template <class T>
T get(const std::string& bytes, std::size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof v);
  return v;
}

TokenWriter::Options options(const std::string& path, std::int32_t vocab, std::uint64_t shard, bool mask) {
  TokenWriter::Options o;
  o.path = path;
  o.vocab_size = vocab;
  o.shard_tokens = shard;
  o.mask = mask;
  return o;
}

std::vector<std::int32_t> iota_ids(std::size_t n, std::int32_t vocab) {
  std::vector<std::int32_t> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = std::int32_t((i * 7919 + 3) % std::size_t(vocab));
  return ids;
}

}  // namespace

TEST(TokenWriter, ShardsConcatenateToTheSingleFile) {
  ScratchDir dir;
  for (std::int32_t vocab : {50257, 151643}) {
    const std::size_t header = vocab <= 65536 ? 1024 : 32, width = vocab <= 65536 ? 2 : 4;
    const std::vector<std::int32_t> ids = iota_ids(1000, vocab);
    write_token_file(dir.file("one.bin"), ids, vocab);
    const std::string one = read_bytes(dir.file("one.bin"));
    TokenWriter w(options(dir.file("out.bin"), vocab, 300, false));
    for (std::size_t at = 0; at < ids.size(); at += 77)  // appends that straddle shard ends
      w.append(ids.data() + at, nullptr, std::min<std::size_t>(77, ids.size() - at));
    const TokenWriter::Result r = w.finish();
    EXPECT_EQ(r.tokens, ids.size());
    ASSERT_EQ(r.files.size(), 4u);
    std::string payload;
    for (std::size_t k = 0; k < 4; ++k) {
      EXPECT_EQ(r.files[k], dir.file("out_00000" + std::to_string(k) + ".bin"));
      const std::string s = read_bytes(r.files[k]);
      const std::size_t n = k < 3 ? 300 : 100;
      ASSERT_EQ(s.size(), header + width * n) << r.files[k];
      if (vocab <= 65536) EXPECT_EQ(get<std::int32_t>(s, 8), std::int32_t(n));
      else EXPECT_EQ(get<std::uint64_t>(s, 16), n);
      auto without_count = [&](std::string h) {  // the header, its count zeroed
        h.resize(header);
        std::memset(h.data() + (vocab <= 65536 ? 8 : 16), 0, vocab <= 65536 ? 4 : 8);
        return h;
      };
      EXPECT_EQ(without_count(s), without_count(one)) << r.files[k];
      payload += s.substr(header);
    }
    EXPECT_EQ(payload, one.substr(header));
    EXPECT_FALSE(std::filesystem::exists(dir.file("out_000004.bin")));
  }
}

// Mask bytes are written as given, behind the 32-byte header of data/token_writer.h.
TEST(TokenWriter, MasksHaveTheDocumentedBytes) {
  ScratchDir dir;
  const std::vector<std::int32_t> ids = {5, 6, 7, 8, 9};
  const std::vector<std::uint8_t> mask = {0, 0, 1, 1, 0};
  for (std::uint64_t shard : {std::uint64_t(0), std::uint64_t(3)}) {
    TokenWriter w(options(dir.file("m.bin"), 50257, shard, true));
    w.append(ids.data(), mask.data(), ids.size());
    const TokenWriter::Result r = w.finish();
    EXPECT_EQ(r.counted, 2u);
    std::string all;
    for (const std::string& f : r.files) {
      const std::string m = read_bytes(f + ".mask");
      const std::uint64_t n = (read_bytes(f).size() - 1024) / 2;
      ASSERT_EQ(m.size(), 32 + n) << f;
      EXPECT_EQ(m.substr(0, 8), "STPMASK1");
      EXPECT_EQ(get<std::uint32_t>(m, 8), 1u);
      EXPECT_EQ(get<std::uint32_t>(m, 12), 0u);
      EXPECT_EQ(get<std::uint64_t>(m, 16), n);
      EXPECT_EQ(get<std::uint64_t>(m, 24), 0u);
      all += m.substr(32);
    }
    EXPECT_EQ(all, std::string("\0\0\1\1\0", 5)) << "shard_tokens " << shard;
  }
  EXPECT_EQ(TokenWriter::mask_path(dir.file("m_000001.bin")), dir.file("m_000001.bin.mask"));
}

TEST(TokenWriter, StaleShardsOfAnEarlierRunAreRemoved) {
  ScratchDir dir;
  const std::vector<std::int32_t> ids = iota_ids(10, 50257);
  {
    TokenWriter w(options(dir.file("s.bin"), 50257, 2, true));
    w.append(ids.data(), std::vector<std::uint8_t>(10, 1).data(), 10);
    EXPECT_EQ(w.finish().files.size(), 5u);
  }
  write_bytes(dir.file("s_000007.bin"), "not contiguous: kept");
  TokenWriter w(options(dir.file("s.bin"), 50257, 4, true));
  w.append(ids.data(), std::vector<std::uint8_t>(10, 1).data(), 10);
  const TokenWriter::Result r = w.finish();
  EXPECT_EQ(r.files.size(), 3u);
  EXPECT_EQ(r.removed, (std::vector<std::string>{dir.file("s_000003.bin"), dir.file("s_000003.bin.mask"),
                                                 dir.file("s_000004.bin"), dir.file("s_000004.bin.mask")}));
  EXPECT_FALSE(std::filesystem::exists(dir.file("s_000003.bin")));
  EXPECT_TRUE(std::filesystem::exists(dir.file("s_000007.bin")));
  // A file written without a mask loses the mask an earlier run wrote beside it.
  TokenWriter plain(options(dir.file("s_000000.bin"), 50257, 0, false));
  plain.append(ids);
  EXPECT_EQ(plain.finish().removed, (std::vector<std::string>{dir.file("s_000000.bin.mask")}));
  EXPECT_FALSE(std::filesystem::exists(dir.file("s_000000.bin.mask")));
}

// Nothing appears before finish(): an abandoned writer leaves no file, not even a temporary, and
// an earlier file of the name keeps its bytes. No ids still make one (empty) file.
TEST(TokenWriter, OutputsAppearWholeAtFinishOrNotAtAll) {
  ScratchDir dir;
  write_bytes(dir.file("keep.bin"), "earlier");
  {
    TokenWriter w(options(dir.file("keep.bin"), 50257, 2, true));
    w.append(iota_ids(5, 50257).data(), std::vector<std::uint8_t>(5, 0).data(), 5);
  }
  EXPECT_EQ(read_bytes(dir.file("keep.bin")), "earlier");
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++files;
  EXPECT_EQ(files, 1u);
  TokenWriter w(options(dir.file("empty.bin"), 50257, 5, false));
  const TokenWriter::Result r = w.finish();
  ASSERT_EQ(r.files, (std::vector<std::string>{dir.file("empty_000000.bin")}));
  EXPECT_EQ(read_bytes(r.files[0]).size(), 1024u);
  EXPECT_EQ(TokenWriter::shard_path("dir/out", 12), "dir/out_000012");
  EXPECT_EQ(TokenWriter::shard_path("train.tok.bin", 1), "train.tok_000001.bin");
  // A shard name the guard refuses stops the writer before the file is created.
  TokenWriter::Options o = options(dir.file("g.bin"), 50257, 1, false);
  o.check_output = [](const std::string& f) {
    if (f.find("_000001") != std::string::npos) throw Error("refused " + f);
  };
  TokenWriter g(o);
  expect_error([&] { g.append(iota_ids(3, 50257).data(), nullptr, 3); }, {"refused", "g_000001.bin"});
}
