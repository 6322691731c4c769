// A GPT-2 checkpoint in Hugging Face layout (written by tools/reference/gen_gpt2_reference.py, with the
// "transformer." prefix and the tied "lm_head.weight" as GPT2LMHeadModel saves them) loads into any
// tp x pp layout with bitwise the reference values, and save -> load round-trips bitwise.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "base/error.h"
#include "formats/checkpoint.h"
#include "tests/models/gpt2_test_util.h"
#include "tests/support/files.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

namespace {

const std::string kRefWeights = std::string(STP_SOURCE_DIR) + "/tests/models/data/gpt2_tiny_ref.safetensors";

// The reference model shape over a small u16 token file (tokens < 64).
stp::Config reference_config(const std::vector<std::string>& extra) {
  std::string data = stp::testing::tokens64_file();
  std::vector<std::string> sets = {"model.n_layer=2",
                                   "model.n_head=4",
                                   "model.n_embd=32",
                                   "model.vocab_size=64",
                                   "model.seq_len=16",
                                   "data.format=u16",
                                   "data.path=" + data,
                                   "model.init_from=" + kRefWeights,
                                   "output.dir=" + std::string(STP_BINARY_DIR) + "/tests/init_from_run"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return stp::testing::tiny_config(sets);
}

TEST(InitFrom, HuggingFaceLayoutLoadsBitwiseIntoAnyLayout) {
  const auto& ref = stp::testing::reference();
  for (auto layout : std::vector<std::vector<std::string>>{{}, {"parallel.tp=2", "parallel.pp=2"}, {"parallel.tp=4"}}) {
    stp::Trainer t(reference_config(layout));
    auto params = t.full_parameters();
    int compared = 0;
    for (const auto& [name, tensor] : params) {
      const auto& want = ref.at("param." + name);
      EXPECT_EQ(tensor.shape, want.shape) << name;
      EXPECT_EQ(tensor.data, want.data) << name;
      ++compared;
    }
    EXPECT_EQ(compared, 2 * 12 + 4) << "every GPT-2 tensor of a 2-layer model";
  }
}

TEST(InitFrom, SaveThenLoadRoundTripsBitwise) {
  stp::Trainer t(reference_config({"parallel.tp=2", "parallel.pp=2"}));
  t.step();
  std::string ckpt = t.save_checkpoint();
  auto saved = stp::read_model_tensors(ckpt + "/model.safetensors");
  auto live = t.full_parameters();
  ASSERT_EQ(saved.size(), live.size());
  for (const auto& [name, tensor] : live) {
    EXPECT_EQ(saved.at(name).shape, tensor.shape) << name;
    EXPECT_EQ(saved.at(name).data, tensor.data) << name;
  }
  for (const char* hf : {"wte.weight", "wpe.weight", "h.0.attn.c_attn.weight", "h.1.mlp.c_proj.weight", "ln_f.bias"})
    EXPECT_TRUE(saved.count(hf)) << hf;
  EXPECT_EQ(saved.at("h.0.attn.c_attn.weight").shape, (stp::Shape{32, 96})) << "HF Conv1D layout [C, 3C]";
}

TEST(InitFrom, WrongShapeIsAClearError) {
  try {
    stp::Trainer t(reference_config({"model.n_embd=64"}));
    FAIL() << "loaded a 32-wide checkpoint into a 64-wide model";
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("has shape"), std::string::npos) << e.what();
  }
}

// An infinity or a NaN among the parameters is refused on import, naming the file and the tensor
// (in the names the file uses, less the "transformer." prefix).
TEST(InitFrom, NonFiniteValuesAreAnErrorNamingTheTensorAndTheFile) {
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    stp::SafetensorsFile file = stp::read_safetensors_file(kRefWeights);
    file.tensors.at("transformer.h.1.mlp.c_fc.weight").data.at(5) = bad;
    const std::string path =
        std::string(STP_BINARY_DIR) + "/tests/init_from_nonfinite_" + std::to_string(::getpid()) + ".safetensors";
    std::vector<std::pair<std::string, const stp::HostTensor*>> list;
    for (const auto& [name, t] : file.tensors) list.emplace_back(name, &t);
    stp::write_safetensors(path, list);
    stp::testing::expect_error([&] { stp::Trainer t(reference_config({"model.init_from=" + path})); },
                               {path, "'h.1.mlp.c_fc.weight'", "not finite", "index 5"});
    std::filesystem::remove(path);
  }
}

}  // namespace
