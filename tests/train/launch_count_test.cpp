// Kernel launches per step (StepResult::launches, Device::launch_count): counted on the CPU
// backend exactly as on CUDA, so the count gpu-bench reports for a GPU run is testable here. A
// step's count is positive, the same every step (the step enqueues the same work), the same on
// every pipeline rank that holds the same layers, and independent of the CPU threads.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/train/train_fixture.h"
#include "train/trainer.h"

namespace {

using stp::testing::tiny_config;

std::vector<std::vector<std::uint64_t>> launches_per_step(const std::vector<std::string>& overrides, int steps) {
  stp::Trainer t(tiny_config(overrides));
  std::vector<std::vector<std::uint64_t>> out;
  for (int i = 0; i < steps; ++i) out.push_back(t.step().launches);
  return out;
}

TEST(LaunchCount, EveryStepLaunchesTheSameKernels) {
  auto steps = launches_per_step({}, 3);
  ASSERT_EQ(steps.front().size(), 1u);  // one device
  EXPECT_GT(steps.front()[0], 0u);
  for (std::size_t s = 1; s < steps.size(); ++s) EXPECT_EQ(steps[s], steps.front()) << "step " << s + 1;
}

TEST(LaunchCount, IsPerDeviceAndIndependentOfThreads) {
  auto one = launches_per_step({"parallel.pp=2", "parallel.cpu_threads=1"}, 2);
  auto two = launches_per_step({"parallel.pp=2", "parallel.cpu_threads=2"}, 2);
  ASSERT_EQ(one.front().size(), 2u);  // one entry per pipeline rank
  for (std::uint64_t n : one.front()) EXPECT_GT(n, 0u);
  EXPECT_EQ(one.back(), one.front());
  EXPECT_EQ(two, one);
  // Fewer layers per device launch fewer kernels than the whole model on one device.
  auto whole = launches_per_step({}, 1);
  EXPECT_LT(one.front()[0], whole.front()[0]);
  EXPECT_LT(one.front()[1], whole.front()[0]);
}

}  // namespace
