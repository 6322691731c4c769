// Mutations shared by the readers' fuzz tests (tests/*/*_fuzz_test.cpp): byte-level edits of a
// valid file and random text from the fragments a format is made of. Deterministic for a seeded
// std::mt19937, so a failing case repeats.
#pragma once

#include <cstddef>
#include <random>
#include <span>
#include <string>

namespace stp::testing {

// One byte-level edit of s: one to four bytes set to random values, a truncation, or a slice of up
// to 31 bytes spliced in elsewhere. An empty s comes back as it is.
inline std::string mutate_bytes(std::string s, std::mt19937& rng) {
  if (s.empty()) return s;
  switch (rng() % 3) {
    case 0:
      for (int k = 1 + static_cast<int>(rng() % 4); k > 0; --k) s[rng() % s.size()] = static_cast<char>(rng());
      return s;
    case 1: return s.substr(0, rng() % s.size());
    default: {
      const std::size_t from = rng() % s.size(), len = rng() % 32, to = rng() % s.size();
      s.insert(to, s.substr(from, len));
      return s;
    }
  }
}

// One to forty fragments drawn from `fragments` and concatenated: JSON-ish text nested and
// recombined with no regard for validity.
inline std::string random_fragments(std::span<const char* const> fragments, std::mt19937& rng) {
  std::string t;
  for (int n = 1 + static_cast<int>(rng() % 40); n > 0; --n) t += fragments[rng() % fragments.size()];
  return t;
}

}  // namespace stp::testing
