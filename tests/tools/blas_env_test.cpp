// tools/cli/blas_env.h: when `stp` sets OpenBLAS's thread timeout (only when the user has not), and that
// the re-executed program runs normally either way.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "tests/support/run_command.h"
#include "tools/cli/blas_env.h"

namespace stp::tools {
namespace {

std::optional<std::string> decide(const std::map<std::string, std::string>& env) {
  return blas_thread_timeout_to_set([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(BlasEnv, SetsTheTimeoutUnlessTheUserChoseOne) {
  EXPECT_EQ(decide({}), std::to_string(kBlasThreadTimeout));
  EXPECT_EQ(decide({{"OMP_NUM_THREADS", "2"}}), std::to_string(kBlasThreadTimeout));
  EXPECT_EQ(decide({{"OPENBLAS_THREAD_TIMEOUT", "30"}}), std::nullopt);
  EXPECT_EQ(decide({{"GOTO_THREAD_TIMEOUT", "20"}}), std::nullopt);
}

// Without the variable stp re-executes itself once: it must then run exactly as before (one
// version line, status 0: a loop of re-executions would time out, output before the exec would
// show twice); with the variable set it does not re-execute.
TEST(BlasEnv, StpRunsNormallyWithAndWithoutTheVariable) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp is not built";
  for (const char* env : {"env -u OPENBLAS_THREAD_TIMEOUT -u GOTO_THREAD_TIMEOUT", "env OPENBLAS_THREAD_TIMEOUT=30"}) {
    SCOPED_TRACE(env);
    const auto r = stp::testing::run_command(std::string(env) + " timeout 30 " + STP_BINARY_DIR + "/stp --version");
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out.find("stp "), 0u) << r.out;
    EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "one line: " << r.out;
  }
}

}  // namespace
}  // namespace stp::tools
