#include "base/error.h"

#include <cstdio>

namespace stp {

std::string format_bytes(std::size_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else std::snprintf(buf, sizeof buf, "%.1f %s (%zu B)", v, units[u], bytes);
  return buf;
}

void throw_internal(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError(str("internal error at ", file, ":", line, ": ", cond, " failed", msg.empty() ? "" : ": ", msg));
}

}  // namespace stp
