// JSON numbers with a fixed precision for the documents stp writes with nlohmann-json (reports,
// plans, simulator output, metrics, trace counters). nlohmann writes a double as the shortest
// text that reads back to it, so storing the value rounded to `significant` digits writes it
// like printf("%.*g"); integral values are stored as integers, so 12.0 is written 12, not 12.0.
// JSON has no NaN or infinity: those are written as 0.
//
// json_fixed rounds to `decimals` places like printf("%.*f") (trailing zeros are not written).
//
// Example: json_number(2.0 / 3, 6) is written 0.666667; json_number(1e6, 6) is written 1000000;
//          json_fixed(5.4743201, 6) is written 5.47432.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

namespace stp {

namespace detail {
inline nlohmann::ordered_json json_printed(double v, const char* format, int precision) {
  if (!std::isfinite(v)) return 0;
  if (v == std::floor(v) && std::fabs(v) < 9e15) return static_cast<std::int64_t>(v);
  char buf[352];  // "%.*f" of the largest double has 309 digits before the point
  std::snprintf(buf, sizeof buf, format, precision, v);
  double rounded = std::strtod(buf, nullptr);
  if (rounded == std::floor(rounded) && std::fabs(rounded) < 9e15) return static_cast<std::int64_t>(rounded);
  return rounded;
}
}  // namespace detail

inline nlohmann::ordered_json json_number(double v, int significant) {
  return detail::json_printed(v, "%.*g", significant);
}
inline nlohmann::ordered_json json_fixed(double v, int decimals) { return detail::json_printed(v, "%.*f", decimals); }

}  // namespace stp
