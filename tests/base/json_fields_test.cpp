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
