// `stp plot` on the run folders a user has: one whose metrics.jsonl ends in a cut line (a run
// killed while writing it, or a full disk) is drawn from its whole lines, and the cut line is
// named; a run resumed after such a kill drops the cut line before it appends. Skipped when the
// stp executable has not been built.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/run_command.h"
#include "tests/train/train_fixture.h"

namespace fs = std::filesystem;

namespace {

TEST(CmdPlot, ACutLastLineIsIgnoredAndSaidSo) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  const fs::path dir = fs::path(STP_BINARY_DIR) / "tests" / "cmd_plot_cut";
  fs::remove_all(dir);
  fs::create_directories(dir / "run");
  std::ofstream(dir / "run" / "metrics.jsonl") << "{\"step\":1,\"loss\":3,\"lr\":0.001}\n"
                                               << "{\"step\":2,\"loss\":2.5,\"lr\":0.001}\n"
                                               << "{\"step\":3,\"loss\":2.";
  const fs::path svg = dir / "plot.svg";
  auto r = stp::testing::run_stp("plot " + (dir / "run").string() + " --svg " + svg.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("stp plot: warning: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("line 3 is cut"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ignored"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("4 points"), std::string::npos) << "loss and lr at steps 1 and 2: " << r.err;
  EXPECT_TRUE(fs::exists(svg));
}

// Killed while it wrote step 2's line, then resumed from step 1's checkpoint: the resumed run
// logs step 2 again on a line of its own, and the file reads whole.
TEST(CmdPlot, AResumedRunDropsTheCutLineBeforeItAppends) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  const fs::path dir = fs::path(STP_BINARY_DIR) / "tests" / "cmd_plot_resume";
  const fs::path config = stp::testing::fresh_tiny_run_config(dir);
  auto first = stp::testing::run_stp("train " + config.string());
  ASSERT_EQ(first.status, 0) << first.err;
  std::ofstream(dir / "out" / "metrics.jsonl", std::ios::app) << "{\"step\":2,\"loss\":5.4";
  auto resumed = stp::testing::run_stp("train " + config.string() + " --set train.steps=2 --set train.resume=" +
                                       (dir / "out" / "checkpoint-1").string());
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("ended in a cut line"), std::string::npos) << resumed.err;
  const std::string metrics = stp::testing::slurp((dir / "out" / "metrics.jsonl").string());
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 2) << metrics;
  EXPECT_EQ(metrics.find("5.4{"), std::string::npos) << metrics;
  auto r = stp::testing::run_stp("plot " + (dir / "out").string() + " --svg " + (dir / "plot.svg").string());
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
}

}  // namespace
