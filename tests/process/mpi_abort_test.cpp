// Failures across processes (each test runs in its own `mpirun -np 4`: an aborted job stays aborted):
//   * a receive whose message has another tag fails on the receiver with both tags named, and
//     every other process's pending operation fails with that message (no hang);
//   * Communicator::abort on one process makes the operations other processes wait in fail
//     within a few seconds with its reason, and later operations fail at once.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/comm.h"
#include "core/cpu/cpu_device.h"
#include "tests/process/mpi_env.h"

namespace {

using stp::testing::job;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

TEST(MpiAbort, TagMismatchFailsTheReceiverAndEveryPeer) {
  auto devs = stp::make_cpu_devices(1);
  auto comm = job().make_comm({0, 1, 2, 3}, *devs[0]);
  auto stream = devs[0]->create_stream("s");
  const int me = job().rank();
  std::vector<float> buf(16, 1.0f);
  auto start = Clock::now();
  if (me == 0) comm->send(*stream, buf.data(), 64, 1, 5);
  if (me == 1) comm->recv(*stream, buf.data(), 64, 0, 6);
  if (me >= 2) comm->recv(*stream, buf.data(), 64, 0, 9);  // never sent: only the abort ends it
  if (me == 0) comm->barrier(*stream);                     // the others never join it
  try {
    stream->synchronize();
    ADD_FAILURE() << "process " << me << " completed";
  } catch (const stp::Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("expected message tag 6 of 64 bytes, got tag 5 of 64 bytes"), std::string::npos) << what;
    if (me != 1) {
      EXPECT_NE(what.find("communicator aborted"), std::string::npos) << what;
    }
  }
  EXPECT_LT(seconds_since(start), 5.0);
}

TEST(MpiAbort, AbortReachesWaitingPeersWithItsReason) {
  auto devs = stp::make_cpu_devices(1);
  auto comm = job().make_comm({0, 1, 2, 3}, *devs[0]);
  auto stream = devs[0]->create_stream("s");
  const int me = job().rank();
  std::vector<float> buf(8, 1.0f);
  auto start = Clock::now();
  if (me == 2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the others are waiting by now
    comm->abort("process two gave up");
  } else {
    comm->all_reduce_sum(*stream, buf.data(), buf.size());
    try {
      stream->synchronize();
      ADD_FAILURE() << "the all-reduce completed without process 2";
    } catch (const stp::CommunicatorAborted& e) {
      EXPECT_NE(std::string(e.what()).find("process two gave up"), std::string::npos) << e.what();
    }
    EXPECT_LT(seconds_since(start), 5.0);
  }
  // Later operations fail at once on every process.
  comm->barrier(*stream);
  EXPECT_THROW(stream->synchronize(), stp::CommunicatorAborted);
}

}  // namespace
