// The memory knobs as the layers below config/ see them (train/memory_settings.h): budgets in
// bytes (null = no budget), policies as enums whose spellings are exactly the registry's choices.
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "config/config.h"
#include "core/cpu/cpu_device.h"
#include "memory/policy.h"
#include "train/memory_settings.h"

namespace {

using stp::OffloadPolicy;
using stp::RecomputePolicy;

// config/ cannot include memory/, so the knob rows spell the choices themselves: they must be
// the policy tables' names, in the same order, and the defaults must be names.
TEST(MemorySettings, RegistryChoicesAreThePolicyNames) {
  const stp::Knob* offload = stp::find_knob("memory.offload");
  const stp::Knob* recompute = stp::find_knob("memory.recompute");
  ASSERT_TRUE(offload && recompute);
  EXPECT_EQ(std::string(offload->choices), stp::policy_choices<OffloadPolicy>());
  EXPECT_EQ(std::string(recompute->choices), stp::policy_choices<RecomputePolicy>());
  EXPECT_EQ(stp::parse_policy<OffloadPolicy>(offload->default_value), OffloadPolicy::Auto);
  EXPECT_EQ(stp::parse_policy<RecomputePolicy>(recompute->default_value), RecomputePolicy::Auto);
}

TEST(MemorySettings, PoliciesRoundTripThroughTheirNames) {
  for (OffloadPolicy p : {OffloadPolicy::Auto, OffloadPolicy::None, OffloadPolicy::All})
    EXPECT_EQ(stp::parse_policy<OffloadPolicy>(stp::to_string(p)), p);
  for (RecomputePolicy p :
       {RecomputePolicy::Auto, RecomputePolicy::None, RecomputePolicy::Selective, RecomputePolicy::Full})
    EXPECT_EQ(stp::parse_policy<RecomputePolicy>(stp::to_string(p)), p);
  EXPECT_STREQ(stp::to_string(RecomputePolicy::Selective), "selective");
  EXPECT_FALSE(stp::parse_policy<OffloadPolicy>("Auto").has_value());  // exact spellings only
  EXPECT_FALSE(stp::parse_policy<RecomputePolicy>("partial").has_value());
}

TEST(MemorySettings, BudgetsBecomeBytesAndNullMeansNoBudget) {
  stp::MemorySettings m = stp::memory_settings(stp::load_config_from_string(
      "memory: {device_budget: 3MiB, host_budget: 1KB, offload: none, recompute: selective}\n", "<string>"));
  EXPECT_EQ(m.device_budget, std::size_t{3} << 20);
  EXPECT_EQ(m.host_budget, std::size_t{1000});
  EXPECT_EQ(m.offload, OffloadPolicy::None);
  EXPECT_EQ(m.recompute, RecomputePolicy::Selective);
  stp::MemorySettings none = stp::memory_settings(
      stp::load_config_from_string("memory: {device_budget: null, host_budget: null}\n", "<string>"));
  EXPECT_EQ(none.device_budget, stp::kNoBudget);
  EXPECT_EQ(none.host_budget, stp::kNoBudget);
  EXPECT_EQ(stp::format_budget(stp::kNoBudget), "unlimited");
  EXPECT_EQ(stp::format_budget(std::size_t{3} << 20), stp::format_bytes(std::size_t{3} << 20));
}

TEST(MemorySettings, ABudgetedArenaIsOneSegmentOfTheBudget) {
  stp::CpuDevice dev{0, {}};
  stp::ArenaOptions budgeted = stp::budgeted_arena_options(dev, std::size_t{3} << 20);
  EXPECT_EQ(budgeted.budget, std::size_t{3} << 20);
  EXPECT_EQ(budgeted.segment_bytes, std::size_t{3} << 20);
  stp::ArenaOptions unbudgeted = stp::budgeted_arena_options(dev, stp::kNoBudget);
  EXPECT_EQ(unbudgeted.budget, stp::kNoBudget);
  EXPECT_EQ(unbudgeted.segment_bytes, stp::device_arena_options(dev).segment_bytes);
}

}  // namespace
