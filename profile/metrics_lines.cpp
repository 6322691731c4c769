#include "profile/metrics_lines.h"

#include <fstream>

#include "base/error.h"
#include "base/json_fields.h"

namespace stp::profile {

int read_metrics_lines(const std::string& path, const std::function<void(nlohmann::json&)>& each) {
  std::ifstream f(path, std::ios::binary);
  STP_CHECK(f.good(), "cannot open '", path, "' (the run's metrics.jsonl)");
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const bool unterminated = f.eof();  // getline met the end of the file before a newline
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      if (unterminated) return n;  // the writer stopped inside this line
      throw Error(str("'", path, "' line ", n, ", ", json_error_text(e, JsonPosition::Column)));
    }
    try {
      each(j);
    } catch (const Error& e) {
      throw Error(str("'", path, "' line ", n, ": ", e.what()));
    }
  }
  STP_CHECK(!f.bad(), "cannot read '", path, "'");
  return 0;
}

}  // namespace stp::profile
