// Per-chunk optimizer placement (RankPlan::optimizer): one rank may keep some chunks' AdamW state
// on the device and others' in pinned host memory (optim/host_update.h).
//   * A mixed placement trains bitwise as the device optimizer — losses, parameters, and the
//     checkpoint's model and optimizer files byte for byte — with the replicated optimizer and the
//     distributed one (dp 2), f32 and bf16, gradient clipping on.
//   * memory.optimizer_offload: auto on configs/tiny.yaml, at a budget just under what the plan with
//     every optimizer on the device needs, moves only some chunks' state to the host, and a real
//     run peaks exactly as planned, every device, and trains bitwise as without a budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/run_command.h"
#include "tests/train/train_fixture.h"
#include "train/memory_planning.h"
#include "train/trainer.h"

namespace {

using stp::OptimizerPlacement;
using stp::testing::fresh_dir;
using stp::testing::tiny_config;

struct PlacementRun {
  std::vector<double> losses;
  std::map<std::string, stp::HostTensor> params;
  std::string model_file, optimizer_file;
  std::vector<std::size_t> optimizer_host_bytes;  // per device
};

// Two steps under `plan` (null: the trainer plans), then a checkpoint.
PlacementRun train(const stp::Config& config, const stp::MemoryPlan* plan) {
  stp::TrainerOptions o;
  o.plan = plan;
  stp::Trainer t(config, o);
  PlacementRun out;
  for (int i = 0; i < 2; ++i) out.losses.push_back(t.step().loss);
  out.params = t.full_parameters();
  for (const auto& d : t.device_memory()) out.optimizer_host_bytes.push_back(d.optimizer_host_bytes);
  std::filesystem::path ck = t.save_checkpoint();
  out.model_file = stp::testing::slurp((ck / "model.safetensors").string());
  out.optimizer_file = stp::testing::slurp((ck / "optimizer.safetensors").string());
  return out;
}

void expect_bitwise(const PlacementRun& a, const PlacementRun& b) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;
  EXPECT_TRUE(stp::testing::bitwise_equal(a.params, b.params));
  EXPECT_TRUE(a.model_file == b.model_file) << "model.safetensors differs";
  EXPECT_TRUE(a.optimizer_file == b.optimizer_file) << "optimizer.safetensors differs";
}

struct Case {
  const char* schedule;
  bool bf16, distributed;
};

class MixedPlacement : public ::testing::TestWithParam<Case> {};

// Pipeline rank r keeps chunk (r + 1) % 2 on the device and puts chunk r % 2 on the host: every
// rank mixes, and the host chunk differs between ranks.
TEST_P(MixedPlacement, IsBitwiseTheDeviceOptimizer) {
  const Case c = GetParam();
  std::vector<std::string> o = {std::string("parallel.schedule=") + c.schedule, "parallel.pp=2",
                                "memory.optimizer_offload=none", "train.grad_clip=0.05"};
  if (c.bf16) o.push_back("train.precision=bf16");
  if (c.distributed)
    o.insert(o.end(), {"parallel.dp=2", "train.microbatches=4", "parallel.distributed_optimizer=true",
                       "parallel.dp_bucket=4KiB"});
  stp::Config cfg = tiny_config(o);
  cfg.output.dir = fresh_dir("mixed_device");
  const PlacementRun device = train(cfg, nullptr);
  stp::MemoryPlan mixed = stp::make_memory_plan(cfg);
  for (std::size_t r = 0; r < mixed.ranks.size(); ++r) {
    stp::RankPlan& rp = mixed.ranks[r];
    ASSERT_EQ(rp.units.size(), 2u) << "a schedule of two chunks per rank";
    rp.optimizer = {r % 2 ? OptimizerPlacement::Device : OptimizerPlacement::Host,
                    r % 2 ? OptimizerPlacement::Host : OptimizerPlacement::Device};
  }
  mixed.optimizer_offload = true;
  cfg.output.dir = fresh_dir("mixed_host");
  const PlacementRun host = train(cfg, &mixed);
  expect_bitwise(host, device);
  for (std::size_t g = 0; g < host.optimizer_host_bytes.size(); ++g)
    EXPECT_GT(host.optimizer_host_bytes[g], 0u) << "device " << g << " holds no host state";
  EXPECT_GT(host.optimizer_file.size(), 1000u);
}

INSTANTIATE_TEST_SUITE_P(Schedules, MixedPlacement,
                         ::testing::Values(Case{"zb-v", false, false}, Case{"stp", true, false},
                                           Case{"1f1b-i", false, true}, Case{"stp", true, true}),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           std::string s = p.param.schedule;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s + (p.param.bf16 ? "_bf16" : "_f32") + (p.param.distributed ? "_dp2" : "");
                         });

stp::Config tiny_yaml(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), {"output.dir=" + std::string(STP_BINARY_DIR) + "/tests/optimizer_placement_run",
                                       "output.trace=false"});
  return stp::load_config(std::string(STP_SOURCE_DIR) + "/configs/tiny.yaml", overrides);
}

std::size_t max_peak(const stp::MemoryPlan& plan) {
  std::size_t p = 0;
  for (const auto& r : plan.predicted) p = std::max(p, r.peak_device_bytes);
  return p;
}

// configs/tiny.yaml (stp, tp 2, pp 2, two chunks per rank), activation levers off, optimizer auto.
// Measured peaks (`stp plan`): devices 0-1 (pp rank 0) 22,398,464 and 22,398,208 B with every
// optimizer on the device, 20,410,880 and 20,410,624 B with both chunks on the host (TP rank 0's
// norm partials count the replicated gradients too); devices 2-3 (pp rank 1) 22,923,776 B and
// 21,331,456 B. At 22,800,000 B pp rank 1 needs its state moved: the plan puts three of the four
// chunks on the host, a mixed placement placed with room to spare (budgets closer to the
// all-on-host peaks fail the placement check on fragmentation and fall back to every chunk on the
// host). The run peaks as planned and trains bitwise as without a budget.
TEST(AutoOptimizerPlacement, TinyYamlPicksAMixedPlacementAndTrainsAsPlanned) {
  const std::size_t budget = 22800000;
  const stp::Config cfg = tiny_yaml({"memory.offload=none", "memory.recompute=none", "memory.optimizer_offload=auto",
                                     "memory.device_budget=" + std::to_string(budget)});
  const stp::MemoryPlan plan = stp::make_memory_plan(cfg);
  ASSERT_TRUE(plan.feasible) << plan.summary;
  std::size_t host = 0, chunks = 0;
  for (const stp::RankPlan& rp : plan.ranks)
    for (std::size_t ch = 0; ch < rp.units.size(); ++ch, ++chunks)
      host += rp.optimizer_placement(static_cast<int>(ch)) == OptimizerPlacement::Host;
  SCOPED_TRACE(plan.summary);
  EXPECT_GT(host, 0u) << "the budget is under the device placement's minimum";
  EXPECT_LT(host, chunks) << "a partial placement suffices";
  EXPECT_NE(plan.summary.find("optimizer on the host"), std::string::npos);
  EXPECT_LE(max_peak(plan), budget);
  stp::testing::TrainRun r = stp::testing::run_training(cfg, 2);
  stp::testing::expect_memory_as_planned(r, budget);
  stp::testing::TrainRun free = stp::testing::run_training(tiny_yaml({"memory.device_budget=null"}), 2);
  stp::testing::expect_bitwise_equal(r, free);
}

}  // namespace
