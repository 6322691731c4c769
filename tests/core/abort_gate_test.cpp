// AbortGate (core/abort_gate.h), the serialisation NcclComm puts between an abort and the
// operations other rank threads are issuing (docs/gpu-readiness.md, How a CUDA failure reaches the user): the abort
// action runs exactly once and never while a use is in progress, and nothing new starts after the request.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/abort_gate.h"

namespace {

using namespace std::chrono_literals;

TEST(AbortGate, AbortWithNobodyInsideRunsTheActionAtOnceAndOnce) {
  int runs = 0;
  stp::AbortGate g([&] { ++runs; });
  { stp::GateUse use(g); }
  EXPECT_TRUE(g.abort("rank 1 failed: boom"));
  EXPECT_EQ(runs, 1);
  EXPECT_FALSE(g.abort("again"));
  EXPECT_EQ(runs, 1);
  EXPECT_TRUE(g.done());
  try {
    g.enter();
    FAIL() << "an operation started after the abort";
  } catch (const stp::CommunicatorAborted& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 failed: boom"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(g.try_enter());
}

TEST(AbortGate, AbortDuringAUseIsDeferredToTheLastLeave) {
  int runs = 0;
  stp::AbortGate g([&] { ++runs; });
  g.enter();  // thread A is inside an NCCL call
  g.enter();  // ... and thread B too (or A has the comm in an open group)
  EXPECT_TRUE(g.abort("peer failed"));
  EXPECT_EQ(runs, 0) << "ncclCommAbort would free the communicator under the calls in progress";
  EXPECT_FALSE(g.done());
  EXPECT_THROW(g.enter(), stp::CommunicatorAborted);
  g.leave();
  EXPECT_EQ(runs, 0);
  g.leave();
  EXPECT_EQ(runs, 1);
  EXPECT_TRUE(g.done());
}

TEST(AbortGate, ConcurrentUsesAndAbortsNeverOverlapTheAction) {
  for (int round = 0; round < 20; ++round) {
    std::atomic<int> inside{0}, runs{0}, overlaps{0};
    stp::AbortGate g([&] {
      if (inside.load() != 0) ++overlaps;
      ++runs;
    });
    std::atomic<bool> go{false};
    std::vector<std::thread> users;
    for (int t = 0; t < 4; ++t)
      users.emplace_back([&] {
        while (!go.load()) std::this_thread::yield();
        for (int i = 0; i < 10000; ++i) {
          if (!g.try_enter()) return;
          ++inside;
          std::this_thread::yield();
          --inside;  // before leave(): once left, the action may run
          g.leave();
        }
      });
    std::vector<std::thread> aborters;
    for (int t = 0; t < 3; ++t)
      aborters.emplace_back([&, t] {
        while (!go.load()) std::this_thread::yield();
        std::this_thread::sleep_for(std::chrono::microseconds(100 * (t + 1)));
        g.abort("abort " + std::to_string(t));
      });
    go = true;
    for (auto& t : users) t.join();
    for (auto& t : aborters) t.join();
    EXPECT_EQ(runs.load(), 1) << "round " << round;
    EXPECT_EQ(overlaps.load(), 0) << "round " << round;
  }
}

}  // namespace
