#include <gtest/gtest.h>

#include "base/error.h"

TEST(Error, CheckThrowsUserErrorWithStreamedMessage) {
  try {
    STP_CHECK(1 + 1 == 3, "value ", 42, " is bad");
    FAIL() << "no throw";
  } catch (const stp::Error& e) {
    EXPECT_STREQ(e.what(), "value 42 is bad");
  }
}

TEST(Error, AssertThrowsInternalErrorNamingTheCondition) {
  try {
    STP_ASSERT(2 < 1, "x=", 3);
    FAIL() << "no throw";
  } catch (const stp::InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("2 < 1 failed: x=3"), std::string::npos) << e.what();
  }
}

TEST(Error, FormatBytes) {
  EXPECT_EQ(stp::format_bytes(512), "512 B");
  EXPECT_EQ(stp::format_bytes(256u << 20), "256.0 MiB (268435456 B)");
}
