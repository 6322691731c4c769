#include "data/byte_unicode.h"

#include <array>

#include "data/utf8.h"

namespace stp::byte_unicode {
namespace {

bool printable(int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

struct Tables {
  std::array<char32_t, 256> to_char{};
  std::array<int, 0x144> to_byte{};  // code point -> byte, -1 for none
  Tables() {
    to_byte.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      to_char[std::size_t(b)] = printable(b) ? char32_t(b) : next++;
      to_byte[to_char[std::size_t(b)]] = b;
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t to_char(unsigned char byte) { return tables().to_char[byte]; }

std::optional<std::string> to_bytes(std::string_view mapped) {
  const Tables& t = tables();
  std::string out;
  out.reserve(mapped.size());
  std::size_t i = 0;
  while (i < mapped.size()) {
    std::size_t n = utf8::sequence_length(mapped, i);
    if (n == 0 || n > 2) return std::nullopt;  // every mapped character is below U+0800
    char32_t cp = n == 1 ? char32_t(static_cast<unsigned char>(mapped[i]))
                         : char32_t(((static_cast<unsigned char>(mapped[i]) & 0x1F) << 6) |
                                    (static_cast<unsigned char>(mapped[i + 1]) & 0x3F));
    if (cp >= t.to_byte.size() || t.to_byte[cp] < 0) return std::nullopt;
    out += static_cast<char>(t.to_byte[cp]);
    i += n;
  }
  return out;
}

std::string from_bytes(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) utf8::append(out, to_char(b));
  return out;
}

}  // namespace stp::byte_unicode
