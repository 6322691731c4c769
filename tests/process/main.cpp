// main() of the MPI test binary: starts MPI (process/process.h), runs every test, and agrees on the
// result, so the job fails when any process failed (each prints its own failures).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "base/error.h"
#include "tests/process/mpi_env.h"

namespace {
stp::ProcessGroup* g_job = nullptr;
}

stp::ProcessGroup& stp::testing::job() { return *g_job; }

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<stp::ProcessGroup> job;
  try {
    job = stp::start_processes();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_process: %s\n", e.what());
    return 1;
  }
  if (!job || job->size() != 4) {
    std::fprintf(stderr, "test_process: launch it with mpirun -np 4 (see tests/CMakeLists.txt)\n");
    return 2;
  }
  g_job = job.get();
  int status = RUN_ALL_TESTS();
  try {
    job->check_together([&] { STP_CHECK(status == 0, "tests failed"); });
  } catch (const stp::JobError& e) {
    std::fprintf(stderr, "test_process [process %d]: %s\n", job->rank(), e.what());
    status = 1;
  }
  return status;
}
