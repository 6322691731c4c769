#include "base/error.h"

#include <cstdio>

namespace stp {

namespace {

// The length of the UTF-8 sequence starting at s[i] (2 to 4), or 0 when the bytes there are not
// one (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF, or cut short).
std::size_t utf8_length(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  std::size_t n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k)
    if ((b(k) & 0xC0) != 0x80) return 0;
  if ((c == 0xE0 && b(1) < 0xA0) || (c == 0xED && b(1) > 0x9F) || (c == 0xF0 && b(1) < 0x90) ||
      (c == 0xF4 && b(1) > 0x8F))
    return 0;
  return n;
}

// Appends `text` with the escapes of quoted_text(); `quote` is escaped too unless it is 0.
void append_escaped(std::string& out, std::string_view text, char quote) {
  char hex[8];
  for (std::size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if ((quote != 0 && c == static_cast<unsigned char>(quote)) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
      ++i;
    } else if (c == '\n' || c == '\t' || c == '\r') {
      out += c == '\n' ? "\\n" : c == '\t' ? "\\t" : "\\r";
      ++i;
    } else if (c < 0x20 || c == 0x7F) {
      std::snprintf(hex, sizeof hex, "\\u%04x", c);
      out += hex;
      ++i;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
    } else if (std::size_t n = utf8_length(text, i); n == 0) {
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
      ++i;
    } else if (c == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0) {  // U+0080..U+009F: C1 controls
      std::snprintf(hex, sizeof hex, "\\u%04x", static_cast<unsigned char>(text[i + 1]));
      out += hex;
      i += 2;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
}

}  // namespace

std::string quoted_text(std::string_view text, char quote) {
  std::string out(1, quote);
  append_escaped(out, text, quote);
  out += quote;
  return out;
}

std::string escaped_text(std::string_view text) {
  std::string out;
  append_escaped(out, text, 0);
  return out;
}

std::string format_bytes(std::size_t bytes, ByteStyle style, Rounding rounding) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  char buf[64];
  if (style == ByteStyle::Exact || bytes < 1024) {
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
    return buf;
  }
  int u = 1;
  while (u < 4 && bytes >> (10 * (u + 1)) != 0) ++u;
  // Three significant digits: two decimals below 10, one below 100, none above. The value is
  // rounded in integers (bytes * 10^decimals / 1024^u), so a minimum rounded up is never below the
  // bytes; a rounding that reaches the next decade or 1024 takes the coarser form and rounds again.
  int decimals = 2;
  for (;;) {
    const std::uint64_t unit = std::uint64_t{1} << (10 * u), scale = decimals == 2 ? 100 : decimals == 1 ? 10 : 1;
    const std::uint64_t whole = bytes / unit, part = (bytes % unit) * scale;  // part < 2^40 * 100
    std::uint64_t v = whole * scale + part / unit;
    const std::uint64_t rest = part % unit;
    if (rounding == Rounding::Up ? rest > 0 : 2 * rest >= unit) ++v;
    if (decimals > 0 && v >= 1000) {  // 10.00 or 100.0
      --decimals;
      continue;
    }
    if (decimals == 0 && v >= 1024 && u < 4) {
      ++u, decimals = 2;
      continue;
    }
    const auto whole_part = static_cast<unsigned long long>(v / scale),
               fraction = static_cast<unsigned long long>(v % scale);
    if (decimals == 0) std::snprintf(buf, sizeof buf, "%llu %s", whole_part, units[u]);
    else if (decimals == 1) std::snprintf(buf, sizeof buf, "%llu.%01llu %s", whole_part, fraction, units[u]);
    else std::snprintf(buf, sizeof buf, "%llu.%02llu %s", whole_part, fraction, units[u]);
    return buf;
  }
}

void throw_internal(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError(str("internal error at ", file, ":", line, ": ", cond, " failed", msg.empty() ? "" : ": ", msg));
}

}  // namespace stp
