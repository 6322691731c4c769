// Writes a whole document to `path` or throws stp::Error naming it; a partial file is removed, so
// a failed write never leaves half a report behind.
#pragma once

#include <cstdio>
#include <string>

#include "base/error.h"

namespace stp::tools {

inline void write_file(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "wb");
  STP_CHECK(f, "cannot open '", path, "' for writing");
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) std::remove(path.c_str());
  STP_CHECK(ok, "cannot write '", path, "'");
}

}  // namespace stp::tools
