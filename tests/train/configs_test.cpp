// Every shipped config loads and validates; the CPU ones also pass the trainer's placement checks
// (built with one step, not trained). A config whose inputs are the user's own (the fine-tuning
// example's HF model folder and tokenized pairs) is built on stand-ins of the same kinds: an HF
// folder saved by a one-layer run, and an llm.c token file with its loss mask.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/token_file.h"
#include "tests/support/files.h"
#include "tests/support/loss_mask_file.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

namespace {

// --set overrides that give configs/finetune-gpt2.yaml stand-ins for models/gpt2 and runs/pairs.bin.
std::vector<std::string> finetune_stand_ins() {
  const std::string dir = stp::testing::fresh_dir("finetune_stand_ins");
  stp::Config base = stp::testing::tiny_config({"model.n_layer=1"});
  base.output.dir = dir + "/base";
  const std::string model = stp::Trainer(base).save_checkpoint();  // an HF folder, seq_len 16, vocab 256
  std::vector<std::int32_t> ids(200);
  std::iota(ids.begin(), ids.end(), 0);
  const std::string tokens = dir + "/pairs.bin";
  stp::write_token_file(tokens, ids, 256);
  std::vector<std::uint8_t> bits(ids.size());
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = i % 4 == 3;  // a "completion" every fourth token
  stp::testing::write_bytes(tokens + ".mask", stp::testing::loss_mask_bytes(bits));
  return {"model.init_from=" + model, "data.path=" + tokens, "data.mask_path=" + tokens + ".mask"};
}

TEST(ShippedConfigs, AllLoadAndTheCpuOnesBuild) {
  const std::map<std::string, std::vector<std::string>> stand_ins = {{"finetune-gpt2.yaml", finetune_stand_ins()}};
  int count = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(std::string(STP_SOURCE_DIR) + "/configs")) {
    if (e.path().extension() != ".yaml") continue;
    ++count;
    SCOPED_TRACE(e.path().string());
    const auto it = stand_ins.find(e.path().filename().string());
    stp::Config cfg =
        stp::load_config(e.path().string(), it == stand_ins.end() ? std::vector<std::string>{} : it->second);
    if (cfg.parallel.backend != "cpu") continue;
    cfg.output.dir = std::string(STP_BINARY_DIR) + "/tests/shipped_config_run";
    EXPECT_NO_THROW(stp::Trainer t(cfg));
  }
  EXPECT_GE(count, 9);
}

}  // namespace
