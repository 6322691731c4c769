// The checkpoint save streams the state tensor by tensor (train/trainer_checkpoint.cpp): its files
// are byte for byte those of the state gathered whole and written at once (what the save did
// before: every tensor of the parameters and both moments on process 0, converted to HF names and
// layouts, write_checkpoint), for every mechanism that holds the state and every split of it;
// and the pageable memory it holds at once is exactly train/host_needs.h's prediction. Loading
// it back streams as well: bitwise, at the predicted peak.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "config/hf_config.h"
#include "formats/checkpoint.h"
#include "models/hf_names.h"
#include "tests/support/files.h"
#include "tests/train/train_fixture.h"
#include "train/hf_convert.h"
#include "train/host_needs.h"
#include "train/stage_layout.h"
#include "train/trainer.h"

namespace {

namespace fs = std::filesystem;
using stp::testing::fresh_dir;
using stp::testing::kLlama;
using stp::testing::tiny_config;
using stp::testing::with;

std::map<std::string, std::string> folder_bytes(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    out[e.path().filename().string()] = stp::testing::read_bytes(e.path().string());
  return out;
}

// The checkpoint of `t`'s state as the save wrote it before it streamed: the whole state gathered,
// converted and written at once; the rest (state.json, config.json) as `streamed` holds it.
std::string whole_state_checkpoint(stp::Trainer& t, const stp::Config& cfg, const std::string& streamed,
                                   const std::string& dir) {
  const auto rules = stp::hf_tensor_rules(stp::model_spec_of(cfg));
  const auto model = stp::to_hf(rules, t.full_parameters());
  const auto exp_avg = stp::to_hf(rules, t.full_moments(0));
  const auto exp_avg_sq = stp::to_hf(rules, t.full_moments(1));
  stp::CheckpointData data;
  data.hf_config = stp::hf_config_json(cfg);
  for (const auto& [name, tensor] : model) {
    data.model.emplace_back(name, &tensor);
    data.optimizer.emplace_back(name, stp::OptimizerMoments{&exp_avg.at(name), &exp_avg_sq.at(name)});
  }
  const auto opt = stp::read_safetensors_file(streamed + "/optimizer.safetensors");
  data.optimizer_step = std::stoll(opt.metadata.at("step"));
  data.state = stp::read_checkpoint_state(streamed);
  return stp::write_checkpoint(dir, data);
}

class StreamedSave : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(StreamedSave, IsByteForByteTheWholeStatesCheckpointAndHoldsThePredictedPeak) {
  stp::Config cfg = tiny_config(GetParam());
  cfg.output.dir = fresh_dir("stream");
  stp::Trainer t(cfg);
  t.step();
  t.step();
  const stp::CheckpointSave s = t.try_save_checkpoint("streamed");
  ASSERT_TRUE(s.written) << s.problem;
  EXPECT_EQ(s.pageable_peak_bytes, stp::pageable_host_bytes(cfg).checkpoint_save);
  EXPECT_LT(s.pageable_peak_bytes, 4 * sizeof(float) * static_cast<std::size_t>(stp::full_parameter_count(cfg)))
      << "less than the whole state";
  const std::string whole = whole_state_checkpoint(t, cfg, s.path, fresh_dir("whole"));
  const auto want = folder_bytes(whole);
  const auto got = folder_bytes(s.path);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, bytes] : want) EXPECT_TRUE(got.at(name) == bytes) << name << " differs";
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(cfg.output.dir)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{fs::path(s.path).filename().string()}) << "no temporary is left";
}

const std::vector<std::vector<std::string>> kCases = {
    {},
    {"parallel.tp=2", "parallel.pp=2", "parallel.schedule=stp"},
    {"parallel.tp=2", "parallel.pp=2", "parallel.schedule=stp", "memory.optimizer_offload=all"},
    {"parallel.dp=2", "parallel.distributed_optimizer=true", "train.precision=bf16"},
    {"parallel.pp=2", "parallel.schedule=zb-v", "memory.optimizer_offload=all", "memory.param_offload=all"},
    with(kLlama, {"parallel.tp=2", "parallel.pp=2", "parallel.schedule=1f1b"}),
    with(kLlama, {"parallel.dp=2", "parallel.tp=2", "parallel.distributed_optimizer=true",
                  "memory.optimizer_offload=all", "train.precision=bf16"}),
};

std::string case_name(const ::testing::TestParamInfo<std::vector<std::string>>& info) {
  static const char* const names[] = {"single",
                                      "tp2_pp2_device",
                                      "tp2_pp2_offloaded",
                                      "dp2_distributed_bf16",
                                      "zbv_param_offload",
                                      "llama_tp2_pp2",
                                      "llama_dp2_tp2_distributed_offloaded_bf16"};
  return names[info.index];
}

INSTANTIATE_TEST_SUITE_P(Mechanisms, StreamedSave, ::testing::ValuesIn(kCases), case_name);

class StreamedLoad : public ::testing::TestWithParam<std::vector<std::string>> {};

void expect_same(const std::map<std::string, stp::HostTensor>& a, const std::map<std::string, stp::HostTensor>& b,
                 const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << what << " " << name;
    EXPECT_TRUE(t.shape == b.at(name).shape && t.data == b.at(name).data) << what << " " << name << " differs";
  }
}

// train.resume and model.init_from of a checkpoint, loaded tensor by tensor (train/trainer_load.cpp):
// the state is the saved one bit for bit, and the pageable memory the load held at once is exactly
// train/host_needs.h's prediction, far below the whole state.
TEST_P(StreamedLoad, LoadsTheStateBitwiseAndHoldsThePredictedPeak) {
  stp::Config cfg = tiny_config(GetParam());
  cfg.output.dir = fresh_dir("load");
  stp::Trainer t(cfg);
  t.step();
  t.step();
  const std::string path = t.save_checkpoint();
  const auto state_bytes = 3 * sizeof(float) * static_cast<std::size_t>(stp::full_parameter_count(cfg));

  stp::Config resumed = cfg;
  resumed.train.resume = path;
  stp::Trainer r(resumed);
  EXPECT_EQ(r.load_pageable_peak_bytes(), stp::pageable_host_bytes(resumed).resume);
  EXPECT_LT(r.load_pageable_peak_bytes(), state_bytes / 3) << "less than one whole state";
  expect_same(r.full_parameters(), t.full_parameters(), "parameters");
  expect_same(r.full_moments(0), t.full_moments(0), "exp_avg");
  expect_same(r.full_moments(1), t.full_moments(1), "exp_avg_sq");

  stp::Config init = cfg;
  init.model.init_from = path;
  stp::Trainer i(init);
  EXPECT_EQ(i.load_pageable_peak_bytes(), stp::pageable_host_bytes(init).init_from);
  expect_same(i.full_parameters(), t.full_parameters(), "model.init_from's parameters");
}

INSTANTIATE_TEST_SUITE_P(Mechanisms, StreamedLoad, ::testing::ValuesIn(kCases), case_name);

}  // namespace
