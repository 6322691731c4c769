// Token files written by `stp tokenize` (data/token_file.h): llmc up to 65536 ids, tok32 beyond,
// both read back by TokenDataset; tok32's reader rejects truncated and hostile files.
#include <cstring>

#include "data/data.h"
#include "data/token_file.h"
#include "tests/support/files.h"

using namespace stp;
using stp::testing::expect_error;
using stp::testing::read_bytes;
using stp::testing::ScratchDir;
using stp::testing::write_bytes;

namespace {

DataOptions opts(const std::string& path, const char* format, int vocab) {
  return DataOptions{path, format, "sequential", 4, vocab, 0};
}

template <class T>
void poke(std::string& bytes, std::size_t offset, T v) {
  std::memcpy(bytes.data() + offset, &v, sizeof v);
}

}  // namespace

TEST(TokenFile, SmallVocabulariesWriteLlmcAndLargeOnesTok32) {
  ScratchDir dir;
  const std::vector<std::int32_t> ids = {0, 1, 65535, 7, 3, 2, 9, 8};
  EXPECT_EQ(write_token_file(dir.file("a.bin"), ids, 65536), "llmc");
  EXPECT_EQ(read_bytes(dir.file("a.bin")).size(), 1024 + 2 * ids.size());
  TokenDataset a(opts(dir.file("a.bin"), "llmc", 65536));
  const std::vector<std::int32_t> wide = {0, 151642, 65536, 70000, 1, 151000, 5, 6};
  EXPECT_EQ(write_token_file(dir.file("b.bin"), wide, 151643), "tok32");
  EXPECT_EQ(read_bytes(dir.file("b.bin")).size(), 32 + 4 * wide.size());
  TokenDataset b(opts(dir.file("b.bin"), "tok32", 151643));
  ASSERT_EQ(a.num_tokens(), ids.size());
  ASSERT_EQ(b.num_tokens(), wide.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(a.token(i), std::uint32_t(ids[i]));
    EXPECT_EQ(b.token(i), std::uint32_t(wide[i]));
  }
  std::vector<std::int32_t> in(4), tg(4);
  b.fill_batch(0, 1, in.data(), tg.data());
  EXPECT_EQ(in, (std::vector<std::int32_t>{0, 151642, 65536, 70000}));
  EXPECT_EQ(tg, (std::vector<std::int32_t>{151642, 65536, 70000, 1}));
  expect_error([&] { TokenDataset(opts(dir.file("b.bin"), "tok32", 100000)); }, {"151642", ">= model.vocab_size"});
}

TEST(TokenFile, Tok32RejectsTruncatedAndHostileFiles) {
  ScratchDir dir;
  const std::vector<std::int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 70000};
  write_token_file(dir.file("good.bin"), ids, 70001);
  const std::string good = read_bytes(dir.file("good.bin"));
  auto expect_bad = [&](const std::string& bytes, std::initializer_list<std::string> needles) {
    write_bytes(dir.file("bad.bin"), bytes);
    expect_error([&] { TokenDataset(opts(dir.file("bad.bin"), "tok32", 1 << 20)); }, needles);
  };
  expect_bad(good.substr(0, 20), {"shorter than the tok32 header"});
  expect_bad(good.substr(0, good.size() - 2), {"header says 8 tokens"});
  expect_bad(good + "xxxx", {"header says 8 tokens"});
  std::string b = good;
  b[0] = 'X';
  expect_bad(b, {"not a tok32 token file"});
  b = good;
  poke<std::uint32_t>(b, 8, 2);
  expect_bad(b, {"tok32 version 2"});
  b = good;
  poke<std::uint64_t>(b, 16, ~std::uint64_t(0) / 2);  // a count whose byte size would wrap
  expect_bad(b, {"header says"});
  b = good;
  poke<std::uint64_t>(b, 24, 1);
  expect_bad(b, {"reserved"});
  b = good;
  poke<std::uint32_t>(b, 12, 70000);  // the last id is 70000
  expect_bad(b, {"token 70000 at position 7", "vocab_size 70000"});
}
