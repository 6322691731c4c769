// The f32 AdamW step at the largest learning rate validation accepts (config/config.h,
// max_finite_lr): its update is finite for the gradients that push |m̂ / sqrt(v̂)| to its bound, and
// a learning rate 2.5 times larger overflows in step 1 (the limit spares a factor 2, not more).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "config/config.h"
#include "core/kernels/optim_kernels.h"
#include "optim/cpu_adamw.h"

namespace {

stp::AdamWHyper hyper_of(const stp::OptimConfig& o) {
  return stp::AdamWHyper{static_cast<float>(o.beta1), static_cast<float>(o.beta2), static_cast<float>(o.eps),
                         static_cast<float>(o.weight_decay)};
}

// Steps 1..t of AdamW on one element from zero moments with the equality-case gradients
// |g_{t−k}| = (beta1 / beta2)^k (config/config_validate.cpp: they bring step t's ratio close to its
// bound once beta2^t and beta1² / beta2^t are below 1e-4), the parameter reset to 0 before each
// step: whether every update stays finite.
bool updates_finite(const stp::OptimConfig& o, double lr) {
  const double gamma = o.beta1 * o.beta1 / o.beta2;
  const int t = static_cast<int>(std::ceil(std::log(1e-4) / std::log(std::max(o.beta2, gamma))));
  float m = 0, v = 0;
  for (int s = 1; s <= t; ++s) {
    float p = 0;
    const float g = static_cast<float>(std::pow(o.beta1 / o.beta2, t - s));  // beta1 = 0: 1 at s = t only
    const stp::AdamWScalars c = stp::adamw_scalars(static_cast<float>(lr), hyper_of(o), s, /*decay=*/true);
    stp::cpu_adamw_update(&p, &g, &m, &v, 1, c, stp::CpuIsa::Scalar, /*parallel=*/false);
    if (!std::isfinite(p) || !std::isfinite(c.decay_factor)) return false;
  }
  return true;
}

TEST(AdamWLrLimit, UpdatesAtTheLimitAreFiniteAndAFewTimesMoreAreNot) {
  for (auto [beta1, beta2, wd] : std::vector<std::tuple<double, double, double>>{
           {0.9, 0.95, 0.1}, {0.9, 0.999, 0.1}, {0.0, 0.9999, 0.0}, {0.5, 0.3, 0.0}, {0.9, 0.95, 1e20}}) {
    SCOPED_TRACE(testing::Message() << "beta1 " << beta1 << " beta2 " << beta2 << " weight_decay " << wd);
    stp::OptimConfig o;
    o.beta1 = beta1;
    o.beta2 = beta2;
    o.eps = 1e-8;
    o.weight_decay = wd;
    const double limit = stp::max_finite_lr(o);
    EXPECT_TRUE(updates_finite(o, limit));
    EXPECT_FALSE(updates_finite(o, 2.5 * limit));
  }
}

}  // namespace
