// Loss mask files (data/loss_mask.h) for tests: the bytes of a mask, with header fields a test may
// spoil on purpose.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace stp::testing {

// The file of the mask `bits` (one byte per token, 0 or 1 unless the test wants otherwise): magic
// "STPMASK1", `version`, N = `count` (bits.size() when negative), then the bytes.
inline std::string loss_mask_bytes(const std::vector<std::uint8_t>& bits, std::int64_t count = -1,
                                   std::uint32_t version = 1) {
  std::string out(32, '\0');
  std::memcpy(out.data(), "STPMASK1", 8);
  std::memcpy(out.data() + 8, &version, 4);
  const std::uint64_t n = count < 0 ? bits.size() : static_cast<std::uint64_t>(count);
  std::memcpy(out.data() + 16, &n, 8);
  out.append(reinterpret_cast<const char*>(bits.data()), bits.size());
  return out;
}

}  // namespace stp::testing
