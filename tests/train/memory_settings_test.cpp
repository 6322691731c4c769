// The memory knobs as the layers below config/ see them (train/memory_settings.h): budgets in
// bytes (null = no budget), policies as enums whose spellings are exactly the registry's choices.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
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

constexpr std::uint64_t GiB = std::uint64_t{1} << 30;

// A fake machine of `bytes` (MemTotal), shared by `processes` processes of the job.
stp::MachineMemory machine(std::uint64_t bytes, int processes = 1) {
  stp::MachineMemory m;
  m.memory.mem_total = bytes;
  m.processes = processes;
  return m;
}

// memory.host_budget: auto = the machine's share less max(4 GiB, 10%), the reserve at most half.
TEST(MemorySettings, HostBudgetAutoIsTheMachineLessTheReserve) {
  const stp::Config c = stp::load_config_from_string("memory: {host_budget: auto}\n", "<string>");
  const stp::MemorySettings m16 = stp::memory_settings(c, machine(16 * GiB));
  EXPECT_TRUE(m16.host_budget_auto);
  EXPECT_EQ(m16.host_budget, 12 * GiB);  // 10% is 1.6 GiB: the 4 GiB floor
  EXPECT_EQ(stp::memory_settings(c, machine(256 * GiB)).host_budget, 256 * GiB - 256 * GiB / 100 * 10);
  EXPECT_EQ(stp::memory_settings(c, machine(6 * GiB)).host_budget, 3 * GiB);       // at most half
  EXPECT_EQ(stp::memory_settings(c, machine(64 * GiB, 4)).host_budget, 12 * GiB);  // 16 GiB per process
  // A cgroup limit below MemTotal is what the machine has.
  stp::MachineMemory limited = machine(64 * GiB);
  limited.memory.cgroup_limit = 8 * GiB;
  limited.memory.cgroup_file = "/sys/fs/cgroup/job/memory.max";
  EXPECT_EQ(stp::memory_settings(c, limited).host_budget, 4 * GiB);
  EXPECT_EQ(stp::host_budget_text(stp::memory_settings(c, limited)),
            "memory.host_budget = auto = 4.00 GiB (8.00 GiB (cgroup limit, /sys/fs/cgroup/job/memory.max) less the "
            "4.00 GiB reserve)");
  // An explicit size and null are what they say, on any machine.
  EXPECT_EQ(
      stp::memory_settings(stp::load_config_from_string("memory: {host_budget: 1GiB}\n", "<string>"), machine(16 * GiB))
          .host_budget,
      GiB);
  EXPECT_FALSE(
      stp::memory_settings(stp::load_config_from_string("memory: {host_budget: 1GiB}\n", "<string>")).host_budget_auto);
}

TEST(MemorySettings, HostBudgetDefaultsToAuto) {
  const stp::Config c = stp::default_config();
  EXPECT_EQ(c.memory.host_budget, std::optional<std::uint64_t>(stp::kAutoBytes));
  EXPECT_EQ(stp::memory_settings(c, machine(32 * GiB)).host_budget, 28 * GiB);
  // This machine's memory is read (Linux: /proc/meminfo): auto is its share less the reserve.
  const stp::MemorySettings here = stp::memory_settings(c);
  ASSERT_GT(here.machine.share(), 0u) << here.machine.problem;
  EXPECT_EQ(here.host_budget, here.machine.share() - stp::host_reserve_bytes(here.machine.share()));
}

TEST(MemorySettings, AutoOnAMachineWhoseMemoryIsUnknownIsAnError) {
  stp::MachineMemory unknown;
  unknown.problem = "cannot read /proc/meminfo";
  const stp::Config c = stp::load_config_from_string("memory: {host_budget: auto}\n", "<string>");
  try {
    stp::memory_settings(c, unknown);
    FAIL() << "auto was resolved without the machine's memory";
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("memory.host_budget: auto"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("/proc/meminfo"), std::string::npos) << e.what();
  }
  EXPECT_EQ(stp::memory_settings(stp::load_config_from_string("memory: {host_budget: 2GiB}\n", "<string>"), unknown)
                .host_budget,
            2 * GiB);
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
