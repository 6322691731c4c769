// parallel.distributed_optimizer (ZeRO-1, optim/distributed_optimizer.h) in one process (HostComm):
//   * dp = 2 with it reproduces dp = 2 without it and one replica on the same global batch:
//     losses within 1e-6 relative, parameters as close as plain data parallelism gets, every
//     replica bitwise identical; pipelines with the tied embedding on one rank (zb-v) and on two
//     (1f1b), TP and small buckets (uneven slices) included; without clipping bitwise the plain
//     run, in f32 and bf16;
//   * each rank keeps 1/dp of the AdamW state (rounded up per bucket) and, in bf16, of the GEMM
//     weights' f32 masters, and the planner predicts the smaller peak exactly: measured peak ==
//     predicted peak on every device;
//   * checkpoints do not depend on the layout: taken with it, they resume with it off, at dp = 1
//     and with it on again, and the reverse, with the next loss unchanged; saving one at the exact
//     minimum budget takes no device memory beyond the plan; bf16 checkpoints carry the sharded
//     masters bit for bit;
//   * a chunk's reduce-scatter starts while the rest of the backward runs (the tied chunk after it);
//   * with dp = 1 it is a no-op that says so (Trainer::warnings) and trains bitwise as without it.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "base/trace.h"
#include "memory/block_arena.h"
#include "tests/train/train_fixture.h"
#include "train/memory_planning.h"
#include "train/trainer.h"

namespace {

using stp::testing::tiny_config;

struct DistRun {
  std::vector<double> losses;
  std::map<std::string, stp::HostTensor> params;
  bool replicas_identical = true;
  std::vector<std::size_t> optimizer_bytes, weight_bytes;  // per device, live bytes of the category
};

DistRun train(const std::vector<std::string>& overrides, int dp, int steps = 3) {
  stp::Trainer t(tiny_config(overrides));
  DistRun out;
  for (int i = 0; i < steps; ++i) {
    out.losses.push_back(t.step().loss);
    auto first = t.full_parameters(0);
    for (int d = 1; d < dp; ++d)
      out.replicas_identical = out.replicas_identical && stp::testing::bitwise_equal(t.full_parameters(d), first);
  }
  out.params = t.full_parameters();
  for (const auto& m : t.device_memory()) {
    out.optimizer_bytes.push_back(m.device.by_category[static_cast<std::size_t>(stp::MemoryCategory::OptimizerState)]);
    out.weight_bytes.push_back(m.device.by_category[static_cast<std::size_t>(stp::MemoryCategory::Weights)]);
  }
  return out;
}

struct Layout {
  int dp, pp, tp;
  const char* schedule;
  const char* bucket;
};

void PrintTo(const Layout& l, std::ostream* os) {
  *os << "dp " << l.dp << " pp " << l.pp << " tp " << l.tp << " " << l.schedule << " bucket " << l.bucket;
}

std::vector<std::string> overrides(const Layout& l, bool distributed) {
  return {"parallel.dp=" + std::to_string(l.dp),
          "parallel.pp=" + std::to_string(l.pp),
          "parallel.tp=" + std::to_string(l.tp),
          std::string("parallel.schedule=") + l.schedule,
          "train.microbatches=" + std::to_string(8 / l.dp),
          std::string("parallel.dp_bucket=") + l.bucket,
          std::string("parallel.distributed_optimizer=") + (distributed ? "true" : "false")};
}

class DistributedOptimizer : public ::testing::TestWithParam<Layout> {};

TEST_P(DistributedOptimizer, ReproducesPlainDataParallelismAndOneReplica) {
  const Layout l = GetParam();
  static const DistRun one = train({}, 1);  // one replica, the whole global batch
  DistRun plain = train(overrides(l, false), l.dp), sharded = train(overrides(l, true), l.dp);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(sharded.losses[i], plain.losses[i], 1e-6 * plain.losses[i]) << "step " << i + 1;
    EXPECT_NEAR(sharded.losses[i], one.losses[i], 1e-6 * one.losses[i]) << "step " << i + 1;
  }
  std::string where;
  EXPECT_LT(stp::testing::max_rel_diff(sharded.params, plain.params, &where), 1e-5) << "worst at " << where;
  EXPECT_LT(stp::testing::max_rel_diff(sharded.params, one.params, &where), 1e-5) << "worst at " << where;
  EXPECT_TRUE(sharded.replicas_identical) << "replicas diverged after the all-gather";
  // 1/dp of the state per rank. The weights (f32: one flat buffer per chunk) count the rank's
  // parameters to within the allocator's 256-byte alignment; the sharded state is two flat buffers
  // per chunk of 1/dp of that, rounded up by at most one element per bucket. The unsharded AdamW
  // keeps two per-tensor buffers per parameter (each aligned): twice the weights, and a little more.
  ASSERT_EQ(sharded.optimizer_bytes.size(), plain.optimizer_bytes.size());
  const std::size_t dp = static_cast<std::size_t>(l.dp), slack = 2 * 2 * 256;  // two chunks at most
  for (std::size_t g = 0; g < plain.optimizer_bytes.size(); ++g) {
    const std::size_t whole = 2 * sharded.weight_bytes[g];
    EXPECT_GE(plain.optimizer_bytes[g], whole - slack) << "device " << g;
    EXPECT_GE(sharded.optimizer_bytes[g] + slack, whole / dp) << "device " << g;
    EXPECT_LE(sharded.optimizer_bytes[g], whole / dp + slack + 2 * 4 * 1024) << "device " << g << " (1024 buckets)";
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, DistributedOptimizer,
                         ::testing::Values(Layout{2, 1, 1, "gpipe", "null"}, Layout{2, 2, 1, "1f1b", "null"},
                                           Layout{2, 2, 1, "zb-v", "1000"}, Layout{2, 2, 1, "1f1b-i", "1000"},
                                           Layout{2, 2, 2, "stp", "4MiB"}, Layout{4, 1, 1, "gpipe", "1000"}),
                         [](const ::testing::TestParamInfo<Layout>& p) {
                           return stp::testing::layout_case_name(p) +
                                  (std::string(p.param.bucket) == "null" ? "" : "_buckets");
                         });

// Without clipping and without a tied embedding split over stages nothing but the reduction's
// layout differs, and HostComm's reduce-scatter leaves the all-reduce's rank-order sums: the
// sharded run is bitwise the plain one, in f32 and in bf16 (where the GEMM copies are refreshed
// from the all-gathered f32 parameters). With clipping, the norm's sum of squares is grouped by
// shard; with the tied embedding, its two copies' gradients are summed before the DP reduction
// instead of after; and in bf16 a last-bit change of an f32 weight can flip its bf16 copy's
// rounding. Such runs agree to rounding (f32, the tests above) or to bf16's noise, not bitwise.
TEST(DistributedOptimizer, WithoutClippingBitwiseThePlainRunInF32AndBf16) {
  const Layout l{2, 1, 1, "gpipe", "1000"};
  for (const char* precision : {"f32", "bf16"}) {
    SCOPED_TRACE(precision);
    auto with = [&](bool on) {
      auto o = overrides(l, on);
      o.push_back(std::string("train.precision=") + precision);
      o.push_back("train.grad_clip=0");
      return train(o, l.dp);
    };
    DistRun plain = with(false), sharded = with(true);
    EXPECT_EQ(sharded.losses, plain.losses);
    EXPECT_TRUE(stp::testing::bitwise_equal(sharded.params, plain.params));
    EXPECT_TRUE(sharded.replicas_identical);
  }
}

// Without buckets the state is exactly half per rank at dp = 2 (every chunk has an even size or
// one element more), and the planner's prediction of the smaller peak is exact on every device.
TEST(DistributedOptimizer, PlannerPredictsTheShardedPeakExactly) {
  for (const char* schedule : {"zb-v", "1f1b"}) {
    SCOPED_TRACE(schedule);
    auto cfg = tiny_config({"parallel.dp=2", "parallel.pp=2", "parallel.tp=2", "model.n_layer=4",
                            std::string("parallel.schedule=") + schedule, "train.microbatches=4", "memory.offload=auto",
                            "memory.recompute=auto", "parallel.dp_bucket=null", "parallel.distributed_optimizer=true"});
    stp::testing::TrainRun run = stp::testing::run_training(cfg, 2);
    cfg.parallel.distributed_optimizer = false;
    stp::testing::TrainRun plain = stp::testing::run_training(cfg, 2);
    const std::size_t replica = run.plan.predicted.size();  // pp x tp devices per replica
    ASSERT_EQ(run.peaks.size(), 2 * replica);
    for (std::size_t g = 0; g < run.peaks.size(); ++g) {
      EXPECT_EQ(run.peaks[g], run.plan.predicted[g % replica].peak_device_bytes) << "device " << g;
      EXPECT_LT(run.plan.predicted[g % replica].peak_device_bytes, plain.plan.predicted[g % replica].peak_device_bytes)
          << "device " << g << ": sharding saved nothing";
    }
  }
}

// bf16: the GEMM weights' f32 masters are sharded too (each rank keeps the masters of the parts it
// owns; the bf16 copies are all-gathered). On pp 2 (every copied weight has no other f32 master on
// its device) the device's weights shrink by (1 - 1/dp) of those masters: 4 B per copied element
// times 1/2 at dp 2, i.e. exactly the copies' own bytes (2 B per element) up to the allocator's
// alignment; the planner's dry run predicts the peak of that layout to the byte; and with the
// optimizer offloaded the owned masters leave the device too, shown by `stp plan` as host weights.
TEST(DistributedOptimizer, Bf16MastersAreShardedAndThePeakIsPredicted) {
  struct Run {
    std::vector<std::size_t> weights, host_weights;
  };
  auto run = [](const char* precision, bool on, const char* optimizer_offload = "none") {
    auto cfg = tiny_config({"parallel.dp=2", "parallel.pp=2", "parallel.schedule=zb-v", "train.microbatches=4",
                            "parallel.dp_bucket=null", "memory.offload=auto", "memory.recompute=auto",
                            std::string("memory.optimizer_offload=") + optimizer_offload,
                            std::string("train.precision=") + precision,
                            std::string("parallel.distributed_optimizer=") + (on ? "true" : "false")});
    stp::Trainer t(cfg);
    t.step();
    t.step();
    Run out;
    const auto& predicted = t.memory_plan().predicted;
    const auto memory = t.device_memory();
    for (std::size_t g = 0; g < memory.size(); ++g) {
      const stp::RankPrediction& p = predicted[g % predicted.size()];
      out.weights.push_back(memory[g].device.by_category[static_cast<std::size_t>(stp::MemoryCategory::Weights)]);
      out.host_weights.push_back(p.host_states.weights);
      EXPECT_EQ(memory[g].device.peak_allocated, p.peak_device_bytes)
          << precision << (on ? " sharded" : " plain") << ", device " << g;
      EXPECT_EQ(memory[g].host_master_bytes, p.host_master_bytes) << "device " << g;
    }
    return out;
  };
  const Run f32 = run("f32", true), plain = run("bf16", false), sharded = run("bf16", true),
            offloaded = run("bf16", true, "all");
  ASSERT_EQ(sharded.weights.size(), 4u);
  const std::size_t slack = 2 * 3 * 256;  // two chunks, three aligned weight buffers each
  for (std::size_t g = 0; g < sharded.weights.size(); ++g) {
    const std::size_t copies = plain.weights[g] - f32.weights[g];  // the bf16 copies: 2 B per copied element
    ASSERT_GT(copies, 20 * slack) << "device " << g;
    const std::size_t saved = plain.weights[g] - sharded.weights[g];  // (4 B - 4 B / 2) per copied element
    EXPECT_LE(saved, copies + slack) << "device " << g;
    EXPECT_GE(saved + slack, copies) << "device " << g;
    // Offloaded: the owned masters (half the copied elements, 4 B each: the copies' bytes again)
    // are pinned host memory, reported as host weights, and off the device.
    EXPECT_EQ(sharded.host_weights[g], 0u) << "device " << g;
    EXPECT_LE(offloaded.host_weights[g] + offloaded.weights[g], sharded.weights[g] + slack) << "device " << g;
    EXPECT_GE(offloaded.host_weights[g] + offloaded.weights[g] + slack, sharded.weights[g]) << "device " << g;
    EXPECT_LE(offloaded.host_weights[g], copies + slack) << "device " << g;
    EXPECT_GE(offloaded.host_weights[g] + slack, copies) << "device " << g;
  }
}

// The checkpoint tests' job: dp ranks (8 / dp microbatches each) on pp 2 under zb-v, buckets of
// 1000, the overrides `more`, and the distributed optimizer on or off.
std::vector<std::string> resume_job(int dp, bool on, const std::vector<std::string>& more = {}) {
  std::vector<std::string> out = {"parallel.dp=" + std::to_string(dp), "parallel.pp=2", "parallel.schedule=zb-v",
                                  "train.microbatches=" + std::to_string(8 / dp), "parallel.dp_bucket=1000"};
  out.insert(out.end(), more.begin(), more.end());
  out.push_back(std::string("parallel.distributed_optimizer=") + (on ? "true" : "false"));
  return out;
}

// A run of `overrides` checkpointed into a fresh `dir` after two steps, and what it did next.
struct SavedRun {
  std::string checkpoint;
  std::map<std::string, stp::HostTensor> saved;  // the full parameters at the checkpoint (with_saved)
  std::vector<double> next;                      // the losses of the two steps after it
  std::map<std::string, stp::HostTensor> after;  // the full parameters after those
};

SavedRun save_after_two_steps(const std::vector<std::string>& overrides, const std::filesystem::path& dir,
                              bool with_saved) {
  std::filesystem::remove_all(dir);
  auto cfg = tiny_config(overrides);
  cfg.output.dir = dir.string();
  stp::Trainer t(cfg);
  t.step();
  t.step();
  SavedRun out;
  if (with_saved) out.saved = t.full_parameters();
  out.checkpoint = t.save_checkpoint();
  out.next.push_back(t.step().loss);
  out.next.push_back(t.step().loss);
  out.after = t.full_parameters();
  return out;
}

// bf16 checkpoints carry the sharded masters exactly: taken with the distributed optimizer, they
// load with it (the next steps bitwise the uninterrupted run's) and without it (the parameters
// bitwise the saved ones, the next loss the same), and the reverse.
TEST(DistributedOptimizer, Bf16CheckpointsCarryTheShardedMastersExactly) {
  auto dir = std::filesystem::path(STP_BINARY_DIR) / "tests" / "distopt_bf16_resume";
  auto base = [](int dp, bool on) { return resume_job(dp, on, {"train.precision=bf16"}); };
  for (bool saved_on : {true, false}) {
    SCOPED_TRACE(saved_on ? "saved with it on" : "saved with it off");
    const SavedRun run = save_after_two_steps(base(2, saved_on), dir, /*with_saved=*/true);
    std::vector<std::pair<int, bool>> resumes = {{2, !saved_on}, {1, false}};
    if (saved_on) resumes.emplace_back(2, true);
    for (auto [dp, on] : resumes) {
      SCOPED_TRACE("resumed at dp " + std::to_string(dp) + (on ? " with it on" : " with it off"));
      auto cfg = tiny_config(base(dp, on));
      cfg.train.resume = run.checkpoint;
      stp::Trainer t(cfg);
      EXPECT_TRUE(stp::testing::bitwise_equal(t.full_parameters(), run.saved)) << "the masters did not round-trip";
      EXPECT_EQ(t.step().loss, run.next[0]) << "same parameters, same global batch, same forward";
      if (dp == 2 && on == saved_on) {  // the same arithmetic as the uninterrupted run
        EXPECT_EQ(t.step().loss, run.next[1]);
        EXPECT_TRUE(stp::testing::bitwise_equal(t.full_parameters(), run.after));
      }
    }
  }
}

// A checkpoint taken under one layout / setting resumes under the others with the same next loss.
TEST(DistributedOptimizer, CheckpointsDoNotDependOnTheLayout) {
  auto dir = std::filesystem::path(STP_BINARY_DIR) / "tests" / "distopt_resume";
  for (bool saved_on : {true, false}) {
    SCOPED_TRACE(saved_on ? "saved with it on" : "saved with it off");
    const SavedRun run = save_after_two_steps(resume_job(2, saved_on), dir, /*with_saved=*/false);
    for (auto [dp, on] : {std::pair{2, true}, std::pair{2, false}, std::pair{1, false}, std::pair{1, true}}) {
      SCOPED_TRACE("resumed at dp " + std::to_string(dp) + (on ? " with it on" : " with it off"));
      auto cfg = tiny_config(resume_job(dp, on));
      cfg.train.resume = run.checkpoint;
      stp::Trainer t(cfg);
      ASSERT_EQ(t.steps_done(), 2);
      EXPECT_EQ(t.step().loss, run.next[0]) << "same parameters, same global batch, same forward";
      // The second loss depends on the resumed moments: wrong moments move it far beyond rounding.
      EXPECT_NEAR(t.step().loss, run.next[1], 1e-6 * run.next[1]);
      std::string where;
      EXPECT_LT(stp::testing::max_rel_diff(t.full_parameters(), run.after, &where), 1e-5) << "worst at " << where;
    }
  }
}

// Saving a checkpoint gathers the owned moments one moment at a time into the chunks' gradient
// buffers (DistributedOptimizer::full_moments), so it needs no device memory of its own: at the exact
// minimum budget (every activation lever on, where temporaries holding the full moments would not
// fit next to the model states) the save succeeds, the device peak is still the planned one, and
// the checkpoint resumes.
TEST(DistributedOptimizer, CheckpointAtTheMinimumBudgetStaysWithinThePlan) {
  auto dir = std::filesystem::path(STP_BINARY_DIR) / "tests" / "distopt_min_budget";
  std::filesystem::remove_all(dir);
  std::vector<std::string> o = {"parallel.dp=2", "parallel.pp=2", "parallel.tp=2", "model.n_embd=64",
                                "parallel.schedule=zb-v", "train.microbatches=4", "parallel.dp_bucket=null",
                                "parallel.distributed_optimizer=true",
                                // small activations: the model states are most of the peak
                                "train.micro_batch_size=1", "output.dir=" + dir.string()};
  auto with_budget = [&](const std::string& budget) {
    auto v = o;
    v.push_back("memory.device_budget=" + budget);
    return tiny_config(v);
  };
  const std::size_t minimum = stp::make_memory_plan(with_budget("1MiB"), /*exact_minimum=*/true).min_device_budget;
  stp::Trainer t(with_budget(std::to_string(minimum)));
  t.step();
  t.step();
  const std::string ckpt = t.save_checkpoint();
  const auto& predicted = t.memory_plan().predicted;
  const auto memory = t.device_memory();  // the peaks since the second step began, the save included
  for (std::size_t g = 0; g < memory.size(); ++g)
    EXPECT_EQ(memory[g].device.peak_allocated, predicted[g % predicted.size()].peak_device_bytes) << "device " << g;
  const double next = t.step().loss;
  auto cfg = with_budget(std::to_string(minimum));
  cfg.train.resume = ckpt;
  stp::Trainer resumed(cfg);
  EXPECT_EQ(resumed.step().loss, next);
}

// The reduce-scatter rides the DP all-reduce's hook: on 1f1b-i's pp rank 0, chunk 1 (stage 2)
// is final first and is reduce-scattered while chunk 0's backward still runs (chunk 0 holds the
// tied wte and waits for the end). The TP link is slowed so the remaining backward is long.
TEST(DistributedOptimizer, ReduceScatterOverlapsTheRemainingBackward) {
  stp::Trainer t(tiny_config({"parallel.dp=2", "parallel.pp=2", "parallel.tp=2", "parallel.schedule=1f1b-i",
                              "train.microbatches=4", "parallel.dp_bucket=null", "output.trace=true",
                              "parallel.tp_link_bandwidth=1MB/s", "parallel.distributed_optimizer=true"}));
  t.step();
  int checked = 0;
  for (int g = 0; g < t.world_size(); ++g) {
    if (g / 2 % 2 != 0) continue;  // pp rank 0 (global = (dp · pp + pp_rank) · tp + tp_rank)
    double last_op_end = 0, rs_chunk1 = -1, rs_chunk0 = -1;
    for (const auto& s : t.trace()->spans()) {
      if (s.pid != g) continue;
      if (s.tid == "compute" && s.category == "op") last_op_end = std::max(last_op_end, s.ts_us + s.dur_us);
      if (s.tid == "dp-comm" && s.name == "RS dp chunk 1 bucket 0") rs_chunk1 = s.ts_us;
      if (s.tid == "dp-comm" && s.name == "RS dp chunk 0 bucket 0") rs_chunk0 = s.ts_us;
    }
    ASSERT_GE(rs_chunk1, 0) << "rank " << g << " traced no reduce-scatter of chunk 1";
    ASSERT_GE(rs_chunk0, 0) << "rank " << g << " traced no reduce-scatter of chunk 0";
    EXPECT_LT(rs_chunk1, last_op_end) << "rank " << g << ": chunk 1 waited for the whole backward";
    EXPECT_GE(rs_chunk0, last_op_end) << "rank " << g << ": the tied chunk went before the tied-gradient sum";
    ++checked;
  }
  EXPECT_EQ(checked, 4);
}

TEST(DistributedOptimizer, WithOneReplicaIsANoOpThatSaysSo) {
  stp::Trainer on(tiny_config({"parallel.distributed_optimizer=true"}));
  ASSERT_EQ(on.warnings().size(), 1u);
  EXPECT_NE(on.warnings()[0].find("parallel.dp = 1"), std::string::npos) << on.warnings()[0];
  stp::Trainer off(tiny_config({}));
  EXPECT_TRUE(off.warnings().empty());
  for (int i = 0; i < 2; ++i) EXPECT_EQ(on.step().loss, off.step().loss) << "step " << i + 1;
  EXPECT_TRUE(stp::testing::bitwise_equal(on.full_parameters(), off.full_parameters()));
}

}  // namespace
