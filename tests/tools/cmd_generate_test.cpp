// `stp generate` as a user types it: a checkpoint path as a shell completes it (with a trailing
// slash), option errors reported before anything is written on stdout, and a checkpoint it cannot
// sample from (logits that are not finite). Skipped when the stp executable has not been built.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

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

// A one-step run of a small byte-level model; its checkpoint folder. One folder per test, since
// ctest runs the tests of this file as processes side by side.
const std::string& checkpoint() {
  static const std::string ck = [] {
    const fs::path dir = fs::path(STP_BINARY_DIR) / "tests" / "cmd_generate" /
                         ::testing::UnitTest::GetInstance()->current_test_info()->name();
    auto r = stp::testing::run_stp("train " + stp::testing::fresh_tiny_run_config(dir).string());
    EXPECT_EQ(r.status, 0) << r.err;
    return (dir / "out" / "checkpoint-1").string();
  }();
  return ck;
}

TEST(CmdGenerate, ACheckpointPathWithATrailingSlashWorks) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  auto plain = stp::testing::run_stp("generate " + checkpoint() + " --prompt ab --tokens 3 --seed 1");
  ASSERT_EQ(plain.status, 0) << plain.err;
  for (const std::string slash : {"/", "//"}) {
    auto r = stp::testing::run_stp("generate " + checkpoint() + slash + " --prompt ab --tokens 3 --seed 1");
    EXPECT_EQ(r.status, 0) << slash << ": " << r.err;
    EXPECT_EQ(r.out, plain.out) << slash;
  }
}

// An option the sampler refuses is reported before the prompt is echoed: stdout stays empty, so
// a pipeline reading it sees no half answer.
TEST(CmdGenerate, OptionErrorsPrintNothingOnStdout) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  for (const std::string bad : {"--tokens 0", "--temperature -1", "--top-k -2"}) {
    auto r = stp::testing::run_stp("generate " + checkpoint() + " --prompt hello " + bad);
    EXPECT_EQ(r.status, 1) << bad;
    EXPECT_EQ(r.out, "") << bad;
    EXPECT_NE(r.err.find(bad.substr(0, bad.find(' '))), std::string::npos) << bad << ": " << r.err;
  }
}

// The seed is an unsigned 64-bit number: -1 is an error naming --seed, not 2^64 - 1.
TEST(CmdGenerate, ANegativeSeedIsAnError) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  for (const char* seed : {"-1", "-0x1", "18446744073709551616", "1.5", "x"}) {
    auto r = stp::testing::run_stp("generate " + checkpoint() + " --prompt ab --tokens 2 --seed " + seed);
    EXPECT_EQ(r.status, 1) << seed << ": " << r.out;
    EXPECT_EQ(r.out, "") << seed;
    EXPECT_NE(r.err.find("--seed"), std::string::npos) << seed << ": " << r.err;
  }
  auto top = stp::testing::run_stp("generate " + checkpoint() + " --prompt ab --tokens 2 --seed 18446744073709551615");
  EXPECT_EQ(top.status, 0) << top.err;
}

}  // namespace
