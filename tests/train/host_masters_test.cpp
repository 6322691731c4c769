// Host masters (optim/host_update.h, ParamInfo::host_master) on the CPU backend: with
// memory.optimizer_offload at train.precision bf16 and no distributed optimizer, the f32 masters
// of the parameters with a bf16 GEMM copy (all but the first stage's embedding table, whose
// master the embedding gather reads) live in pinned host memory:
//   * the device's weight bytes drop by exactly those masters (the flat parameter buffer of each
//     chunk shrinks; the arena rounds each block up to 256 bytes), the peak by them plus the
//     device optimizer state, and the measured peak equals the plan's prediction, which counts
//     them as host weights;
//   * a checkpoint taken with the optimizer on the host resumes with it on the device bitwise as
//     the uninterrupted run, and the reverse;
//   * a skipped step (planted NaN) leaves the parameters, the bf16 copies the next step reads and
//     the moments as they were;
//   * with data parallelism (no distributed optimizer), and for llama (untied head; tied embedding
//     in one stage), losses, parameters and moments are bitwise the device optimizer's.
// (Losses, parameters and checkpoints bitwise those of the device optimizer, per schedule:
// tests/train/optimizer_offload_test.cpp.)
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/cpu/cpu_device.h"
#include "memory/block_arena.h"
#include "models/registry.h"
#include "schedule/schedule.h"
#include "tests/support/run_command.h"
#include "tests/train/train_fixture.h"
#include "train/memory_planning.h"
#include "train/stage_layout.h"
#include "train/trainer.h"

namespace {

using stp::testing::fresh_dir;
using stp::testing::tiny_config;

std::size_t aligned(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

std::size_t category(const stp::Trainer::DeviceMemory& m, stp::MemoryCategory c) {
  return m.device.by_category[static_cast<std::size_t>(c)];
}

struct Masters {
  std::size_t device_freed = 0;  // per chunk, the flat f32 parameter buffer with them less without
  std::size_t host = 0;          // their bytes
};

// Per device (pp rank r, tp rank t: device r * tp + t), from the parameter table of stages built
// on a dry device.
std::vector<Masters> expected_masters(const stp::Config& cfg) {
  const stp::sched::Schedule schedule =
      stp::sched::generate(cfg.parallel.schedule, cfg.parallel.pp, cfg.train.microbatches);
  stp::CpuDeviceOptions dry;
  dry.dry_run = true;
  stp::CpuDevice device(0, dry);
  stp::DeviceAllocator alloc(device);
  std::vector<Masters> out;
  for (int r = 0; r < cfg.parallel.pp; ++r)
    for (int t = 0; t < cfg.parallel.tp; ++t) {
      Masters m;
      for (int ch = 0; ch < schedule.chunks; ++ch) {
        auto stage = stp::make_stage(stp::model_spec_of(cfg), stp::stage_spec_of(cfg, schedule, r, ch, t), alloc);
        std::size_t all = 0, moved = 0;
        for (const stp::ParamInfo& p : stage->params()) {
          all += p.param.bytes();
          if (p.compute.dtype() == stp::DType::Bf16 && !(stage->is_first() && p.name == "wte.weight"))
            moved += p.param.bytes();
        }
        EXPECT_GT(moved, 0u) << "pp rank " << r << " chunk " << ch;
        m.device_freed += aligned(all) - aligned(all - moved);
        m.host += moved;
      }
      out.push_back(m);
    }
  return out;
}

struct Memory {
  std::vector<std::size_t> peak, weights, optimizer_device, host_weights;  // host_weights: the plan's
};

Memory measure(const std::vector<std::string>& overrides, bool offload) {
  std::vector<std::string> o = overrides;
  o.push_back(std::string("memory.optimizer_offload=") + (offload ? "all" : "none"));
  stp::Config cfg = tiny_config(o);
  cfg.output.dir = fresh_dir("host_masters_memory");
  stp::Trainer t(cfg);
  EXPECT_EQ(t.memory_plan().optimizer_offload, offload);
  stp::StepResult r = t.step();
  r = t.step();
  const auto mem = t.device_memory();
  Memory out;
  for (std::size_t g = 0; g < r.peak_device_bytes.size(); ++g) {
    const stp::RankPrediction& p = t.memory_plan().predicted.at(g);
    EXPECT_EQ(r.peak_device_bytes[g], p.peak_device_bytes) << "device " << g;
    EXPECT_EQ(category(mem[g], stp::MemoryCategory::Weights), p.weight_bytes) << "device " << g;
    EXPECT_EQ(mem[g].optimizer_host_bytes, p.optimizer_host_bytes) << "device " << g;
    out.peak.push_back(r.peak_device_bytes[g]);
    out.weights.push_back(category(mem[g], stp::MemoryCategory::Weights));
    out.optimizer_device.push_back(category(mem[g], stp::MemoryCategory::OptimizerState));
    out.host_weights.push_back(p.host_states.weights);
  }
  return out;
}

TEST(HostMasters, DevicePeakDropsByTheMastersAndEqualsThePlan) {
  for (const char* schedule : {"stp", "zb-v"}) {
    SCOPED_TRACE(schedule);
    const std::vector<std::string> base = {std::string("parallel.schedule=") + schedule, "parallel.pp=2",
                                           "parallel.tp=2", "train.precision=bf16"};
    const std::vector<Masters> masters = expected_masters(tiny_config(base));
    const Memory none = measure(base, false), all = measure(base, true);
    ASSERT_EQ(none.peak.size(), masters.size());
    ASSERT_EQ(all.peak.size(), masters.size());
    for (std::size_t g = 0; g < masters.size(); ++g) {
      EXPECT_GT(none.optimizer_device[g], 0u) << "device " << g;
      EXPECT_EQ(all.optimizer_device[g], 0u) << "device " << g;
      EXPECT_EQ(none.weights[g] - all.weights[g], masters[g].device_freed) << "device " << g;
      EXPECT_EQ(none.peak[g] - all.peak[g], none.optimizer_device[g] + masters[g].device_freed) << "device " << g;
      EXPECT_EQ(none.host_weights[g], 0u) << "device " << g;
      EXPECT_EQ(all.host_weights[g], masters[g].host) << "device " << g;
    }
  }
}

using stp::testing::CheckpointedRun;
using stp::testing::expect_bitwise_equal;
using stp::testing::train_and_checkpoint;

// 2 steps with the optimizer on the host (device), a checkpoint, 2 more with it on the device
// (host) equal the uninterrupted 4 steps bitwise.
TEST(HostMasters, CheckpointsCrossTheSettingBothWays) {
  stp::testing::expect_resume_crosses_the_setting(
      [](bool on) {
        return std::vector<std::string>{"parallel.schedule=zb-v", "parallel.pp=2", "train.precision=bf16",
                                        std::string("memory.optimizer_offload=") + (on ? "all" : "none")};
      },
      "host_masters_resume");
}

// Step 2 of 3 is skipped (a NaN gradient): with the optimizer and the masters on the host, every
// loss, the parameters and the moments after step 3 equal the device optimizer's, whose step 2 is
// skipped alike (the step after a skip rounds the copies from the host masters: no upload came).
TEST(HostMasters, SkippedStepMatchesTheDeviceOptimizer) {
  auto run = [](bool on) {
    stp::testing::NanGradHook hook(0, 2);
    stp::Config cfg = tiny_config({"parallel.schedule=stp", "parallel.pp=2", "train.precision=bf16",
                                   std::string("memory.optimizer_offload=") + (on ? "all" : "none")});
    cfg.output.dir = fresh_dir(on ? "host_masters_skip_on" : "host_masters_skip_off");
    stp::Trainer t(cfg);
    CheckpointedRun out;
    for (int i = 0; i < 3; ++i) {
      stp::StepResult r = t.step();
      EXPECT_EQ(r.skipped, i == 1) << "step " << i + 1;
      out.losses.push_back(r.loss);
    }
    out.params = t.full_parameters();
    std::filesystem::path ck = t.save_checkpoint();
    out.optimizer_file = stp::testing::slurp((ck / "optimizer.safetensors").string());
    return out;
  };
  expect_bitwise_equal(run(true), run(false));
}

// Llama: the untied LM head's master moves (pp 2, tp 2, vocab-parallel); with one stage the tied
// embedding has a bf16 copy (the head) but keeps its master on the device (the gather reads it).
// Bitwise the device optimizer either way.
TEST(HostMasters, LlamaIsBitwiseTheDeviceOptimizer) {
  const std::vector<std::vector<std::string>> layouts = {
      {"model.tie_embeddings=false", "parallel.pp=2", "parallel.tp=2", "parallel.schedule=stp"},
      {"model.tie_embeddings=true", "parallel.pp=1", "parallel.schedule=gpipe"}};
  for (const auto& layout : layouts) {
    SCOPED_TRACE(layout[0]);
    auto overrides = [&](bool on) {
      std::vector<std::string> o = {
          "model.arch=llama", "model.n_kv_head=2",    "model.intermediate_size=64",
          "model.n_layer=4",  "train.precision=bf16", std::string("memory.optimizer_offload=") + (on ? "all" : "none")};
      o.insert(o.end(), layout.begin(), layout.end());
      return o;
    };
    expect_bitwise_equal(train_and_checkpoint(overrides(true), "host_masters_llama_on", 2),
                         train_and_checkpoint(overrides(false), "host_masters_llama_off", 2));
  }
}

// Data parallelism without the distributed optimizer: the gradients are all-reduced on the device,
// then each replica updates its own host masters; bitwise the device optimizer.
TEST(HostMasters, DataParallelIsBitwiseTheDeviceOptimizer) {
  auto overrides = [](bool on) {
    return std::vector<std::string>{"parallel.schedule=zb-v",
                                    "parallel.pp=2",
                                    "parallel.dp=2",
                                    "train.microbatches=4",
                                    "train.precision=bf16",
                                    "train.grad_clip=0.05",
                                    std::string("memory.optimizer_offload=") + (on ? "all" : "none")};
  };
  expect_bitwise_equal(train_and_checkpoint(overrides(true), "host_masters_dp_on", 2),
                       train_and_checkpoint(overrides(false), "host_masters_dp_off", 2));
}

}  // namespace
