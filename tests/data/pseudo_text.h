// Arbitrary bytes for the data tests: n bytes, a pure function of `seed` (splitmix64 of seed,
// seed + 1, ...), so a test's data set is the same on every run and machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "data/data.h"  // splitmix64

namespace stp::testing {

inline std::string pseudo_text(std::size_t n, unsigned seed) {
  std::string s(n, '\0');
  std::uint64_t z = seed;
  for (auto& c : s) c = static_cast<char>(splitmix64(z++) & 0xFF);
  return s;
}

}  // namespace stp::testing
