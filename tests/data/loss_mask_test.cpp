// Loss masks (data/loss_mask.h): fill_batch writes -1 for the targets a mask leaves out, by the
// documented byte rule; counted_targets counts the rest; a bad mask file is an error that names
// the mask, the token file and the place.
#include <filesystem>

#include "data/data.h"
#include "tests/support/files.h"
#include "tests/support/loss_mask_file.h"

using namespace stp;
using stp::testing::expect_error;
using stp::testing::loss_mask_bytes;
using stp::testing::ScratchDir;
using stp::testing::write_bytes;

namespace {

DataOptions opts(const std::string& path, const std::string& mask, const char* sampling, int T) {
  DataOptions o{path, "text", sampling, T, 256, 42};
  o.mask_path = mask;
  return o;
}

std::vector<std::uint8_t> pattern(std::size_t n) {
  std::vector<std::uint8_t> bits(n);
  for (std::size_t j = 0; j < n; ++j) bits[j] = (j * 7 + 3) % 5 < 2 ? 0 : 1;
  return bits;
}

}  // namespace

TEST(LossMask, FillBatchWritesMinusOneWhereTheMaskLeavesATargetOut) {
  ScratchDir dir;
  std::string text(300, '\0');
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>('a' + i % 26);
  write_bytes(dir.file("d.txt"), text);
  const std::vector<std::uint8_t> bits = pattern(text.size());
  write_bytes(dir.file("d.mask"), loss_mask_bytes(bits));
  for (const char* sampling : {"sequential", "random"}) {
    SCOPED_TRACE(sampling);
    const int T = 7, rows = 5;
    TokenDataset plain(opts(dir.file("d.txt"), "", sampling, T));
    TokenDataset masked(opts(dir.file("d.txt"), dir.file("d.mask"), sampling, T));
    std::vector<std::int32_t> in(rows * T), tg(in.size()), in_m(in.size()), tg_m(in.size());
    const std::uint64_t b0 = 11;
    plain.fill_batch(b0, rows, in.data(), tg.data());
    masked.fill_batch(b0, rows, in_m.data(), tg_m.data());
    EXPECT_EQ(in, in_m) << "the mask changes targets only";
    std::uint64_t counted = 0, ignored = 0;
    for (int r = 0; r < rows; ++r) {
      const std::uint64_t o = masked.sequence_offset(b0 + r);
      for (int t = 0; t < T; ++t) {
        const std::size_t i = static_cast<std::size_t>(r * T + t);
        // Target t of the sequence at o is token o + t + 1: it counts iff mask byte o + t + 1 is 1.
        if (bits[o + t + 1]) {
          EXPECT_EQ(tg_m[i], tg[i]);
          ++counted;
        } else {
          EXPECT_EQ(tg_m[i], -1);
          ++ignored;
        }
      }
    }
    EXPECT_GT(ignored, 0u);
    EXPECT_EQ(masked.counted_targets(b0, rows), counted);
    EXPECT_EQ(plain.counted_targets(b0, rows), std::uint64_t{rows} * T);
  }
}

TEST(LossMask, BadMaskFilesAreErrorsNamingBothFilesAndThePlace) {
  ScratchDir dir;
  write_bytes(dir.file("d.txt"), std::string(100, 'x'));
  const std::string tokens = dir.file("d.txt");
  const std::vector<std::uint8_t> ones(100, 1);
  auto load = [&](const std::string& name, const std::string& bytes) {
    write_bytes(dir.file(name), bytes);
    TokenDataset(opts(tokens, dir.file(name), "random", 8));
  };
  EXPECT_NO_THROW(load("good.mask", loss_mask_bytes(ones)));
  std::string magic = loss_mask_bytes(ones);
  magic[3] = 'X';
  expect_error([&] { load("magic.mask", magic); }, {"magic.mask", "d.txt", "not a loss mask", "STPMASK1"});
  expect_error([&] { load("version.mask", loss_mask_bytes(ones, -1, 2)); }, {"version.mask", "version 2"});
  expect_error([&] { load("short.mask", "STPMASK1"); }, {"short.mask", "8 bytes", "header"});
  // N other than the token file's count, naming both files.
  const std::vector<std::uint8_t> fewer(99, 1);
  expect_error([&] { load("count.mask", loss_mask_bytes(fewer)); },
               {"count.mask", "d.txt", "for 99 tokens", "holds 100"});
  // The header's N right but the file truncated (or padded).
  std::string truncated = loss_mask_bytes(ones);
  truncated.pop_back();
  expect_error([&] { load("truncated.mask", truncated); }, {"truncated.mask", "d.txt", "131 bytes", "132"});
  expect_error([&] { load("padded.mask", loss_mask_bytes(ones) + "\x01"); }, {"padded.mask", "133 bytes"});
  std::vector<std::uint8_t> two = ones;
  two[57] = 2;
  expect_error([&] { load("byte.mask", loss_mask_bytes(two)); },
               {"byte.mask", "d.txt", "byte 2 at offset 89", "token 57", "0 or 1"});
  std::string reserved = loss_mask_bytes(ones);
  reserved[24] = 1;
  expect_error([&] { load("reserved.mask", reserved); }, {"reserved.mask", "reserved"});
  expect_error([&] { TokenDataset(opts(tokens, dir.file("missing.mask"), "random", 8)); }, {"missing.mask"});
  // A folder of masks pairs its *.mask files with the token shards: here nine masks, one token file.
  expect_error([&] { TokenDataset(opts(tokens, dir.path().string(), "random", 8)); },
               {"data.mask_path", "loss mask file(s)", "1 shard(s)", "d.txt"});
}

// Shards: a folder (or glob) of masks pairs its *.mask files one to one, in name order, with the
// token shards, and the masks read as one stream indexed like the tokens, across shard boundaries.
// data.path and data.mask_path may name the same folder: the tokens skip *.mask, the masks keep it.
TEST(LossMask, ShardsPairWithTheirMasksInNameOrder) {
  ScratchDir dir;
  const std::size_t sizes[] = {23, 5, 31};  // tokens per shard; windows of T = 6 cross both boundaries
  std::vector<std::uint8_t> all_bits;
  for (std::size_t k = 0; k < 3; ++k) {
    std::vector<std::uint16_t> toks(sizes[k]);
    for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<std::uint16_t>(100 * k + i);
    std::vector<std::uint8_t> bits(sizes[k]);
    for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = (i + k) % 3 == 0 ? 0 : 1;
    const std::string name = "x_00000" + std::to_string(k) + ".bin";
    write_bytes(dir.file(name), stp::testing::as_bytes(toks));
    write_bytes(dir.file(name + ".mask"), loss_mask_bytes(bits));
    all_bits.insert(all_bits.end(), bits.begin(), bits.end());
  }
  const int T = 6, rows = 9;
  for (const std::string& mask : {dir.path().string(), dir.file("x_*.bin.mask")}) {
    SCOPED_TRACE(mask);
    DataOptions o{dir.path().string(), "u16", "sequential", T, 65536, 7};
    o.mask_path = mask;
    TokenDataset ds(o);
    ASSERT_EQ(ds.num_tokens(), all_bits.size());
    std::vector<std::int32_t> in(rows * T), tg(in.size());
    ds.fill_batch(0, rows, in.data(), tg.data());
    std::uint64_t counted = 0;
    for (int r = 0; r < rows; ++r) {
      const std::uint64_t o0 = ds.sequence_offset(r);
      for (int t = 0; t < T; ++t) {
        const std::int32_t want = all_bits[o0 + t + 1] ? static_cast<std::int32_t>(ds.token(o0 + t + 1)) : -1;
        EXPECT_EQ(tg[static_cast<std::size_t>(r * T + t)], want) << "row " << r << " position " << t;
        counted += all_bits[o0 + t + 1];
      }
    }
    EXPECT_EQ(ds.counted_targets(0, rows), counted);
  }
  // Mask k is checked against token shard k, and names both.
  std::vector<std::uint8_t> short_bits(sizes[1] - 1, 1);
  write_bytes(dir.file("x_000001.bin.mask"), loss_mask_bytes(short_bits));
  DataOptions o{dir.path().string(), "u16", "sequential", T, 65536, 7};
  o.mask_path = dir.path().string();
  expect_error([&] { TokenDataset{o}; }, {"x_000001.bin.mask", "x_000001.bin'", "for 4 tokens", "holds 5"});
  // One mask fewer than shards.
  std::filesystem::remove(dir.file("x_000001.bin.mask"));
  expect_error([&] { TokenDataset{o}; }, {"2 loss mask file(s)", "3 shard(s)"});
}
