// data.sampling: shuffle (data/window_shuffle.h): an epoch reads every sequence-aligned window
// exactly once, each epoch in its own order, and the order is a pure function of (seed, b).
#include "data/window_shuffle.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "data/data.h"
#include "tests/data/pseudo_text.h"
#include "tests/support/files.h"

using namespace stp;
using stp::testing::pseudo_text;
using stp::testing::ScratchDir;

namespace {

DataOptions shuffle_options(const std::string& path, int T, std::uint64_t seed) {
  return DataOptions{path, "text", "shuffle", T, 256, seed};
}

// The windows epoch e of a permutation of `windows` visits, in order.
std::vector<std::uint64_t> epoch_order(std::uint64_t seed, std::uint64_t epoch, std::uint64_t windows) {
  std::vector<std::uint64_t> order;
  for (std::uint64_t i = 0; i < windows; ++i) order.push_back(shuffle_permute(seed, epoch, i, windows));
  return order;
}

}  // namespace

TEST(WindowShuffle, WindowsAreTheSequencesThatFit) {
  EXPECT_EQ(shuffle_windows(2, 1), 1u);
  EXPECT_EQ(shuffle_windows(17, 16), 1u);
  EXPECT_EQ(shuffle_windows(32, 16), 1u);  // a second window would need token 32
  EXPECT_EQ(shuffle_windows(33, 16), 2u);
  EXPECT_EQ(shuffle_windows(1000, 7), 142u);  // 142 * 7 = 994 <= 999
}

// Every W (powers of two, their neighbours, primes, one, a large odd one), several seeds and
// epochs: each index maps into [0, W) and no window is hit twice.
TEST(WindowShuffle, EveryEpochIsAPermutationOfTheWindows) {
  for (std::uint64_t windows :
       {1ull, 2ull, 3ull, 4ull, 5ull, 7ull, 15ull, 16ull, 17ull, 63ull, 100ull, 1000ull, 4095ull, 4097ull, 12345ull}) {
    for (std::uint64_t seed : {0ull, 1ull, 1234ull, ~0ull}) {
      for (std::uint64_t epoch : {0ull, 1ull, 7ull, 1ull << 40}) {
        std::vector<char> seen(windows, 0);
        for (std::uint64_t w : epoch_order(seed, epoch, windows)) {
          ASSERT_LT(w, windows) << "W " << windows << " seed " << seed << " epoch " << epoch;
          ASSERT_FALSE(seen[w]) << "window " << w << " twice, W " << windows << " seed " << seed << " epoch " << epoch;
          seen[w] = 1;
        }
      }
    }
  }
}

TEST(WindowShuffle, EpochsAndSeedsGiveDifferentOrders) {
  const std::uint64_t windows = 1000;
  const auto first = epoch_order(7, 0, windows);
  std::set<std::vector<std::uint64_t>> orders{first};
  for (std::uint64_t epoch = 1; epoch < 6; ++epoch) orders.insert(epoch_order(7, epoch, windows));
  orders.insert(epoch_order(8, 0, windows));
  EXPECT_EQ(orders.size(), 7u);  // five more epochs and another seed: all different
  // Shuffled, not shifted: few windows keep their place, and the order is not the identity's.
  int fixed = 0;
  for (std::uint64_t i = 0; i < windows; ++i) fixed += first[i] == i;
  EXPECT_LT(fixed, 10);
  // A pure function: computed again, the same order.
  EXPECT_EQ(epoch_order(7, 0, windows), first);
  EXPECT_EQ(shuffle_window(7, 3 * windows + 5, windows), shuffle_permute(7, 3, 5, windows));
}

// Through TokenDataset: for several N, T and seeds (W rarely a power of two), epoch after epoch
// reads every window w (offset w * T, T + 1 tokens inside the data) exactly once, and fill_batch
// reads the tokens of those offsets.
TEST(WindowShuffle, DatasetEpochReadsEveryWindowOnce) {
  ScratchDir dir;
  for (std::size_t n : {2ul, 17ul, 100ul, 1001ul, 5000ul}) {
    const std::string bytes = pseudo_text(n, unsigned(n));
    const std::string path = dir.file("d" + std::to_string(n) + ".txt");
    stp::testing::write_bytes(path, bytes);
    for (int T : {1, 7, 16}) {
      if (n < std::size_t(T) + 1) continue;
      for (std::uint64_t seed : {1ull, 42ull, 1234ull}) {
        TokenDataset ds(shuffle_options(path, T, seed));
        const std::uint64_t W = ds.windows();
        ASSERT_EQ(W, (n - 1) / std::uint64_t(T));
        for (std::uint64_t epoch = 0; epoch < 3; ++epoch) {
          std::vector<int> count(W, 0);
          for (std::uint64_t b = epoch * W; b < (epoch + 1) * W; ++b) {
            const std::uint64_t off = ds.sequence_offset(b);
            ASSERT_EQ(off % std::uint64_t(T), 0u);
            ASSERT_LE(off + std::uint64_t(T), n - 1) << "sequence " << b << " reads past the data";
            ++count[off / std::uint64_t(T)];
          }
          for (std::uint64_t w = 0; w < W; ++w)
            ASSERT_EQ(count[w], 1) << "window " << w << " of " << W << ", N " << n << " T " << T << " seed " << seed
                                   << " epoch " << epoch;
        }
        const int rows = 3;
        std::vector<std::int32_t> in(rows * T), tg(rows * T);
        ds.fill_batch(W + 1, rows, in.data(), tg.data());
        for (int r = 0; r < rows; ++r) {
          const std::uint64_t off = ds.sequence_offset(W + 1 + std::uint64_t(r));
          for (int t = 0; t < T; ++t) {
            ASSERT_EQ(in[r * T + t], static_cast<unsigned char>(bytes[off + t]));
            ASSERT_EQ(tg[r * T + t], static_cast<unsigned char>(bytes[off + t + 1]));
          }
        }
      }
    }
  }
}

// The same seed gives the same stream in another dataset object (what a resumed run builds).
TEST(WindowShuffle, DatasetOrderIsAPureFunctionOfSeedAndSequence) {
  ScratchDir dir;
  stp::testing::write_bytes(dir.file("d.txt"), pseudo_text(3000, 9));
  TokenDataset a(shuffle_options(dir.file("d.txt"), 16, 5));
  TokenDataset b(shuffle_options(dir.file("d.txt"), 16, 5));
  TokenDataset c(shuffle_options(dir.file("d.txt"), 16, 6));
  int same_as_other_seed = 0;
  for (std::uint64_t i = 0; i < 3 * a.windows(); ++i) {
    EXPECT_EQ(a.sequence_offset(i), b.sequence_offset(i));
    EXPECT_EQ(a.sequence_offset(i), shuffle_window(5, i, a.windows()) * 16);  // the documented formula
    same_as_other_seed += a.sequence_offset(i) == c.sequence_offset(i);
  }
  EXPECT_LT(same_as_other_seed, 20);
}
