// `stp generate` end to end on a checkpoint it cannot sample from.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "formats/safetensors.h"
#include "tests/support/run_command.h"
#include "tests/train/train_fixture.h"

namespace fs = std::filesystem;

namespace {

// Finite weights whose forward overflows (the final norm's weight at 3e38): the logits are not
// finite, so the command fails with one message and prints nothing on stdout, not even the prompt.
TEST(CmdGenerate, LogitsThatAreNotFiniteAreAnErrorAndNothingIsPrinted) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  const fs::path dir = stp::testing::fresh_dir("cmd_generate_overflow");
  stp::Config cfg = stp::testing::tiny_config({});
  cfg.output.dir = dir.string();
  std::string ck;
  {
    stp::Trainer t(cfg);
    t.step();
    ck = t.save_checkpoint();
  }
  std::ofstream(dir / "config.yaml") << cfg.to_yaml();
  const std::string model = ck + "/model.safetensors";
  stp::SafetensorsFile file = stp::read_safetensors_file(model);
  for (float& x : file.tensors.at("ln_f.weight").data) x = 3e38f;
  std::vector<std::pair<std::string, const stp::HostTensor*>> list;
  for (const auto& [name, t] : file.tensors) list.emplace_back(name, &t);
  stp::write_safetensors(model, list, file.metadata);

  auto r = stp::testing::run_stp("generate " + ck + " --prompt 'the ' --tokens 5");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.err.rfind("stp generate: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("not finite"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "") << "printed before the error";
}

}  // namespace
