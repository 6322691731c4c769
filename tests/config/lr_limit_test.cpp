// The learning-rate limit of validate_config (config/config.h, max_finite_lr): the bound R on
// AdamW's normalised update (adamw_update_bound) holds for every gradient history from zero
// moments, and the gradients of the Cauchy–Schwarz equality case approach it, so the limit is
// derived from a tight bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <random>
#include <vector>

#include "config/config.h"

namespace {

stp::OptimConfig betas(double beta1, double beta2, double weight_decay = 0) {
  stp::OptimConfig o;
  o.beta1 = beta1;
  o.beta2 = beta2;
  o.eps = 0;
  o.weight_decay = weight_decay;
  return o;
}

// |m̂| / sqrt(v̂) of every step of AdamW over the gradients g (exact arithmetic in double, eps 0,
// zero moments first); 0 where v̂ = 0 (then m̂ = 0 too).
std::vector<double> ratios(const stp::OptimConfig& o, const std::vector<double>& g) {
  std::vector<double> out;
  double m = 0, v = 0, b1 = 1, b2 = 1;
  for (double x : g) {
    m = o.beta1 * m + (1 - o.beta1) * x;
    v = o.beta2 * v + (1 - o.beta2) * x * x;
    b1 *= o.beta1;
    b2 *= o.beta2;
    out.push_back(v > 0 ? std::fabs(m / (1 - b1)) / std::sqrt(v / (1 - b2)) : 0.0);
  }
  return out;
}

const std::vector<std::pair<double, double>> kBetas = {{0.9, 0.95}, {0.9, 0.999},   {0.0, 0.99},
                                                       {0.5, 0.3},  {0.99, 0.9999}, {0.0, 0.0}};

TEST(LrLimit, TheUpdateBoundHoldsForEveryGradientHistory) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> unit(0, 1);
  for (auto [beta1, beta2] : kBetas) {
    const stp::OptimConfig o = betas(beta1, beta2);
    const double R = stp::adamw_update_bound(o);
    ASSERT_GE(R, 1.0) << "step 1's ratio is exactly 1";
    for (int trial = 0; trial < 200; ++trial) {
      // Magnitudes over 12 decades, random signs, runs of zeros and single spikes.
      std::vector<double> g(300);
      for (double& x : g) {
        const double u = unit(rng);
        x = u < 0.2 ? 0.0 : std::pow(10.0, 12 * unit(rng) - 6) * (unit(rng) < 0.5 ? -1 : 1);
      }
      for (double r : ratios(o, g)) ASSERT_LE(r, R * (1 + 1e-12)) << beta1 << " " << beta2;
    }
  }
}

// |g_{t−k}| = (beta1 / beta2)^k makes Cauchy–Schwarz an equality; once beta2^t and gamma^t are
// small the ratio is within 1e-4 of R.
TEST(LrLimit, TheUpdateBoundIsApproachedByTheEqualityCase) {
  for (auto [beta1, beta2] : kBetas) {
    const stp::OptimConfig o = betas(beta1, beta2);
    const double R = stp::adamw_update_bound(o);
    const double gamma = beta1 > 0 ? beta1 * beta1 / beta2 : 0.0;
    const double slowest = std::max(beta2, gamma);
    const int t = slowest > 0 ? static_cast<int>(std::ceil(std::log(1e-5) / std::log(slowest))) + 1 : 1;
    std::vector<double> g(static_cast<std::size_t>(t));
    for (int s = 0; s < t; ++s) g[static_cast<std::size_t>(s)] = beta1 > 0 ? std::pow(beta1 / beta2, t - 1 - s) : 0.0;
    g.back() = 1;  // beta1 = 0: only the last gradient counts in m
    const double r = ratios(o, g).back();
    EXPECT_LE(r, R * (1 + 1e-12)) << beta1 << " " << beta2;
    EXPECT_GE(r, R * (1 - 1e-4)) << beta1 << " " << beta2;
  }
}

// beta1 >= sqrt(beta2): no bound (an old large gradient keeps m above sqrt(v)), so only the step
// size and the decay factor limit train.lr.
TEST(LrLimit, NoBoundWhenBeta1ReachesTheRootOfBeta2) {
  EXPECT_EQ(stp::adamw_update_bound(betas(0.9, 0.81)), 0.0);
  EXPECT_EQ(stp::adamw_update_bound(betas(0.9, 0.5)), 0.0);
  std::vector<double> g(60, 0.0);
  g.front() = 1e6;
  g.back() = 1e-3;
  EXPECT_GT(ratios(betas(0.9, 0.5), g).back(), 1e3) << "the ratio grows without bound";
  EXPECT_DOUBLE_EQ(stp::max_finite_lr(betas(0.9, 0.5)), FLT_MAX / 20.0);
}

TEST(LrLimit, TheLimitIsTheLargestOfTheThreeTerms) {
  EXPECT_DOUBLE_EQ(stp::max_finite_lr(betas(0.9, 0.95, 0.1)), FLT_MAX / 20.0) << "step 1's size lr / (1 - beta1)";
  EXPECT_DOUBLE_EQ(stp::max_finite_lr(betas(0.0, 0.9999)), FLT_MAX / (2 * stp::adamw_update_bound(betas(0.0, 0.9999))))
      << "the update bound R = 1 / sqrt(1 - beta2) = 100";
  EXPECT_DOUBLE_EQ(stp::max_finite_lr(betas(0.9, 0.95, 1e20)), FLT_MAX / 2e20) << "the decay factor 1 - lr * wd";
}

}  // namespace
