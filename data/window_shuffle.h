// The order of data.sampling: shuffle (docs/design.md, Sampling): every sequence-aligned window
// of the data once per epoch, in a seeded permutation that differs from epoch to epoch.
//
// The N tokens hold W = floor((N - 1) / T) windows (T = seq_len): window w reads the T + 1 tokens
// at offset w · T, so the last one, w = W - 1, ends at token W · T <= N - 1. Sequence b of a run is
// in epoch e = b / W at position i = b mod W, and reads window perm(seed, e, i):
//
//   perm(seed, e, ·) is a bijection of [0, W): a balanced Feistel network over the 2h-bit values
//   (h the least with 4^h >= W; h = 0, the identity, for W = 1), six rounds
//     (L, R) -> (R, L xor (splitmix64(K_r xor R) mod 2^h)),  K_r = splitmix64(K + r),
//     K = splitmix64(splitmix64(seed) xor e),
//   the value i = L · 2^h + R, walked along its cycle until it lands in [0, W) ("cycle walking":
//   4^h < 4W, so fewer than four rounds of the network on average).
//
// A pure function of (seed, W, b) in O(1) memory: resuming needs nothing but b.
#pragma once

#include <cstdint>

namespace stp {

// W for N tokens and seq_len T (N >= T + 1, T >= 1): floor((N - 1) / T) >= 1.
std::uint64_t shuffle_windows(std::uint64_t tokens, std::uint64_t seq_len);

// perm(seed, epoch, index) above: a window in [0, windows), for index in [0, windows).
std::uint64_t shuffle_permute(std::uint64_t seed, std::uint64_t epoch, std::uint64_t index, std::uint64_t windows);

// The window sequence b reads: shuffle_permute(seed, b / windows, b mod windows, windows).
std::uint64_t shuffle_window(std::uint64_t seed, std::uint64_t b, std::uint64_t windows);

}  // namespace stp
