// Checkpoint and resume: 6 steps straight equal 3 steps + checkpoint + resume + 3 steps, bitwise
// (losses and parameters): the checkpoint holds every bit of model and optimizer state, and the
// data position is a pure function of the step (docs/design.md, Sampling).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "formats/safetensors.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

namespace {

using stp::testing::fresh_dir;

// tiny_config(o) writing to `dir`.
stp::Config config_in(const std::vector<std::string>& o, const std::string& dir) {
  auto cfg = stp::testing::tiny_config(o);
  cfg.output.dir = dir;
  return cfg;
}

// `steps` steps of t, their losses appended to *losses when given.
void take_steps(stp::Trainer& t, int steps, std::vector<double>* losses) {
  for (int i = 0; i < steps; ++i) {
    const double loss = t.step().loss;
    if (losses) losses->push_back(loss);
  }
}

// A trainer of tiny_config(o) writing to `dir`: `steps` steps (their losses appended to *losses and
// the parameters after them into *params, when given).
void train_steps(const std::vector<std::string>& o, const std::string& dir, int steps, std::vector<double>* losses,
                 std::map<std::string, stp::HostTensor>* params = nullptr) {
  stp::Trainer t(config_in(o, dir));
  take_steps(t, steps, losses);
  if (params) *params = t.full_parameters();
}

// As train_steps, then a checkpoint: its path.
std::string checkpoint_after(const std::vector<std::string>& o, const std::string& dir, int steps,
                             std::vector<double>* losses = nullptr) {
  stp::Trainer t(config_in(o, dir));
  take_steps(t, steps, losses);
  return t.save_checkpoint();
}

// tiny_config(o) resuming from `checkpoint`, writing beside it.
stp::Config resume_config(const std::vector<std::string>& o, const std::string& checkpoint) {
  auto cfg = stp::testing::tiny_config(o);
  cfg.output.dir = std::filesystem::path(checkpoint).parent_path().string();
  cfg.train.resume = checkpoint;
  return cfg;
}

TEST(Resume, SixStepsEqualThreePlusCheckpointPlusThreeBitwise) {
  // bf16: the checkpoint holds the f32 masters; the bf16 weight copies are rounded from them again.
  // Under a sanitizer: the pipelined bf16 layout only.
  for (std::string layout :
       stp::testing::sweep<std::string>({"parallel.pp=1", "parallel.pp=2", "parallel.pp=2 train.precision=bf16"},
                                        {"parallel.pp=2 train.precision=bf16"})) {
    std::vector<std::string> base = {"parallel.schedule=stp",    "parallel.tp=2",        "train.steps=6",
                                     "train.lr_schedule=cosine", "train.warmup_steps=2", "data.sampling=random"};
    for (std::size_t at = 0, space = 0; at < layout.size(); at = space + 1) {
      space = std::min(layout.find(' ', at), layout.size());
      base.push_back(layout.substr(at, space - at));
    }
    std::vector<double> straight;
    std::map<std::string, stp::HostTensor> straight_params;
    train_steps(base, fresh_dir("resume_straight"), 6, &straight, &straight_params);
    std::vector<double> resumed;
    const std::string ckpt = checkpoint_after(base, fresh_dir("resume_split"), 3, &resumed);
    stp::Trainer t(resume_config(base, ckpt));
    EXPECT_EQ(t.steps_done(), 3);
    take_steps(t, 3, &resumed);
    EXPECT_EQ(resumed, straight) << layout;
    EXPECT_TRUE(stp::testing::bitwise_equal(t.full_parameters(), straight_params)) << layout;
  }
}

TEST(Resume, CheckpointOfOneLayoutResumesInAnother) {
  std::string ckpt;
  double next_loss = 0;
  {
    auto cfg = stp::testing::tiny_config({"parallel.tp=2", "parallel.pp=2", "parallel.schedule=zb-v"});
    cfg.output.dir = fresh_dir("resume_layout");
    stp::Trainer t(cfg);
    t.step();
    ckpt = t.save_checkpoint();
    next_loss = t.step().loss;
  }
  auto cfg = stp::testing::tiny_config({});
  cfg.train.resume = ckpt;
  stp::Trainer t(cfg);
  EXPECT_NEAR(t.step().loss, next_loss, 1e-5 * next_loss);
}

TEST(Resume, TruncatedCheckpointIsAClearError) {
  const std::string ckpt = checkpoint_after({}, fresh_dir("resume_truncated"), 1);
  auto model = std::filesystem::path(ckpt) / "model.safetensors";
  std::filesystem::resize_file(model, std::filesystem::file_size(model) / 2);
  auto cfg = stp::testing::tiny_config({});
  cfg.train.resume = ckpt;
  try {
    stp::Trainer t(cfg);
    FAIL() << "a truncated checkpoint was accepted";
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
  }
}

// A checkpoint holding a value that is not finite, or a negative exp_avg_sq (a running mean of
// squares never is: its square root would be NaN in the first update), is refused on resume,
// naming the file and the tensor.
TEST(Resume, NonFiniteOrNegativeStateIsAnErrorNamingTheTensorAndTheFile) {
  const std::string ckpt = checkpoint_after({}, fresh_dir("resume_bad_values"), 1);
  struct Case {
    std::string file, tensor;
    float value;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {"optimizer.safetensors",
       "h.0.attn.c_attn.weight.exp_avg_sq",
       -1.0f,
       {"(exp_avg_sq)", "'h.0.attn.c_attn.weight'", "negative"}},
      {"optimizer.safetensors",
       "h.1.mlp.c_proj.weight.exp_avg",
       INFINITY,
       {"(exp_avg)", "'h.1.mlp.c_proj.weight'", "not finite"}},
      {"optimizer.safetensors", "ln_f.bias.exp_avg_sq", NAN, {"(exp_avg_sq)", "'ln_f.bias'", "not finite"}},
      {"model.safetensors", "wte.weight", NAN, {"'wte.weight'", "not finite"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tensor);
    const std::string bad = ckpt + "-bad";
    std::filesystem::remove_all(bad);
    std::filesystem::copy(ckpt, bad, std::filesystem::copy_options::recursive);
    const std::string path = bad + "/" + c.file;
    stp::SafetensorsFile file = stp::read_safetensors_file(path);
    file.tensors.at(c.tensor).data.at(3) = c.value;
    std::vector<std::pair<std::string, const stp::HostTensor*>> list;
    for (const auto& [name, t] : file.tensors) list.emplace_back(name, &t);
    stp::write_safetensors(path, list, file.metadata);
    auto cfg = stp::testing::tiny_config({});
    cfg.output.dir = std::filesystem::path(ckpt).parent_path().string();
    cfg.train.resume = bad;
    std::vector<std::string> needles = c.needles;
    needles.push_back(path);
    try {
      stp::Trainer t(cfg);
      ADD_FAILURE() << "resumed from a checkpoint with " << c.value << " in " << c.tensor;
    } catch (const stp::Error& e) {
      for (const std::string& n : needles)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << n << " in: " << e.what();
    }
  }
}

}  // namespace

namespace {

// A text file of 20 windows of seq_len 16 (321 bytes): the tiny config's 16 sequences a step make
// an epoch 1.25 steps long, so step 3 ends inside epoch 2 (sequence 48 = epoch 2, window index 8).
std::string twenty_windows_file(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/twenty_windows.txt";
  std::ofstream f(path, std::ios::binary);
  const char* words[] = {"shuffle ", "every ", "window ", "once ", "per ", "epoch; "};
  std::string text;
  for (unsigned i = 0; text.size() < 321; ++i) text += words[(i * 7 + i / 5) % 6];
  text.resize(321);
  f << text;
  return path;
}

nlohmann::json state_of(const std::string& checkpoint) {
  std::ifstream f(std::filesystem::path(checkpoint) / "state.json");
  return nlohmann::json::parse(f);
}

}  // namespace

// data.sampling shuffle, stopped mid-epoch: 6 steps straight equal 3 steps + checkpoint + resume
// + 3 steps, bitwise, and the checkpoint records where in the epoch the run stopped. The same
// checkpoint resumed under another order (data.sampling random) differs, so the equality is the
// order's, not an accident of the data.
TEST(Resume, ShuffleStoppedMidEpochResumesTheSameOrderBitwise) {
  const std::string data = twenty_windows_file(fresh_dir("resume_shuffle_data"));
  const std::vector<std::string> base = {"data.sampling=shuffle", "data.path=" + data, "train.steps=6",
                                         "model.n_layer=2"};
  std::vector<double> straight;
  train_steps(base, fresh_dir("resume_shuffle_straight"), 6, &straight);
  std::vector<double> resumed;
  const std::string ckpt = checkpoint_after(base, fresh_dir("resume_shuffle_split"), 3, &resumed);
  const nlohmann::json state = state_of(ckpt);
  EXPECT_EQ(state["data_position"], 48);
  EXPECT_EQ(state["shuffle"],
            nlohmann::json({{"tokens", 321}, {"seq_len", 16}, {"windows", 20}, {"epoch", 2}, {"index", 8}}));
  {
    stp::Trainer t(resume_config(base, ckpt));
    take_steps(t, 3, &resumed);
    EXPECT_EQ(resumed, straight);
  }
  stp::Trainer other(resume_config(stp::testing::with(base, {"data.sampling=random"}), ckpt));
  EXPECT_NE(other.step().loss, straight[3]);
}

// What the checkpoint recorded is checked against what this run would read: data with another
// token count (so another set of windows), another seed (another order) or another global batch
// (another next sequence) is an error naming both, not a silently different order.
TEST(Resume, ShuffleResumeOnChangedDataOrBatchIsAClearError) {
  const std::string dir = fresh_dir("resume_shuffle_changed");
  const std::string data = twenty_windows_file(dir);
  const std::vector<std::string> base = {"data.sampling=shuffle", "data.path=" + data, "model.n_layer=2"};
  const std::string ckpt = checkpoint_after(base, dir + "/out", 1);
  auto expect_refused = [&](const std::vector<std::string>& extra, const std::vector<std::string>& needles) {
    std::vector<std::string> set = base;
    set.insert(set.end(), extra.begin(), extra.end());
    auto cfg = stp::testing::tiny_config(set);
    cfg.output.dir = dir + "/out";
    cfg.train.resume = ckpt;
    try {
      stp::Trainer t(cfg);
      ADD_FAILURE() << "resumed a shuffle with " << (extra.empty() ? "longer data" : extra.front());
    } catch (const stp::Error& e) {
      for (const std::string& n : needles)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << n << " in: " << e.what();
    }
  };
  expect_refused({"train.micro_batch_size=1"}, {ckpt, "data_position", "train.micro_batch_size 1", "sequence 8"});
  expect_refused({"train.seed=8"}, {ckpt, "train.seed 7", "train.seed is 8"});
  std::ofstream(data, std::ios::app) << std::string(40, 'x');  // 361 tokens: 22 windows
  expect_refused({}, {ckpt, "20 windows", "321 tokens", "361 tokens", "22 windows", data});
}
