// The optimizer seam (optim/rank_optimizer.h) on the CPU backend:
//   * make_rank_optimizer picks the mechanism from the placement and the data-parallel settings
//     alone, and each says where the stages keep their masters and which executor hooks it needs;
//   * through the interface, a step with some chunks' state offloaded to the CPU leaves exactly
//     the parameters, moments and clip coefficient of the step with every chunk on the device.
// The mechanisms' behaviour in training (every schedule, dp, bf16, checkpoints) is tested through
// the trainer in tests/train/ (data_parallel, distributed_optimizer, optimizer_offload, ...).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/backend.h"
#include "core/cpu/cpu_device.h"
#include "core/cpu/cpu_stream.h"
#include "core/tensor.h"
#include "models/registry.h"
#include "optim/distributed_optimizer.h"
#include "optim/offloaded_optimizer.h"
#include "optim/rank_optimizer.h"
#include "optim/replicated_optimizer.h"

namespace {

using stp::OptimizerPlacement;

// One CPU device and its compute stream; options for two local chunks.
struct Rig {
  stp::CpuDevice dev{0, {}};
  std::unique_ptr<stp::Stream> compute = dev.create_stream("compute");
  stp::DeviceAllocator alloc{dev};

  stp::RankOptimizerOptions options(std::vector<OptimizerPlacement> placement) {
    stp::RankOptimizerOptions o;
    o.device = &dev;
    o.compute = compute.get();
    o.alloc = &alloc;
    o.hyper = stp::AdamWHyper{0.9f, 0.95f, 1e-8f, 0.1f};
    o.placement = std::move(placement);
    return o;
  }
};

template <typename T>
bool is(const stp::RankOptimizer& o) {
  return dynamic_cast<const T*>(&o) != nullptr;
}

TEST(RankOptimizer, TheFactoryChoosesFromPlacementAndDataParallelism) {
  Rig rig;
  const std::vector<OptimizerPlacement> device(2, OptimizerPlacement::Device);
  const std::vector<OptimizerPlacement> mixed = {OptimizerPlacement::Host, OptimizerPlacement::Device};

  auto o = rig.options(device);
  auto replicated = stp::make_rank_optimizer(o);
  EXPECT_TRUE(is<stp::ReplicatedOptimizer>(*replicated) && !is<stp::OffloadedOptimizer>(*replicated));
  EXPECT_EQ(replicated->masters(0).host, nullptr);
  EXPECT_FALSE(replicated->masters(0).sharded);
  EXPECT_FALSE(replicated->hooks().grads_final);  // one replica, nothing to reduce or download early
  EXPECT_FALSE(replicated->hooks().params_needed);
  EXPECT_TRUE(replicated->streams(false).empty());

  o.distributed = true;  // with dp = 1 there is nothing to shard over: still replicated
  EXPECT_TRUE(is<stp::ReplicatedOptimizer>(*stp::make_rank_optimizer(o)));

  o = rig.options(mixed);
  o.host_masters = true;
  auto offloaded = stp::make_rank_optimizer(o);
  ASSERT_TRUE(is<stp::OffloadedOptimizer>(*offloaded));
  EXPECT_NE(offloaded->masters(0).host, nullptr);  // the host chunk's masters go with its state
  EXPECT_EQ(offloaded->masters(1).host, nullptr);
  EXPECT_TRUE(offloaded->hooks().grads_final);  // early downloads
  EXPECT_TRUE(offloaded->hooks().params_needed);
  EXPECT_EQ(offloaded->streams(false).size(), 3u);  // the CPU update's d2h, cpu and h2d
  EXPECT_EQ(offloaded->streams(true).size(), 1u);   // the updates and uploads stay in flight
  o.host_masters = false;
  EXPECT_EQ(stp::make_rank_optimizer(o)->masters(0).host, nullptr);

  o = rig.options(device);
  o.distributed = true;
  o.dp = 2;  // a dry run of replica 0 of two: no communicator
  o.bf16 = true;
  auto distributed = stp::make_rank_optimizer(o);
  ASSERT_TRUE(is<stp::DistributedOptimizer>(*distributed));
  EXPECT_TRUE(distributed->masters(1).sharded);
  EXPECT_EQ(distributed->masters(1).host, nullptr);
  EXPECT_FALSE(distributed->hooks().grads_final);  // nothing to reduce-scatter without peers
  EXPECT_TRUE(distributed->hooks().params_needed);
  o.bf16 = false;
  o.placement = mixed;
  auto distributed_host = stp::make_rank_optimizer(o);
  ASSERT_TRUE(is<stp::DistributedOptimizer>(*distributed_host));
  EXPECT_FALSE(distributed_host->masters(0).sharded);
  EXPECT_EQ(distributed_host->streams(false).size(), 3u);
}

// Two chunks of a small GPT-2 on one device, their parameters drawn from one seed.
struct Model {
  std::vector<std::unique_ptr<stp::Stage>> stages;
  std::vector<stp::Stage*> ptrs;

  Model(Rig& rig, stp::Allocator* host_masters = nullptr) {
    stp::ModelSpec m;
    m.n_layer = 2;
    for (int c = 0; c < 2; ++c) {
      stp::StageSpec s;
      s.layer_begin = c;
      s.layer_end = c + 1;
      s.micro_batch_size = 2;
      if (c == 0) s.host_masters = host_masters;
      stages.push_back(stp::make_stage(m, s, rig.alloc));
      stages.back()->init_random(7, *rig.compute);
      ptrs.push_back(stages.back().get());
    }
  }
};

// Every float of every tensor, in order.
std::vector<float> values(const std::vector<stp::Tensor>& ts, stp::Stream& s) {
  std::vector<float> out;
  for (const stp::Tensor& t : ts) {
    std::vector<float> v = stp::download(t, s);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

struct StepResult {
  std::vector<float> params, exp_avg, exp_avg_sq;
  float coef = 0;
};

// Two steps through the interface with the same gradients every time: clipped (the norm is
// above 0.5) and updated.
StepResult two_steps(std::vector<OptimizerPlacement> placement) {
  Rig rig;
  Model model(rig);
  auto opt = stp::make_rank_optimizer(rig.options(std::move(placement)));
  opt->attach(model.ptrs);
  auto replica = stp::make_self_comm();
  const stp::OptimizerHooks hooks = opt->hooks();
  StepResult r;
  for (int step = 1; step <= 2; ++step) {
    opt->begin_step(1e-3f);
    for (int c = 0; c < 2; ++c) {
      if (hooks.params_needed) hooks.params_needed(c);
      stp::Tensor g = model.stages[static_cast<std::size_t>(c)]->flat_grads();
      std::vector<float> host(static_cast<std::size_t>(g.numel()));
      for (std::size_t i = 0; i < host.size(); ++i) host[i] = 0.01f * static_cast<float>((i * 37 + c) % 101) - 0.5f;
      rig.compute->copy(g.raw(), host.data(), g.bytes());
      rig.compute->synchronize();
      if (hooks.grads_final) hooks.grads_final(c);
    }
    opt->finish_gradients([] {});
    opt->grad_sumsq(*replica);
    opt->clip(0.5f);
    rig.compute->copy(&r.coef, opt->clip_coef(), sizeof(float));
    opt->step(1e-2f);
    rig.compute->synchronize();
  }
  opt->settle();
  EXPECT_EQ(opt->step_count(), 2);
  r.params = values(opt->full_parameters(), *rig.compute);
  r.exp_avg = values(opt->full_moments(0), *rig.compute);
  r.exp_avg_sq = values(opt->full_moments(1), *rig.compute);
  return r;
}

TEST(RankOptimizer, AnOffloadedStepIsBitwiseTheDeviceStep) {
  const StepResult device = two_steps({OptimizerPlacement::Device, OptimizerPlacement::Device});
  const StepResult mixed = two_steps({OptimizerPlacement::Host, OptimizerPlacement::Device});
  const StepResult host = two_steps({OptimizerPlacement::Host, OptimizerPlacement::Host});
  EXPECT_LT(device.coef, 1.0f);  // the clip scaled the gradients
  for (const StepResult* other : {&mixed, &host}) {
    EXPECT_EQ(other->coef, device.coef);
    EXPECT_EQ(other->params, device.params);
    EXPECT_EQ(other->exp_avg, device.exp_avg);
    EXPECT_EQ(other->exp_avg_sq, device.exp_avg_sq);
  }
  EXPECT_NE(device.exp_avg_sq, std::vector<float>(device.exp_avg_sq.size(), 0.0f));
}

// The fused pass: the compute stream's operations for the norm, the clip and the update are a
// few per chunk, not a few per parameter. Four layers in two chunks: 2 + 12 * 2 + 2 = 28
// parameters in two flat runs.
TEST(RankOptimizer, AClippedUpdateTakesAFewLaunchesPerChunk) {
  Rig rig;
  stp::ModelSpec m;
  m.n_layer = 4;
  std::vector<std::unique_ptr<stp::Stage>> stages;
  std::vector<stp::Stage*> ptrs;
  for (int c = 0; c < 2; ++c) {
    stp::StageSpec s;
    s.layer_begin = 2 * c;
    s.layer_end = 2 * c + 2;
    s.micro_batch_size = 1;
    stages.push_back(stp::make_stage(m, s, rig.alloc));
    stages.back()->init_random(7, *rig.compute);
    ptrs.push_back(stages.back().get());
  }
  auto opt = stp::make_rank_optimizer(rig.options({OptimizerPlacement::Device, OptimizerPlacement::Device}));
  opt->attach(ptrs);
  ASSERT_GE(opt->params().size(), 28u);
  auto replica = stp::make_self_comm();
  opt->begin_step(1e-3f);
  rig.compute->synchronize();
  const stp::Device& device = rig.compute->device();
  const std::uint64_t before = device.launch_count();
  opt->grad_sumsq(*replica);
  const std::uint64_t after_norm = device.launch_count();
  opt->clip(1.0f);
  const std::uint64_t after_clip = device.launch_count();
  opt->step(1e-3f);
  const std::uint64_t after_step = device.launch_count();
  rig.compute->synchronize();
  // The norm: a zero, then per chunk the block sums and their fixed-order sum (the self
  // communicator adds nothing).
  EXPECT_LE(after_norm - before, 1u + 2u * 2u + 1u);
  EXPECT_EQ(after_clip - after_norm, 1u);  // the coefficient; the gradients are scaled as read
  EXPECT_EQ(after_step - after_clip, 2u);  // one fused AdamW per chunk
  const auto* replicated = dynamic_cast<const stp::ReplicatedOptimizer*>(opt.get());
  ASSERT_NE(replicated, nullptr);
  EXPECT_EQ(replicated->update_launches(), 1u + 2u * 2u + 1u + 2u);
}

}  // namespace
