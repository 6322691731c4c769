#include "profile/run_metrics.h"

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/json_fields.h"
#include "profile/metrics_lines.h"

namespace stp::profile {

using nlohmann::json;

RunMetrics read_run_metrics(const std::string& path) {
  RunMetrics m;
  m.cut_line = read_metrics_lines(path, [&](json& j) {
    m.last_step = json_int(j, "step");
    m.step_ms.push_back(json_number(j, "step_ms"));
    m.peak_device_bytes.clear();
    const json& peaks = json_field(j, "peak_device_bytes");
    STP_CHECK(peaks.is_array(), "\"peak_device_bytes\" must be an array, not ", peaks.dump());
    for (const json& b : peaks) {
      STP_CHECK(b.is_number(), "\"peak_device_bytes\" must hold numbers, not ", b.dump());
      m.peak_device_bytes.push_back(b.get<double>());
    }
    m.peak_host_pinned_bytes = json_number(j, "peak_host_pinned_bytes");
    ++m.steps;
  });
  STP_CHECK(m.steps > 0, "'", path, "' has no logged step");
  return m;
}

}  // namespace stp::profile
