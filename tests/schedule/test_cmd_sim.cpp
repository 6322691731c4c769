// `stp sim` end to end: JSON shape, and bad input gives one line on stderr, nothing on stdout, exit 1.
// Skipped when the stp executable has not been built (it links every library of the project).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sys/wait.h>
#include <filesystem>
#include <string>

#include "schedule/render.h"
#include "schedule/simulator.h"
#include "schedule/validator.h"

namespace {

struct Result {
  int status;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::string text;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    std::fclose(f);
  }
  return text;
}

Result run_sim(const std::string& args) {
  std::string dir = std::filesystem::temp_directory_path() / "stp_test_cmd_sim";
  std::filesystem::create_directories(dir);
  std::string cmd = std::string(STP_BINARY_DIR) + "/stp sim " + args + " >" + dir + "/out 2>" + dir + "/err";
  int rc = std::system(cmd.c_str());
  return {WEXITSTATUS(rc), slurp(dir + "/out"), slurp(dir + "/err")};
}

bool have_stp() { return std::filesystem::exists(std::string(STP_BINARY_DIR) + "/stp"); }

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
                       "--schedule stp --pp 4 --microbatches 7", "--compare --pp 4 --microbatches 7"};
  for (const char* args : bad) {
    Result r = run_sim(args);
    EXPECT_EQ(r.status, 1) << args;
    EXPECT_EQ(r.out, "") << args;
    EXPECT_EQ(r.err.rfind("stp sim: error: ", 0), 0u) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
  EXPECT_NE(run_sim("--schedule stp --pp 4 --microbatches 7").err.find("at least 8"), std::string::npos);
}
