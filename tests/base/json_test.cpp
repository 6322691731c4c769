#include <gtest/gtest.h>

#include "base/error.h"
#include "base/json.h"

namespace {

TEST(Json, ParsesEveryValueKind) {
  auto j = stp::Json::parse(R"( {"a": [1, -2.5e3, true, false, null], "s": "x\"\u00e9\n", "o": {}} )");
  EXPECT_EQ(j["a"][0].as_int(), 1);
  EXPECT_EQ(j["a"][1].as_number(), -2500.0);
  EXPECT_TRUE(j["a"][2].as_bool());
  EXPECT_FALSE(j["a"][3].as_bool());
  EXPECT_TRUE(j["a"][4].is_null());
  EXPECT_EQ(j["s"].as_string(), "x\"\xc3\xa9\n");
  EXPECT_TRUE(j["o"].as_object().empty());
}

TEST(Json, MalformedInputIsAnErrorWithTheOffset) {
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "\"abc", "tru", "1 2", "{\"a\":1,}", "[\"\\q\"]", "nan"}) {
    EXPECT_THROW(stp::Json::parse(bad), stp::Error) << bad;
  }
  try {
    stp::Json::parse("[1, x]");
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("byte 4"), std::string::npos) << e.what();
  }
}

TEST(Json, TypeErrorsNameBothTypes) {
  auto j = stp::Json::parse("{\"n\": \"x\"}");
  try {
    j["n"].as_number();
    FAIL();
  } catch (const stp::Error& e) {
    EXPECT_STREQ(e.what(), "JSON: expected number, got string");
  }
  EXPECT_THROW(j["missing"], stp::Error);
  EXPECT_THROW(stp::Json::parse("1.5").as_int(), stp::Error);
}

TEST(Json, DeepNestingIsRejectedNotACrash) {
  std::string deep(100000, '[');
  EXPECT_THROW(stp::Json::parse(deep), stp::Error);
}

}  // namespace
