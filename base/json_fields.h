// Typed access to the fields of a parsed JSON object (nlohmann::json) for the small documents stp
// reads back (checkpoint state.json, metrics.jsonl): a missing field or a value of the wrong type
// is an stp::Error naming the key and the value found, not a nlohmann exception or a silent
// conversion (nlohmann's get<int>() would truncate 1.5).
//
// Example:
//   nlohmann::json j = nlohmann::json::parse(R"({"step": 3, "loss": 2.5})");
//   std::int64_t step = json_int(j, "step");   // 3
//   json_int(j, "loss");                       // throws: "loss" must be an integer, not 2.5
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "base/error.h"

namespace stp {

inline const nlohmann::json& json_field(const nlohmann::json& obj, const char* key) {
  STP_CHECK(obj.is_object(), "expected an object with \"", key, "\", not ", obj.type_name());
  auto it = obj.find(key);
  STP_CHECK(it != obj.end(), "missing \"", key, "\"");
  return *it;
}

// An integer written as one (no fraction or exponent) that fits in int64.
inline std::int64_t json_int(const nlohmann::json& obj, const char* key) {
  const nlohmann::json& v = json_field(obj, key);
  STP_CHECK(v.is_number_integer(), "\"", key, "\" must be an integer, not ", v.dump());
  STP_CHECK(!v.is_number_unsigned() || v.get<std::uint64_t>() <= INT64_MAX, "\"", key,
            "\" is out of range: ", v.dump());
  return v.get<std::int64_t>();
}

inline double json_number(const nlohmann::json& obj, const char* key) {
  const nlohmann::json& v = json_field(obj, key);
  STP_CHECK(v.is_number(), "\"", key, "\" must be a number, not ", v.dump());
  return v.get<double>();
}

inline const std::string& json_string(const nlohmann::json& obj, const char* key) {
  const nlohmann::json& v = json_field(obj, key);
  STP_CHECK(v.is_string(), "\"", key, "\" must be a string, not ", v.dump());
  return v.get_ref<const std::string&>();
}

}  // namespace stp
