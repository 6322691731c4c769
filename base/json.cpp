#include "base/json.h"

#include <cmath>
#include <cstdlib>

#include "base/error.h"

namespace stp {

const char* to_string(Json::Type type) {
  switch (type) {
    case Json::Type::Null: return "null";
    case Json::Type::Bool: return "bool";
    case Json::Type::Number: return "number";
    case Json::Type::String: return "string";
    case Json::Type::Array: return "array";
    case Json::Type::Object: return "object";
  }
  return "?";
}

// Recursive descent over a string_view; `pos_` always indexes the next unread byte.
class JsonParser {
 public:
  explicit JsonParser(std::string_view text) : text_(text) {}

  Json parse_document() {
    Json v = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) fail("trailing characters after the JSON value");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 256;

  [[noreturn]] void fail(const std::string& what) const { throw Error(str("invalid JSON at byte ", pos_, ": ", what)); }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\r' || text_[pos_] == '\t'))
      ++pos_;
  }
  char peek() {
    skip_space();
    if (pos_ >= text_.size()) fail("unexpected end of input");
    return text_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(str("expected '", c, "'"));
    ++pos_;
  }
  void expect_word(std::string_view w) {
    if (text_.substr(pos_, w.size()) != w) fail(str("expected '", w, "'"));
    pos_ += w.size();
  }

  Json parse_value(int depth) {
    if (depth > kMaxDepth) fail("nesting too deep");
    Json v;
    char c = peek();
    if (c == '{') {
      v.type_ = Json::Type::Object;
      parse_object(v, depth);
    } else if (c == '[') {
      v.type_ = Json::Type::Array;
      parse_array(v, depth);
    } else if (c == '"') {
      v.type_ = Json::Type::String;
      v.string_ = parse_string();
    } else if (c == 't' || c == 'f') {
      v.type_ = Json::Type::Bool;
      v.bool_ = c == 't';
      expect_word(c == 't' ? "true" : "false");
    } else if (c == 'n') {
      expect_word("null");
    } else {
      v.type_ = Json::Type::Number;
      v.number_ = parse_number();
    }
    return v;
  }

  void parse_object(Json& v, int depth) {
    expect('{');
    if (peek() == '}') {
      ++pos_;
      return;
    }
    for (;;) {
      if (peek() != '"') fail("expected a string key");
      std::string key = parse_string();
      expect(':');
      v.object_[key] = parse_value(depth + 1);
      char c = peek();
      ++pos_;
      if (c == '}') return;
      if (c != ',') fail("expected ',' or '}'");
    }
  }

  void parse_array(Json& v, int depth) {
    expect('[');
    if (peek() == ']') {
      ++pos_;
      return;
    }
    for (;;) {
      v.array_.push_back(parse_value(depth + 1));
      char c = peek();
      ++pos_;
      if (c == ']') return;
      if (c != ',') fail("expected ',' or ']'");
    }
  }

  double parse_number() {
    std::size_t start = pos_;
    auto is_num_char = [](char c) {
      return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
    };
    while (pos_ < text_.size() && is_num_char(text_[pos_])) ++pos_;
    if (pos_ == start) fail("unexpected character");
    std::string token(text_.substr(start, pos_ - start));
    char* end = nullptr;
    double d = std::strtod(token.c_str(), &end);
    if (end != token.c_str() + token.size() || !std::isfinite(d)) fail(str("bad number '", token, "'"));
    return d;
  }

  unsigned parse_hex4() {
    if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
      else fail("bad \\u escape");
    }
    return v;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string parse_string() {
    expect('"');
    std::string out;
    for (;;) {
      if (pos_ >= text_.size()) fail("unterminated string");
      char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) fail("unterminated escape");
      char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = parse_hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && text_.substr(pos_, 2) == "\\u") {
            pos_ += 2;
            unsigned lo = parse_hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default: fail(str("bad escape '\\", e, "'"));
      }
    }
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

Json Json::parse(std::string_view text) { return JsonParser(text).parse_document(); }

static void expect_type(Json::Type actual, Json::Type want) {
  STP_CHECK(actual == want, "JSON: expected ", to_string(want), ", got ", to_string(actual));
}

bool Json::as_bool() const {
  expect_type(type_, Type::Bool);
  return bool_;
}
double Json::as_number() const {
  expect_type(type_, Type::Number);
  return number_;
}
std::int64_t Json::as_int() const {
  expect_type(type_, Type::Number);
  STP_CHECK(std::trunc(number_) == number_ && std::fabs(number_) < 9.007199254740992e15,
            "JSON: expected an integer, got ", number_);
  return static_cast<std::int64_t>(number_);
}
const std::string& Json::as_string() const {
  expect_type(type_, Type::String);
  return string_;
}
const std::vector<Json>& Json::as_array() const {
  expect_type(type_, Type::Array);
  return array_;
}
const std::map<std::string, Json>& Json::as_object() const {
  expect_type(type_, Type::Object);
  return object_;
}
bool Json::contains(const std::string& key) const { return type_ == Type::Object && object_.count(key) > 0; }
const Json& Json::operator[](const std::string& key) const {
  const auto& obj = as_object();
  auto it = obj.find(key);
  STP_CHECK(it != obj.end(), "JSON: missing key \"", key, "\"");
  return it->second;
}
const Json& Json::operator[](std::size_t index) const {
  const auto& arr = as_array();
  STP_CHECK(index < arr.size(), "JSON: index ", index, " out of an array of ", arr.size());
  return arr[index];
}

}  // namespace stp
