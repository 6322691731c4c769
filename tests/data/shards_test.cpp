// data.path as a file, a folder or a glob of shards in every format (data/data.h, Paths): the
// shards are one token stream in name order, read through maps exactly as the whole file was
// read before, and bad shards are errors naming the file.
#include <sys/stat.h>

#include <cstring>
#include <filesystem>

#include "data/data.h"
#include "data/token_file.h"
#include "tests/support/files.h"

using namespace stp;
using stp::testing::as_bytes;
using stp::testing::expect_error;
using stp::testing::read_bytes;
using stp::testing::ScratchDir;
using stp::testing::write_bytes;

namespace {

DataOptions opts(const std::string& path, const char* format, const char* sampling, int T, int vocab) {
  return DataOptions{path, format, sampling, T, vocab, 42};
}

std::vector<std::uint32_t> tokens_of(std::size_t n, std::uint32_t vocab, std::uint32_t seed) {
  std::vector<std::uint32_t> v(n);
  std::uint64_t z = seed;
  for (auto& t : v) t = static_cast<std::uint32_t>(splitmix64(z++) % vocab);
  return v;
}

// The bytes of `toks` in `format` (tok32 records `vocab`).
std::string file_bytes(const std::vector<std::uint32_t>& toks, const std::string& format, std::uint32_t vocab) {
  std::string out;
  if (format == "text") {
    for (std::uint32_t t : toks) out += static_cast<char>(t);
    return out;
  }
  if (format == "u16" || format == "llmc") {
    if (format == "llmc") {
      std::vector<std::int32_t> header(256, 0);
      header[0] = 20240520;
      header[1] = 1;
      header[2] = static_cast<std::int32_t>(toks.size());
      out = as_bytes(header);
    }
    return out + as_bytes(std::vector<std::uint16_t>(toks.begin(), toks.end()));
  }
  std::vector<std::uint32_t> header = {0x54505453u, 0x32334b4fu, 1, vocab};  // "STPTOK32", version, vocab
  std::vector<std::uint64_t> count = {toks.size(), 0};
  return as_bytes(header) + as_bytes(count) + as_bytes(toks);
}

// The old reader's result: every token of every file, widened, concatenated in order.
std::vector<std::uint32_t> whole_read(const std::vector<std::string>& files, const std::string& format) {
  std::vector<std::uint32_t> all;
  for (const auto& f : files) {
    const std::string b = read_bytes(f);
    const std::size_t header = format == "llmc" ? 1024 : format == "tok32" ? 32 : 0;
    const std::size_t width = format == "text" ? 1 : format == "tok32" ? 4 : 2;
    for (std::size_t at = header; at < b.size(); at += width) {
      std::uint32_t t = 0;
      std::memcpy(&t, b.data() + at, width);
      all.push_back(t);
    }
  }
  return all;
}

// fill_batch of rows b0 .. b0 + rows - 1 against the documented offsets into `expected`.
void expect_batches(const TokenDataset& ds, const std::vector<std::uint32_t>& expected) {
  const int T = ds.options().seq_len, rows = 6;
  ASSERT_EQ(ds.num_tokens(), expected.size());
  std::vector<std::int32_t> in(std::size_t(rows * T)), tg(std::size_t(rows * T));
  for (std::uint64_t b0 : {0ull, 5ull, 77ull, 1000ull, (1ull << 40) + 9}) {
    ds.fill_batch(b0, rows, in.data(), tg.data());
    for (int r = 0; r < rows; ++r) {
      const std::uint64_t off = ds.sequence_offset(b0 + std::uint64_t(r));
      for (int t = 0; t < T; ++t) {
        ASSERT_EQ(in[std::size_t(r * T + t)], std::int32_t(expected[off + std::uint64_t(t)])) << b0 << " " << r;
        ASSERT_EQ(tg[std::size_t(r * T + t)], std::int32_t(expected[off + std::uint64_t(t) + 1])) << b0 << " " << r;
      }
    }
  }
}

}  // namespace

// Every format, one file and the same tokens as three shards by folder and by glob: the mapped
// reads give what reading the whole file gave, row for row, under both samplings.
TEST(Shards, MappedReadsEqualWholeFileReadsInEveryFormat) {
  for (const std::string& format : std::vector<std::string>{"text", "u16", "llmc", "tok32"}) {
    SCOPED_TRACE(format);
    ScratchDir dir;
    const std::uint32_t vocab = format == "text" ? 256 : format == "tok32" ? 100000 : 50257;
    const std::vector<std::uint32_t> toks = tokens_of(3001, vocab, 9);
    write_bytes(dir.file("one.bin"), file_bytes(toks, format, vocab));
    std::filesystem::create_directories(dir.path() / "shards");
    const std::size_t cut1 = 1000, cut2 = 1017;  // a short middle shard: windows cross two boundaries
    write_bytes(dir.file("shards/d_000.bin"), file_bytes({toks.begin(), toks.begin() + cut1}, format, vocab));
    write_bytes(dir.file("shards/d_001.bin"), file_bytes({toks.begin() + cut1, toks.begin() + cut2}, format, vocab));
    write_bytes(dir.file("shards/d_002.bin"), file_bytes({toks.begin() + cut2, toks.end()}, format, vocab));
    EXPECT_EQ(whole_read({dir.file("one.bin")}, format), toks);
    for (const char* sampling : {"sequential", "random"})
      for (const std::string& path : {dir.file("one.bin"), dir.file("shards"), dir.file("shards/d_*.bin")}) {
        SCOPED_TRACE(path + " " + sampling);
        TokenDataset ds(opts(path, format.c_str(), sampling, 64, int(vocab)));
        expect_batches(ds, toks);
        EXPECT_EQ(ds.tokens().shards(), path == dir.file("one.bin") ? 1u : 3u);
      }
  }
}

// Name order is byte order of the names, in a folder and in a glob: "x_10" before "x_2". A
// sequence that starts near the end of one shard reads on into the next.
TEST(Shards, ShardsAreConcatenatedInNameOrderAndWindowsCrossBoundaries) {
  ScratchDir dir;
  std::filesystem::create_directories(dir.path() / "f");
  write_bytes(dir.file("f/x_2.bin"), file_bytes({20, 21, 22}, "llmc", 0));
  write_bytes(dir.file("f/x_10.bin"), file_bytes({10, 11, 12, 13}, "llmc", 0));
  write_bytes(dir.file("f/x_1.bin"), file_bytes({1, 2}, "llmc", 0));
  const std::vector<std::uint32_t> expected = {1, 2, 10, 11, 12, 13, 20, 21, 22};
  for (const std::string& path : {dir.file("f"), dir.file("f/x_*.bin"), dir.file("f/x_?*")}) {
    TokenDataset ds(opts(path, "llmc", "sequential", 3, 50257));
    EXPECT_EQ(ds.tokens().file(0), dir.file("f/x_1.bin"));
    EXPECT_EQ(ds.tokens().file(2), dir.file("f/x_2.bin"));
    EXPECT_EQ(whole_read({ds.tokens().file(0), ds.tokens().file(1), ds.tokens().file(2)}, "llmc"), expected);
    std::vector<std::int32_t> in(3), tg(3);
    ds.fill_batch(1, 1, in.data(), tg.data());  // offset 3: 11 12 13 | 20, the last target in x_2
    EXPECT_EQ(in, (std::vector<std::int32_t>{11, 12, 13}));
    EXPECT_EQ(tg, (std::vector<std::int32_t>{12, 13, 20}));
    ds.fill_batch(0, 1, in.data(), tg.data());  // offset 0: 1 2 | 10, across x_1's end
    EXPECT_EQ(in, (std::vector<std::int32_t>{1, 2, 10}));
    EXPECT_EQ(tg, (std::vector<std::int32_t>{2, 10, 11}));
  }
}

// llm.c's FineWeb layout, as its scripts write it: train and val shards side by side, each set
// read by its own glob; loss masks (*.mask) and subfolders in a folder are not token shards.
TEST(Shards, LlmcTrainAndValGlobsAndMasksBeside) {
  ScratchDir dir;
  write_bytes(dir.file("fineweb_val_000000.bin"), file_bytes({50256, 1, 2, 3}, "llmc", 0));
  write_bytes(dir.file("fineweb_train_000001.bin"), file_bytes({50256, 4, 5}, "llmc", 0));
  write_bytes(dir.file("fineweb_train_000002.bin"), file_bytes({50256, 6, 7}, "llmc", 0));
  write_bytes(dir.file("fineweb_train_000001.bin.mask"), "not tokens");
  std::filesystem::create_directories(dir.path() / "sub");
  TokenDataset train(opts(dir.file("fineweb_train_*.bin"), "llmc", "sequential", 2, 50257));
  TokenDataset val(opts(dir.file("fineweb_val_*.bin"), "llmc", "sequential", 2, 50257));
  EXPECT_EQ(train.num_tokens(), 6u);
  EXPECT_EQ(val.num_tokens(), 4u);
  EXPECT_EQ(train.token(3), 50256u);
  EXPECT_EQ(train.token(5), 7u);
  TokenDataset folder(opts(dir.path().string(), "llmc", "sequential", 2, 50257));  // the .mask is skipped
  EXPECT_EQ(folder.num_tokens(), 10u);
  EXPECT_EQ(folder.tokens().file(2), dir.file("fineweb_val_000000.bin"));
}

TEST(Shards, BadShardsAreErrorsNamingTheFileAndThePlace) {
  ScratchDir dir;
  std::filesystem::create_directories(dir.path() / "set");
  write_bytes(dir.file("set/a.bin"), file_bytes({1, 2, 3, 4}, "llmc", 0));
  std::string cut = file_bytes({5, 6, 7, 8}, "llmc", 0);
  write_bytes(dir.file("set/b.bin"), cut.substr(0, cut.size() - 3));  // truncated in its last token
  expect_error([&] { TokenDataset(opts(dir.file("set"), "llmc", "random", 2, 50257)); },
               {"set/b.bin", "header says 4 tokens", "1032 bytes", "1029 bytes", "truncated"});
  write_bytes(dir.file("set/b.bin"), file_bytes({5, 6}, "tok32", 50257));  // another format
  expect_error([&] { TokenDataset(opts(dir.file("set/*.bin"), "llmc", "random", 2, 50257)); },
               {"set/b.bin", "is a tok32 token file, not llmc"});
  expect_error([&] { TokenDataset(opts(dir.file("set"), "tok32", "random", 2, 50257)); },
               {"set/a.bin", "is an llm.c token file", "not tok32"});
  expect_error([&] { TokenDataset(opts(dir.file("set"), "u16", "random", 2, 50257)); },
               {"set/a.bin", "is an llm.c token file", "data.format llmc"});
  write_bytes(dir.file("set/a.bin"), file_bytes({1, 2, 3, 4}, "tok32", 50257));
  write_bytes(dir.file("set/c.bin"), file_bytes({1, 2, 3, 4}, "tok32", 50304));  // another vocabulary
  expect_error([&] { TokenDataset(opts(dir.file("set"), "tok32", "random", 2, 50304)); },
               {"set/c.bin", "records vocab_size 50304", "set/a.bin", "records 50257"});
  write_bytes(dir.file("set/c.bin"), file_bytes({1, 2, 50300, 400}, "tok32", 50257));  // lies about its ids
  expect_error([&] { TokenDataset(opts(dir.file("set"), "tok32", "random", 2, 50304)); },
               {"set/c.bin", "token 50300 at position 2", "vocab_size 50257 of its tok32 header"});
  write_bytes(dir.file("set/c.bin"), file_bytes({1, 2, 3, 400}, "tok32", 50257));
  expect_error([&] { TokenDataset(opts(dir.file("set"), "tok32", "random", 2, 300)); },
               {"token 400 at position 3 of '", "set/c.bin", "model.vocab_size 300"});
  expect_error([&] { TokenDataset(opts(dir.file("set/*.llmc"), "llmc", "random", 2, 50257)); },
               {"set/*.llmc", "matches no files"});
  std::filesystem::create_directories(dir.path() / "masks" / "sub");
  write_bytes(dir.file("masks/a.bin.mask"), "x");
  expect_error([&] { TokenDataset(opts(dir.file("masks"), "llmc", "random", 2, 50257)); },
               {"masks", "is a folder that holds no regular files to read as data.format llmc"});
  ASSERT_EQ(::mkfifo(dir.file("set/pipe.bin").c_str(), 0600), 0);
  expect_error([&] { TokenDataset(opts(dir.file("set/p*.bin"), "tok32", "random", 2, 50304)); },
               {"pipe.bin", "is a FIFO"});
}
