// Typed access to the fields of a parsed JSON object (nlohmann::json) for the small documents stp
// reads back (checkpoint state.json, metrics.jsonl): a missing field or a value of the wrong type
// is an stp::Error naming the key and the value found, not a nlohmann exception or a silent
// conversion (nlohmann's get<int>() would truncate 1.5). A document that does not parse is
// reported with json_error_text(): nlohmann's reason and position, without its exception id.
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

// Where json_error_text() says a parse error is: "line 3, column 7", or "column 7" for a text that
// is one line of a file whose line the caller names (JSON Lines).
enum class JsonPosition : std::uint8_t { LineAndColumn, Column };

// nlohmann's reason for a failed parse or dump, for an stp message: without its exception id
// ("[json.exception.parse_error.101] parse error at ").
//   parse("{\"a\": x}")  ->  "line 1, column 8: syntax error while parsing value - invalid literal; last read: '\"a\":
//   x'" dump of a string that is not UTF-8  ->  "invalid UTF-8 byte at index 0: 0xFF"
inline std::string json_error_text(const nlohmann::json::exception& e,
                                   JsonPosition position = JsonPosition::LineAndColumn) {
  std::string t = e.what();
  if (t.rfind("[json.exception.", 0) == 0 && t.find("] ") != std::string::npos) t.erase(0, t.find("] ") + 2);
  for (const char* lead : {"parse error at ", "parse error: "})
    if (t.rfind(lead, 0) == 0) {
      t.erase(0, std::char_traits<char>::length(lead));
      break;
    }
  if (position == JsonPosition::Column && t.rfind("line 1, column ", 0) == 0) t.erase(0, 8);  // "line 1, "
  return t;
}

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
