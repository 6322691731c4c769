// The CUDA backend's GPU-free decisions (core/gpu_logic.h) against fake runtime functions that
// behave as the CUDA runtime and NCCL document (docs/gpu-readiness.md, section 8, findings 1–3, 7).
#include "core/gpu_logic.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/error.h"

using namespace stp::gpu;

namespace {

constexpr int kSuccess = 0, kNotReady = 600, kIllegalAddress = 700;

// A thread's last error as the runtime keeps it: a query that answers "not ready" leaves it set.
struct FakeRuntime {
  int last = kSuccess;
  LastError api() {
    LastError l;
    l.success = kSuccess;
    l.not_ready = kNotReady;
    l.take = [this] {
      int e = last;
      last = kSuccess;
      return e;
    };
    l.describe = [](int e) {
      return std::string(e == kNotReady ? "device not ready" : e == kIllegalAddress ? "an illegal memory access" : "?");
    };
    return l;
  }
  int query_not_ready() {
    last = kNotReady;
    return kNotReady;
  }
};

std::string launch_error(FakeRuntime& rt, bool check_before) {
  try {
    if (check_before) before_launch(rt.api(), "F");
    after_launch(rt.api(), "F");  // the fake launch itself succeeds: nothing new is set
  } catch (const stp::DeviceError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(GpuLogic, APollThatReturnsNotReadyLeavesNoErrorForTheNextLaunch) {
  FakeRuntime rt;
  EXPECT_EQ(after_query(rt.query_not_ready(), rt.api()), QueryState::NotReady);
  EXPECT_EQ(launch_error(rt, true), "");
  EXPECT_EQ(after_query(kSuccess, rt.api()), QueryState::Done);
}

TEST(GpuLogic, WithoutClearingTheLaunchCheckWouldBlameTheLaunch) {
  FakeRuntime rt;
  rt.query_not_ready();  // the unfixed poll: NotReady left behind
  EXPECT_EQ(launch_error(rt, false), "CUDA kernel launch failed (F): device not ready");
  rt.query_not_ready();  // the fixed launch check drops a stale NotReady
  EXPECT_EQ(launch_error(rt, true), "");
}

TEST(GpuLogic, AStaleRealErrorIsReportedAsEarlierNotAsTheLaunch) {
  FakeRuntime rt;
  rt.last = kIllegalAddress;
  std::string e = launch_error(rt, true);
  EXPECT_NE(e.find("an earlier CUDA call failed before the launch of F: an illegal memory access (700)"),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find("kernel launch failed"), std::string::npos) << e;
  rt.last = kIllegalAddress;  // found by a query that answers NotReady
  EXPECT_THROW(after_query(kNotReady, rt.api()), stp::DeviceError);
  EXPECT_EQ(after_query(kIllegalAddress, rt.api()), QueryState::Failed);
}

TEST(GpuLogic, APoisonedDeviceKeepsTheFirstErrorAndReleasesWithoutThrowing) {
  DeviceHealth h;
  int released = 0;
  h.release([&] { ++released; });
  EXPECT_EQ(released, 1);
  EXPECT_NO_THROW(h.check_usable());
  h.poison("cudaStreamQuery(stream_) failed: an illegal memory access was encountered (700)");
  h.poison("cudaEventRecord(...) failed: an illegal memory access was encountered (700)");
  EXPECT_EQ(h.first_error(), "cudaStreamQuery(stream_) failed: an illegal memory access was encountered (700)");
  // A release path (e.g. a fence's event record from a destructor) does nothing and cannot throw.
  EXPECT_NO_THROW(h.release([] { throw stp::DeviceError("echo of the first error"); }));
  h.release([&] { ++released; });
  EXPECT_EQ(released, 1);
  try {
    h.check_usable();
    ADD_FAILURE() << "no throw";
  } catch (const stp::DeviceError& e) {
    EXPECT_EQ(
        std::string(e.what()),
        "the GPU failed earlier: cudaStreamQuery(stream_) failed: an illegal memory access was encountered (700)");
  }
}

namespace {

constexpr int kInProgress = 7, kSystemError = 2;

struct FakeComm {
  int finalize_result = kInProgress;
  std::vector<int> states;  // answers of ncclCommGetAsyncError, in order
  int polls = 0, paused = 0, budget = 1000;
  std::vector<std::string> calls;
  FinalizeApi api() {
    FinalizeApi a;
    a.success = kSuccess;
    a.in_progress = kInProgress;
    a.finalize = [this] {
      calls.push_back("finalize");
      return finalize_result;
    };
    a.state = [this](int* s) {
      *s = states[static_cast<std::size_t>(std::min<int>(polls++, static_cast<int>(states.size()) - 1))];
      return kSuccess;
    };
    a.destroy = [this] {
      calls.push_back("destroy");
      return kSuccess;
    };
    a.abort = [this] {
      calls.push_back("abort");
      return kSuccess;
    };
    a.pause = [this] { ++paused; };
    a.timed_out = [this] { return paused >= budget; };
    return a;
  }
};

}  // namespace

TEST(GpuLogic, FinalizeInProgressIsPolledThenDestroyed) {
  FakeComm c;
  c.states = {kInProgress, kInProgress, kSuccess};
  EXPECT_TRUE(finalize_then_destroy(c.api()));
  EXPECT_EQ(c.calls, (std::vector<std::string>{"finalize", "destroy"}));
  EXPECT_EQ(c.paused, 2);
}

TEST(GpuLogic, FinalizeErrorsOrTimeoutsAbort) {
  FakeComm failed;
  failed.states = {kInProgress, kSystemError};
  EXPECT_FALSE(finalize_then_destroy(failed.api()));
  EXPECT_EQ(failed.calls, (std::vector<std::string>{"finalize", "abort"}));
  FakeComm refused;
  refused.finalize_result = kSystemError;
  refused.states = {kSuccess};
  EXPECT_FALSE(finalize_then_destroy(refused.api()));
  EXPECT_EQ(refused.calls, (std::vector<std::string>{"finalize", "abort"}));
  FakeComm stuck;
  stuck.states = {kInProgress};
  stuck.budget = 5;
  EXPECT_FALSE(finalize_then_destroy(stuck.api()));
  EXPECT_EQ(stuck.calls, (std::vector<std::string>{"finalize", "abort"}));
  EXPECT_EQ(stuck.paused, 5);
}

TEST(GpuLogic, GpuSelectionWorksWithOneOrAllGpusVisible) {
  for (int node_rank : {0, 1, 3, 7}) EXPECT_EQ(select_gpu(1, node_rank), 0);          // srun --gpus-per-task=1
  for (int node_rank : {0, 1, 3, 7}) EXPECT_EQ(select_gpu(8, node_rank), node_rank);  // every GPU visible
  EXPECT_EQ(select_gpu(4, 0, 4), 0);                                                  // one process driving four GPUs
  EXPECT_EQ(select_gpu(8, 1, 4), 4);
  try {
    select_gpu(2, 3);
    ADD_FAILURE() << "no throw";
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("process 3 on this node needs GPU(s) 3..3 but sees 2"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(select_gpu(0, 0), stp::Error);
}
