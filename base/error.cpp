#include "base/error.h"

#include <cstdio>

namespace stp {

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
