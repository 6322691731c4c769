// Sampling from a checkpoint (train/generate.h): the same seed gives the same tokens, the model is
// rebuilt from the stored config whatever layout trained it, the sampling rule, and clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include "base/error.h"
#include "formats/safetensors.h"
#include "tests/support/files.h"
#include "tests/train/train_fixture.h"
#include "train/generate.h"
#include "train/trainer.h"

namespace {

// A checkpoint of a few steps of a tp = 2, pp = 2 run, with the run's config.yaml beside it. Each
// test process trains its own, in a folder named after the test: ctest runs these tests in
// parallel processes, and one shared folder would be rewritten under another test's reader.
std::string trained_checkpoint() {
  static const std::string path = [] {
    std::filesystem::path dir = stp::testing::fresh_dir("generate_run");
    auto cfg = stp::testing::tiny_config(
        {"parallel.tp=2", "parallel.pp=2", "parallel.schedule=stp", "train.lr=3e-3", "train.steps=4"});
    cfg.output.dir = dir.string();
    stp::Trainer t(cfg);
    for (int i = 0; i < 4; ++i) t.step();
    std::string ck = t.save_checkpoint();
    std::ofstream(dir / "config.yaml") << cfg.to_yaml();
    return ck;
  }();
  return path;
}

std::vector<std::int32_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// A llama (GQA, untied head) checkpoint of a tp = 2, pp = 2 run: the generator builds it through
// the model registry like any architecture.
std::string llama_checkpoint() {
  static const std::string path = [] {
    std::filesystem::path dir = stp::testing::fresh_dir("generate_llama_run");
    auto cfg = stp::testing::tiny_config({"model.arch=llama", "model.n_kv_head=2", "model.intermediate_size=64",
                                          "parallel.tp=2", "parallel.pp=2", "parallel.schedule=stp", "train.lr=3e-3",
                                          "train.steps=2"});
    cfg.output.dir = dir.string();
    stp::Trainer t(cfg);
    for (int i = 0; i < 2; ++i) t.step();
    std::string ck = t.save_checkpoint();
    std::ofstream(dir / "config.yaml") << cfg.to_yaml();
    return ck;
  }();
  return path;
}

TEST(Generate, SameSeedSameTokensOtherSeedOtherTokens) {
  stp::Generator g(trained_checkpoint());
  EXPECT_EQ(g.config().parallel.tp, 2) << "the stored config";
  stp::SampleOptions o;
  o.tokens = 24;  // past T = 16: the window slides
  o.seed = 11;
  o.temperature = 1.0;
  o.top_k = 40;
  auto a = g.sample(bytes("the pipe"), o);
  ASSERT_EQ(a.size(), 24u);
  for (auto t : a) EXPECT_TRUE(t >= 0 && t < 256);
  stp::Generator again(trained_checkpoint());
  EXPECT_EQ(again.sample(bytes("the pipe"), o), a) << "a fresh generator, the same seed";
  o.seed = 12;
  EXPECT_NE(g.sample(bytes("the pipe"), o), a) << "another seed";
  o.temperature = 0;
  auto greedy = g.sample(bytes("the pipe"), o);
  o.seed = 99;
  EXPECT_EQ(g.sample(bytes("the pipe"), o), greedy) << "temperature 0 ignores the seed";
}

TEST(Generate, LlamaCheckpointThroughTheRegistry) {
  stp::Generator g(llama_checkpoint());
  EXPECT_EQ(g.config().model.arch, "llama");
  stp::SampleOptions o;
  o.tokens = 20;
  o.seed = 5;
  auto a = g.sample(bytes("the "), o);
  ASSERT_EQ(a.size(), 20u);
  for (auto t : a) EXPECT_TRUE(t >= 0 && t < 256);
  EXPECT_EQ(stp::Generator(llama_checkpoint()).sample(bytes("the "), o), a) << "the same seed";
}

TEST(Generate, SamplingRule) {
  std::vector<float> z = {0.0f, 3.0f, 1.0f, 3.0f, -2.0f};
  EXPECT_EQ(stp::sample_token(z, 0.0, 0, 123), 1) << "argmax, ties to the lower id";
  EXPECT_EQ(stp::sample_token(z, 1.0, 1, 0xffffffffffffffffull), 1) << "top-1 is greedy";
  // top-2 keeps ids 1 and 3 (equal logits): the lower half of the draws picks 1, the upper 3.
  EXPECT_EQ(stp::sample_token(z, 1.0, 2, 0x3fffffffffffffffull), 1);
  EXPECT_EQ(stp::sample_token(z, 1.0, 2, 0xc000000000000000ull), 3);
  // Frequencies follow softmax(z / temperature).
  std::vector<int> count(z.size());
  const int n = 20000;
  for (int i = 0; i < n; ++i)
    ++count[static_cast<std::size_t>(stp::sample_token(z, 2.0, 0, 0x9e3779b97f4a7c15ull * (i + 1)))];
  double total = 0;
  for (float v : z) total += std::exp(v / 2.0);
  for (std::size_t i = 0; i < z.size(); ++i)
    EXPECT_NEAR(count[i] / double(n), std::exp(z[i] / 2.0) / total, 0.015) << "id " << i;
}

TEST(Generate, ClearErrors) {
  stp::Generator g(trained_checkpoint());
  stp::SampleOptions o;
  auto expect_error = [&](const std::vector<std::int32_t>& prompt, const stp::SampleOptions& opt,
                          const std::string& needle) {
    try {
      g.sample(prompt, opt);
      ADD_FAILURE() << "no error, wanted " << needle;
    } catch (const stp::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({}, o, "empty");
  expect_error(bytes("a prompt longer than sixteen bytes"), o, "longer than the model's context");
  expect_error({300}, o, "vocabulary");
  stp::SampleOptions bad = o;
  bad.tokens = 0;
  expect_error(bytes("x"), bad, "--tokens");
  bad = o;
  bad.temperature = -1;
  expect_error(bytes("x"), bad, "--temperature");
  EXPECT_THROW(stp::Generator("/nonexistent/checkpoint-1"), stp::Error);
  // A checkpoint without the run's config beside it.
  std::filesystem::path lonely = stp::testing::fresh_dir("generate_lonely");
  std::filesystem::create_directories(lonely);
  std::filesystem::copy(trained_checkpoint(), lonely / "checkpoint-4");
  try {
    stp::Generator x((lonely / "checkpoint-4").string());
    FAIL() << "no error without config.yaml";
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.yaml"), std::string::npos) << e.what();
  }
  // A config of another model shape.
  auto other = stp::testing::tiny_config({"model.n_embd=64"});
  std::ofstream(lonely / "config.yaml") << other.to_yaml();
  try {
    stp::Generator x((lonely / "checkpoint-4").string());
    FAIL() << "no error for a mismatched config";
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("another model"), std::string::npos) << e.what();
  }
}

// A copy of trained_checkpoint() (with the run's config.yaml inside it) whose model tensor `name`
// is changed by `edit`.
std::string edited_checkpoint(const std::string& tag, const std::string& name,
                              const std::function<void(std::vector<float>&)>& edit) {
  std::filesystem::path dir = std::filesystem::path(stp::testing::fresh_dir("generate_" + tag)) / "checkpoint-4";
  std::filesystem::create_directories(dir.parent_path());
  std::filesystem::copy(trained_checkpoint(), dir, std::filesystem::copy_options::recursive);
  std::filesystem::copy_file(std::filesystem::path(trained_checkpoint()).parent_path() / "config.yaml",
                             dir / "config.yaml");
  const std::string path = (dir / "model.safetensors").string();
  stp::SafetensorsFile file = stp::read_safetensors_file(path);
  edit(file.tensors.at(name).data);
  std::vector<std::pair<std::string, const stp::HostTensor*>> list;
  for (const auto& [n, t] : file.tensors) list.emplace_back(n, &t);
  stp::write_safetensors(path, list, file.metadata);
  return dir.string();
}

// A weight that is not finite is refused when the checkpoint is loaded, naming the tensor.
TEST(Generate, NonFiniteWeightsAreAnErrorNamingTheTensor) {
  const std::string ck = edited_checkpoint("nan_weight", "h.0.mlp.c_fc.weight", [](auto& d) { d.at(7) = NAN; });
  stp::testing::expect_error([&] { stp::Generator g(ck); }, {ck, "'h.0.mlp.c_fc.weight'", "not finite"});
}

// Finite weights whose forward overflows (a final norm scaled to 3e38) give logits that are not
// finite: sampling refuses them before drawing a token from them.
TEST(Generate, LogitsThatAreNotFiniteAreRefused) {
  const std::string ck = edited_checkpoint("huge_norm", "ln_f.weight", [](auto& d) {
    for (float& x : d) x = 3e38f;
  });
  stp::Generator g(ck);
  std::vector<std::int32_t> drawn;
  stp::SampleOptions o;
  o.tokens = 4;
  stp::testing::expect_error([&] { g.sample(bytes("the "), o, [&](std::int32_t t) { drawn.push_back(t); }); },
                             {ck, "logits", "not finite"});
  EXPECT_TRUE(drawn.empty()) << drawn.size() << " tokens drawn from logits that are not finite";
}

}  // namespace
