// `stp sim` end to end: JSON shape, and bad input gives one line on stderr, nothing on stdout, exit 1.
// Skipped when the stp executable has not been built (it links every library of the project).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "schedule/render.h"
#include "tests/support/run_command.h"
#include "schedule/simulator.h"
#include "schedule/validator.h"

namespace {

using Result = stp::testing::CommandResult;

Result run_sim(const std::string& args) { return stp::testing::run_stp("sim " + args); }

using stp::testing::have_stp;

}  // namespace

TEST(CmdSim, JsonMatchesLibrary) {
  if (!have_stp()) GTEST_SKIP() << "stp not built";
  Result r = run_sim("--schedule stp --pp 4 --microbatches 12 --tar 0.25 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  using namespace stp::sched;
  Costs c;
  c.tar = 0.25;
  Schedule s = generate("stp", 4, 12);
  EXPECT_EQ(r.out, render_json(s, simulate(s, c)));
  EXPECT_EQ(r.out.rfind("{\"schedule\":\"stp\",\"pp\":4,\"microbatches\":12,\"makespan\":", 0), 0u);
  EXPECT_NE(r.out.find("\"ranks\":[{\"rank\":0,\"span\":"), std::string::npos);
  EXPECT_NE(r.out.find("\"ops\":[[\"F0.1\",\"F0.2\""), std::string::npos);
}

TEST(CmdSim, BadInputIsOneLineAndNoOutput) {
  if (!have_stp()) GTEST_SKIP() << "stp not built";
  const char* bad[] = {"--schedule nope --pp 4 --microbatches 8", "--schedule stp --pp 0 --microbatches 8",
                       "--schedule 1f1b --pp 2 --microbatches 0", "--schedule stp --pp 4 --microbatches 8 --tb -1",
                       "--schedule stp --pp 4 --microbatches 7",  "--compare --pp 4 --microbatches 7"};
  for (const char* args : bad) {
    Result r = run_sim(args);
    EXPECT_EQ(r.status, 1) << args;
    EXPECT_EQ(r.out, "") << args;
    EXPECT_EQ(r.err.rfind("stp sim: error: ", 0), 0u) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
  EXPECT_NE(run_sim("--schedule stp --pp 4 --microbatches 7").err.find("at least 8"), std::string::npos);
}

// --check-deadlock: the executor's posting (one stream per channel) prints "no deadlock" and exits
// 0, even for a schedule whose sends cross; with --p2p-streams shared (every channel on one
// stream) that schedule prints the cycle naming its ops and exits 1 (schedule/deadlock.h).
TEST(CmdSim, CheckDeadlock) {
  if (!have_stp()) GTEST_SKIP() << "stp not built";
  Result ok = run_sim("--schedule 1f1b-i --pp 2 --microbatches 4 --check-deadlock");
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_EQ(ok.out,
            "1f1b-i pp 2 microbatches 4, p2p streams per-channel: no deadlock\n"
            "1f1b-i pp 2 microbatches 4, first uses of channels: agree\n");
  Result bad = run_sim("--schedule 1f1b-i --pp 2 --microbatches 4 --check-deadlock --p2p-streams shared");
  EXPECT_EQ(bad.status, 1) << bad.err;
  EXPECT_EQ(bad.err, "");
  EXPECT_NE(bad.out.find("p2p streams shared: deadlock: a cycle of waits"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("rank 0 p2p: kernel [send"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("rank 1 p2p: kernel [send"), std::string::npos) << bad.out;
  EXPECT_NE(run_sim("--schedule 1f1b --pp 2 --microbatches 4 --check-deadlock --p2p-streams both").status, 0);
  EXPECT_EQ(run_sim("--schedule stp --pp 2 --microbatches 4 --check-deadlock").status, 0);
}
