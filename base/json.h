// A small JSON reader (RFC 8259) for the files stp itself reads back: trace.json, metrics.jsonl,
// checkpoint state.json, the safetensors header. Throws stp::Error with the byte offset on
// malformed input; never reads past the given text. Numbers are doubles (exact for integers
// up to 2^53, which covers every byte offset stp writes).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace stp {

class Json {
 public:
  enum class Type { Null, Bool, Number, String, Array, Object };

  Json() = default;
  static Json parse(std::string_view text);  // the whole text must be one value

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::Null; }
  bool is_number() const { return type_ == Type::Number; }
  bool is_string() const { return type_ == Type::String; }
  bool is_array() const { return type_ == Type::Array; }
  bool is_object() const { return type_ == Type::Object; }

  // Typed accessors throw stp::Error naming the expected and actual type.
  bool as_bool() const;
  double as_number() const;
  std::int64_t as_int() const;  // a number that is an exact integer
  const std::string& as_string() const;
  const std::vector<Json>& as_array() const;
  const std::map<std::string, Json>& as_object() const;

  bool contains(const std::string& key) const;
  const Json& operator[](const std::string& key) const;  // throws if missing
  const Json& operator[](std::size_t index) const;

 private:
  friend class JsonParser;
  Type type_ = Type::Null;
  bool bool_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<Json> array_;
  std::map<std::string, Json> object_;
};

const char* to_string(Json::Type type);

}  // namespace stp
