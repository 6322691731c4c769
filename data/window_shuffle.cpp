#include "data/window_shuffle.h"

#include "base/error.h"
#include "data/data.h"

namespace stp {
namespace {

// Six rounds: three make a Feistel network a pseudorandom permutation of its keys, more keep small
// domains (a few bits a half, where one round's function is nearly a table) from looking ordered.
constexpr int kRounds = 6;

}  // namespace

std::uint64_t shuffle_windows(std::uint64_t tokens, std::uint64_t seq_len) {
  STP_ASSERT(seq_len >= 1 && tokens >= seq_len + 1, "shuffle_windows: ", tokens, " tokens, seq_len ", seq_len);
  return (tokens - 1) / seq_len;
}

std::uint64_t shuffle_permute(std::uint64_t seed, std::uint64_t epoch, std::uint64_t index, std::uint64_t windows) {
  STP_ASSERT(windows >= 1 && index < windows, "shuffle_permute: index ", index, " of ", windows, " windows");
  int h = 0;  // half width: the least with 4^h >= windows
  while (h < 32 && (std::uint64_t(1) << (2 * h)) < windows) ++h;
  if (h == 0) return 0;
  const std::uint64_t mask = (std::uint64_t(1) << h) - 1;
  const std::uint64_t key = splitmix64(splitmix64(seed) ^ epoch);
  std::uint64_t round_key[kRounds];
  for (int r = 0; r < kRounds; ++r) round_key[r] = splitmix64(key + std::uint64_t(r));
  std::uint64_t x = index;
  // Cycle walking: x's cycle under the network holds index < windows, so the walk ends, and the
  // map from index to the first value in range is a bijection of [0, windows).
  do {
    std::uint64_t left = x >> h, right = x & mask;
    for (int r = 0; r < kRounds; ++r) {
      const std::uint64_t next = left ^ (splitmix64(round_key[r] ^ right) & mask);
      left = right;
      right = next;
    }
    x = (left << h) | right;
  } while (x >= windows);
  return x;
}

std::uint64_t shuffle_window(std::uint64_t seed, std::uint64_t b, std::uint64_t windows) {
  return shuffle_permute(seed, b / windows, b % windows, windows);
}

}  // namespace stp
