// How a device's output is compared with the CPU oracle's in the kernel parity tests
// (tests/core/kernel_parity_test.cpp, whose header derives the tolerances): a Tolerance per output,
// and matches(), which reports the largest errors whether or not they are within it. Its own
// tests are tests/core/parity_compare_test.cpp.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace stp::testing {

template <typename T>
constexpr double unit_roundoff();
template <>
constexpr double unit_roundoff<float>() {
  return 0x1p-24;
}
template <>
constexpr double unit_roundoff<bf16>() {
  return 0x1p-8;
}

template <typename T>
double to_double(T v) {
  return static_cast<double>(v);
}
inline double to_double(bf16 v) { return stp::to_f32(v); }

constexpr double kU = unit_roundoff<float>();

// How close element i of the device's output must be to the oracle's:
//   |got_i - want_i| <= rel * |want_i| + abs + of_max * max_j |want_j| + bound[i] (bound optional).
// The default, all zero, means bitwise: the same bytes (so -0 vs +0 or two NaNs are judged by bits).
struct Tolerance {
  double rel = 0, abs = 0, of_max = 0;
  std::vector<double> bound;  // per-element absolute bound (GEMM error bounds), or empty

  static Tolerance exact() { return {}; }
  bool bitwise() const { return rel == 0 && abs == 0 && of_max == 0 && bound.empty(); }
  std::string describe() const {
    if (bitwise()) return "bitwise";
    std::ostringstream s;
    s << "rel " << rel << ", abs " << abs << ", of_max " << of_max << (bound.empty() ? "" : ", per-element bound");
    return s.str();
  }
};

inline Tolerance within(double rel, double abs = 0, double of_max = 0) { return Tolerance{rel, abs, of_max, {}}; }
inline Tolerance per_element(std::vector<double> bound) { return Tolerance{0, 0, 0, std::move(bound)}; }

// The tolerance of an output stored as T whose f32 value is within `f32` on both sides (see the
// file header): bf16 adds one bf16 ulp, <= 2^-7 (2 u) of the value; exact stays exact.
template <typename T>
Tolerance stored_as(Tolerance f32) {
  if (!std::is_same_v<T, float> && !f32.bitwise()) f32.rel += 2 * unit_roundoff<T>();
  return f32;
}

// Largest errors of got against want, and whether they are within tol. The message always carries
// the largest absolute and relative errors; on failure also how many elements failed and the worst.
template <typename T>
::testing::AssertionResult matches(const std::vector<T>& got, const std::vector<T>& want, const Tolerance& tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " elements, expected " << want.size();
  if (!tol.bound.empty() && tol.bound.size() != want.size())
    return ::testing::AssertionFailure() << "tolerance has " << tol.bound.size() << " bounds for " << want.size()
                                         << " elements";
  double scale = 0;
  for (const T& w : want) scale = std::max(scale, std::fabs(to_double(w)));
  std::size_t bad = 0, worst = 0;
  double max_abs = 0, max_rel = 0, worst_excess = -1;
  for (std::size_t i = 0; i < want.size(); ++i) {
    double g = to_double(got[i]), w = to_double(want[i]);
    double err = std::fabs(g - w);
    if (!std::isnan(err)) {
      max_abs = std::max(max_abs, err);
      if (w != 0) max_rel = std::max(max_rel, err / std::fabs(w));
    }
    bool ok;
    double allowed = 0;
    if (tol.bitwise()) {
      ok = std::memcmp(&got[i], &want[i], sizeof(T)) == 0;
    } else {
      allowed = tol.rel * std::fabs(w) + tol.abs + tol.of_max * scale + (tol.bound.empty() ? 0.0 : tol.bound[i]);
      ok = err <= allowed;  // false for NaN
    }
    if (!ok) {
      ++bad;
      double excess = std::isnan(err) ? INFINITY : err - allowed;
      if (excess > worst_excess) worst_excess = excess, worst = i;
    }
  }
  auto result = bad ? ::testing::AssertionFailure() : ::testing::AssertionSuccess();
  result << "max abs error " << max_abs << ", max rel error " << max_rel << " over " << want.size()
         << " elements (largest |want| " << scale << "; tolerance " << tol.describe() << ")";
  if (bad) {
    double w = to_double(want[worst]);
    result << "; " << bad << " outside it, worst [" << worst << "]: got " << to_double(got[worst]) << ", want " << w
           << ", allowed error "
           << (tol.bitwise() ? 0.0
                             : tol.rel * std::fabs(w) + tol.abs + tol.of_max * scale +
                                   (tol.bound.empty() ? 0.0 : tol.bound[worst]));
  }
  return result;
}

}  // namespace stp::testing
