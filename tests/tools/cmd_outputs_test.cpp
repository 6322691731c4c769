// Outputs never overwrite inputs (docs/design.md, Files), end to end: `stp plot --svg`,
// `stp profile --svg` and `stp sim --svg / --trace` refuse a file the command reads or a run's
// file, with one line and status 1, and leave it byte for byte as it was; a file beside them is
// written as before. (`stp train` and `stp tokenize`: tests/tools/cmd_train_test.cpp and
// tests/tools/tokenize_test.sh.)
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/run_command.h"
#include "tests/train/train_fixture.h"

namespace fs = std::filesystem;

namespace {

using stp::testing::run_stp;
using stp::testing::slurp;

// A traced 2-step run of the test's own (ctest runs the tests of this file as parallel processes,
// so a folder shared between them would be removed under another's feet).
const fs::path& traced_run() {
  static const fs::path out =
      [] {
        const fs::path dir = fs::path(STP_BINARY_DIR) / "tests" / "cmd_outputs" /
                             ::testing::UnitTest::GetInstance()->current_test_info()->name();
        fs::remove_all(dir);
        fs::create_directories(dir);
        std::ofstream(dir / "config.yaml")
            << "model: {arch: gpt2, n_layer: 2, n_head: 2, n_embd: 16, vocab_size: 256, seq_len: 16}\n"
            << "data: {path: " << stp::testing::tiny_text_file() << ", format: text}\n"
            << "train: {steps: 2, micro_batch_size: 1, microbatches: 2}\n"
            << "parallel: {backend: cpu, tp: 1, pp: 2, schedule: 1f1b, cpu_threads: 1}\n"
            << "output: {dir: " << (dir / "out").string() << ", trace: true}\n";
        auto r = run_stp("train " + (dir / "config.yaml").string());
        EXPECT_EQ(r.status, 0) << r.err;
        return dir / "out";
      }();
  return out;
}

// `stp ARGS` fails with one line naming `needle`, and `file` keeps its bytes.
void expect_refused(const std::string& args, const fs::path& file, const std::string& needle) {
  const std::string before = slurp(file.string());
  ASSERT_FALSE(before.empty()) << file;
  auto r = run_stp(args);
  EXPECT_EQ(r.status, 1) << args << ": " << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": one line: " << r.err;
  EXPECT_EQ(slurp(file.string()), before) << args << ": " << file << " changed";
}

}  // namespace

TEST(CmdOutputs, PlotRefusesTheMetricsItReads) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  const fs::path run = traced_run();
  const std::string dir = run.string();
  expect_refused("plot " + dir + " --svg " + (run / "metrics.jsonl").string(), run / "metrics.jsonl", "--svg");
  expect_refused("plot " + dir + " --svg " + dir + "/./metrics.jsonl", run / "metrics.jsonl", "metrics.jsonl");
  expect_refused("plot " + dir + " --svg " + (run / "config.yaml").string(), run / "config.yaml", "config.yaml");
  expect_refused("plot " + dir + " --svg " + (run / "checkpoint-2" / "state.json").string(),
                 run / "checkpoint-2" / "state.json", "checkpoint");
  // A new file in the run folder is fine, and an earlier plot is replaced.
  const fs::path svg = run / "plot.svg";
  std::ofstream(svg) << "earlier";
  auto r = run_stp("plot " + dir + " --svg " + svg.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(slurp(svg.string()).find("<svg"), std::string::npos);
}

TEST(CmdOutputs, ProfileRefusesTheTraceItReads) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  const fs::path run = traced_run();
  const std::string dir = run.string();
  expect_refused("profile " + dir + " --svg " + (run / "trace.json").string(), run / "trace.json", "trace.json");
  expect_refused("profile " + dir + " --svg " + (run / "metrics.jsonl").string(), run / "metrics.jsonl",
                 "metrics.jsonl");
  auto r = run_stp("profile " + dir + " --svg " + (run / "timeline.svg").string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(slurp((run / "timeline.svg").string()).find("<svg"), std::string::npos);
}

TEST(CmdOutputs, SimRefusesARunsFiles) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  const fs::path run = traced_run();
  const std::string sim = "sim --schedule 1f1b --pp 2 --microbatches 4 ";
  expect_refused(sim + "--svg " + (run / "metrics.jsonl").string(), run / "metrics.jsonl", "metrics.jsonl");
  expect_refused(sim + "--trace " + (run / "trace.json").string(), run / "trace.json", "trace.json");
  expect_refused(sim + "--svg " + (run / "checkpoint-2" / "model.safetensors").string(),
                 run / "checkpoint-2" / "model.safetensors", "model.safetensors");
  auto r = run_stp(sim + "--svg " + run.string());
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("is a folder"), std::string::npos) << r.err;
  r = run_stp(sim + "--svg /dev/null");  // a device is written into, not replaced
  EXPECT_EQ(r.status, 0) << r.err;
}
