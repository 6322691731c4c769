#include "profile/run_metrics.h"

#include <fstream>

#include "base/error.h"
#include "base/json.h"

namespace stp::profile {

RunMetrics read_run_metrics(const std::string& path) {
  std::ifstream f(path);
  STP_CHECK(f.good(), "cannot open '", path, "' (the run's metrics.jsonl)");
  RunMetrics m;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      Json j = Json::parse(line);
      m.last_step = j["step"].as_int();
      m.step_ms.push_back(j["step_ms"].as_number());
      m.peak_device_bytes.clear();
      for (const Json& b : j["peak_device_bytes"].as_array()) m.peak_device_bytes.push_back(b.as_number());
      m.peak_host_pinned_bytes = j["peak_host_pinned_bytes"].as_number();
      ++m.steps;
    } catch (const Error& e) {
      throw Error(str("'", path, "' line ", n, ": ", e.what()));
    }
  }
  STP_CHECK(m.steps > 0, "'", path, "' has no logged step");
  return m;
}

}  // namespace stp::profile
