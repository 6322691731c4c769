// The parity comparison (tests/support/parity_compare.h) must be able to fail: one ulp breaks
// "bitwise", an error just past the bound breaks a tolerance, NaN breaks both.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/support/parity_compare.h"

namespace {

using stp::bf16;
using stp::testing::matches;
using stp::testing::per_element;
using stp::testing::stored_as;
using stp::testing::Tolerance;
using stp::testing::within;

TEST(ParityCompare, BitwiseRejectsOneUlpAndNegativeZero) {
  std::vector<float> want = {1.0f, -2.5f, 0.0f, 3.0e-3f};
  EXPECT_TRUE(matches(want, want, Tolerance::exact()));
  std::vector<float> got = want;
  got[3] = std::nextafter(got[3], 1.0f);
  EXPECT_FALSE(matches(got, want, Tolerance::exact()));
  got = want;
  got[2] = -0.0f;
  EXPECT_FALSE(matches(got, want, Tolerance::exact()));
}

TEST(ParityCompare, ToleranceAcceptsUpToTheBoundAndNoFurther) {
  std::vector<float> want = {1.0f, -2.0f, 0.5f};
  const Tolerance tol = within(1e-3);
  std::vector<float> got = {1.0005f, -2.0015f, 0.5f};  // within 1e-3 * |want|
  EXPECT_TRUE(matches(got, want, tol));
  got[1] = -2.0025f;  // 1.25e-3 relative
  auto r = matches(got, want, tol);
  EXPECT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("worst [1]"), std::string::npos) << r.message();
  // of_max: relative to the largest |want| (2), so 0.5 may be off by 2e-3 * 2.
  const Tolerance norm = within(0, 0, 2e-3);
  EXPECT_TRUE(matches(std::vector<float>{1.0f, -2.0f, 0.5035f}, want, norm));
  EXPECT_FALSE(matches(std::vector<float>{1.0f, -2.0f, 0.5045f}, want, norm));
  // Per-element bounds.
  const Tolerance per = per_element({0, 0, 0.01});
  EXPECT_TRUE(matches(std::vector<float>{1.0f, -2.0f, 0.509f}, want, per));
  EXPECT_FALSE(matches(std::vector<float>{1.0f, -1.999f, 0.5f}, want, per));
  got = want;
  got[0] = NAN;
  EXPECT_FALSE(matches(got, want, within(1, 1, 1)));
}

// Element types: the comparison reads bf16 through to_double; one bf16 ulp is what stored_as adds.
TEST(ParityCompare, Bf16ElementsAndOneStoreRounding) {
  std::vector<bf16> want = {stp::from_f32<bf16>(1.0f), stp::from_f32<bf16>(-3.0f)};
  EXPECT_TRUE(matches(want, want, Tolerance::exact()));
  std::vector<bf16> got = want;
  got[1].bits += 1;  // -3 -> -3.015625, one bf16 ulp (relative 5.2e-3)
  EXPECT_FALSE(matches(got, want, Tolerance::exact()));
  EXPECT_FALSE(matches(got, want, within(1e-3)));
  EXPECT_TRUE(matches(got, want, stored_as<bf16>(within(1e-3))));
  EXPECT_TRUE(stored_as<bf16>(Tolerance::exact()).bitwise());
  EXPECT_EQ(stored_as<float>(within(1e-3)).rel, 1e-3);
}

}  // namespace
