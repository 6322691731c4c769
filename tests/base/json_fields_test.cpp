// base/json_fields.h (typed reads with stp::Error) and base/json_number.h (printed precision).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/json_fields.h"
#include "base/json_number.h"

namespace {

void expect_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected stp::Error with '" << needle << "'";
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(JsonFields, ReadTypedFieldsAndNameWhatIsWrong) {
  auto j = nlohmann::json::parse(R"({"step": 3, "big": 18446744073709551615, "loss": 2.5, "e": 1e3, "s": "x"})");
  EXPECT_EQ(stp::json_int(j, "step"), 3);
  EXPECT_EQ(stp::json_number(j, "loss"), 2.5);
  EXPECT_EQ(stp::json_number(j, "step"), 3.0);
  EXPECT_EQ(stp::json_string(j, "s"), "x");
  expect_error([&] { stp::json_int(j, "loss"); }, "\"loss\" must be an integer, not 2.5");
  expect_error([&] { stp::json_int(j, "e"); }, "\"e\" must be an integer");
  expect_error([&] { stp::json_int(j, "big"); }, "out of range");
  expect_error([&] { stp::json_int(j, "nope"); }, "missing \"nope\"");
  expect_error([&] { stp::json_number(j, "s"); }, "\"s\" must be a number");
  expect_error([&] { stp::json_string(j, "step"); }, "\"step\" must be a string, not 3");
  expect_error([&] { stp::json_int(nlohmann::json::array(), "step"); }, "expected an object");
}

TEST(JsonNumber, WritesThePrintedPrecision) {
  auto text = [](const nlohmann::ordered_json& v) { return v.dump(); };
  EXPECT_EQ(text(stp::json_number(2.0 / 3, 6)), "0.666667");
  EXPECT_EQ(text(stp::json_number(2.0 / 3, 15)), "0.666666666666667");
  EXPECT_EQ(text(stp::json_number(12.0, 6)), "12");
  EXPECT_EQ(text(stp::json_number(2.9999999, 6)), "3");
  EXPECT_EQ(text(stp::json_number(-1.5e-5, 6)), "-1.5e-05");
  EXPECT_EQ(text(stp::json_number(std::nan(""), 6)), "0");
  EXPECT_EQ(text(stp::json_number(std::numeric_limits<double>::infinity(), 6)), "0");
  EXPECT_EQ(text(stp::json_fixed(5.4743201, 6)), "5.47432");
  EXPECT_EQ(text(stp::json_fixed(1821.1364, 3)), "1821.136");
  EXPECT_EQ(text(stp::json_fixed(2249.06, 1)), "2249.1");
  EXPECT_EQ(text(stp::json_fixed(0.0004, 3)), "0");
}

}  // namespace

namespace {

// The text of a nlohmann exception without its id, in a message stp writes.
std::string error_text_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const nlohmann::json::exception& e) {
    return stp::json_error_text(e);
  }
  return "no exception";
}

TEST(JsonFields, ErrorTextDropsTheLibraryIdAndKeepsThePosition) {
  std::string t = error_text_of([] { [[maybe_unused]] auto j = nlohmann::json::parse("{\"a\": 1,\n \"b\": x}"); });
  EXPECT_EQ(t.find("json.exception"), std::string::npos) << t;
  EXPECT_EQ(t.find("parse error"), std::string::npos) << t;
  EXPECT_EQ(t.rfind("line 2, column 7: ", 0), 0u) << t;
  t = error_text_of([] { [[maybe_unused]] auto j = nlohmann::json::parse("{"); });
  EXPECT_EQ(t.find("json.exception"), std::string::npos) << t;
  EXPECT_NE(t.find("unexpected end of input"), std::string::npos) << t;
  t = error_text_of([] { (void)nlohmann::json(std::string("\xff")).dump(); });
  EXPECT_EQ(t.rfind("invalid UTF-8 byte", 0), 0u) << t;
  // One line of a JSON Lines file: the column only, the caller names the line.
  std::string one = "?";
  try {
    [[maybe_unused]] auto j = nlohmann::json::parse("{\"step\": 4, \"lo");
  } catch (const nlohmann::json::exception& e) {
    one = stp::json_error_text(e, stp::JsonPosition::Column);
  }
  EXPECT_EQ(one.rfind("column 16: ", 0), 0u) << one;
}

}  // namespace
