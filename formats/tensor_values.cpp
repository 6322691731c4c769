#include "formats/tensor_values.h"

#include <cmath>
#include <cstdint>

#include "base/error.h"

namespace stp {

namespace {

std::string phrase(std::int64_t count, const char* what_one, const char* what_many, std::int64_t first, float value) {
  return str("holds ", count, count == 1 ? what_one : what_many, " (the first, at index ", first, ", is ", value, ")");
}

}  // namespace

std::string value_problem(const std::vector<float>& data, ValueRule rule) {
  std::int64_t nonfinite = 0, negative = 0, first_nonfinite = -1, first_negative = -1;
  for (std::size_t i = 0; i < data.size(); ++i) {
    const float v = data[i];
    if (!std::isfinite(v)) {
      if (nonfinite++ == 0) first_nonfinite = static_cast<std::int64_t>(i);
    } else if (v < 0) {
      if (negative++ == 0) first_negative = static_cast<std::int64_t>(i);
    }
  }
  if (nonfinite > 0)
    return phrase(nonfinite, " value that is not finite", " values that are not finite", first_nonfinite,
                  data[static_cast<std::size_t>(first_nonfinite)]);
  if (rule == ValueRule::FiniteNonNegative && negative > 0)
    return phrase(negative, " negative value", " negative values", first_negative,
                  data[static_cast<std::size_t>(first_negative)]);
  return "";
}

}  // namespace stp
