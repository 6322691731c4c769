// The CUDA backend's GPU-free decisions (core/gpu_logic.h) against fake runtime functions that
// behave as the CUDA runtime and NCCL document (docs/gpu-readiness.md, section 8, findings 1–3, 6, 7).
#include "core/gpu_logic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "core/backend.h"

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

// ---- Communicators split from the world (finding 6) ----

namespace {

// The groups of a dp x pp x tp job in the order the trainer lists them (train/trainer_setup.cpp,
// build_communicators; global rank = (d * pp + p) * tp + t), without the world, which is the split
// parent itself: TP, the pipeline channels (activations p -> p+1 and gradients p+1 -> p) with the
// tied pair of each (d, t), DP, the replicas.
std::vector<SplitGroup> job_groups(int dp, int pp, int tp) {
  auto g = [&](int d, int p, int t) { return (d * pp + p) * tp + t; };
  std::vector<SplitGroup> out;
  for (int d = 0; d < dp; ++d)
    for (int p = 0; p < pp; ++p)
      if (tp > 1) {
        SplitGroup group;
        for (int t = 0; t < tp; ++t) group.members.push_back(g(d, p, t));
        out.push_back(group);
      }
  for (int d = 0; d < dp; ++d)
    for (int t = 0; t < tp; ++t) {
      for (int p = 0; p + 1 < pp; ++p) out.push_back({{g(d, p, t), g(d, p + 1, t)}, SplitFamily::Private});
      for (int p = 0; p + 1 < pp; ++p) out.push_back({{g(d, p + 1, t), g(d, p, t)}, SplitFamily::Private});
      if (pp > 1) out.push_back({{g(d, 0, t), g(d, pp - 1, t)}, SplitFamily::Shared});
    }
  for (int p = 0; p < pp; ++p)
    for (int t = 0; t < tp; ++t)
      if (dp > 1) {
        SplitGroup group;
        for (int d = 0; d < dp; ++d) group.members.push_back(g(d, p, t));
        out.push_back(group);
      }
  for (int d = 0; d < dp; ++d) {
    SplitGroup group{{}, SplitFamily::Shared};
    for (int i = 0; i < pp * tp; ++i) group.members.push_back(g(d, 0, 0) + i);
    out.push_back(group);
  }
  return out;
}

// What ncclCommSplit makes of one call (nccl.h): ranks with the same color form one child, ranked
// by key, ties broken by the parent rank; NCCL_SPLIT_NOCOLOR makes none. [color] the members in
// child rank order.
std::map<int, std::vector<int>> nccl_children(const SplitCall& call) {
  std::map<int, std::vector<std::pair<std::pair<int, int>, int>>> by_color;
  for (int r = 0; r < static_cast<int>(call.color.size()); ++r)
    if (call.color[static_cast<std::size_t>(r)] != kSplitNoColor)
      by_color[call.color[static_cast<std::size_t>(r)]].push_back({{call.key[static_cast<std::size_t>(r)], r}, r});
  std::map<int, std::vector<int>> out;
  for (auto& [color, list] : by_color) {
    std::sort(list.begin(), list.end());
    for (auto& e : list) out[color].push_back(e.second);
  }
  return out;
}

}  // namespace

TEST(GpuLogic, NcclVersionCodesFollowNcclsMacroAndGateSplitShare) {
  EXPECT_EQ(nccl_version_code(2, 8, 4), 2804);  // NCCL_VERSION before 2.9
  EXPECT_EQ(nccl_version_code(2, 18, 0), 21800);
  EXPECT_EQ(nccl_version_code(2, 28, 9), 22809);
  EXPECT_FALSE(nccl_has_split_share(2804));
  EXPECT_FALSE(nccl_has_split_share(21706));
  EXPECT_TRUE(nccl_has_split_share(21800));
  EXPECT_TRUE(nccl_has_split_share(22603));
}

TEST(GpuLogic, SplitsMakeEveryGroupWithItsRankOrder) {
  const std::vector<std::tuple<int, int, int>> layouts = {{1, 2, 1}, {1, 4, 2}, {2, 2, 2}, {2, 1, 4}, {3, 3, 1}};
  for (auto [dp, pp, tp] : layouts) {
    const int n = dp * pp * tp;
    const std::vector<SplitGroup> groups = job_groups(dp, pp, tp);
    const std::vector<SplitCall> calls = plan_splits(groups, n);
    std::vector<int> made(groups.size(), 0);
    for (const SplitCall& call : calls) {
      ASSERT_EQ(call.color.size(), static_cast<std::size_t>(n));
      ASSERT_EQ(call.key.size(), static_cast<std::size_t>(n));
      const auto children = nccl_children(call);
      ASSERT_EQ(children.size(), call.groups.size());
      for (const auto& [color, members] : children) {
        const SplitGroup& group = groups[static_cast<std::size_t>(call.groups[static_cast<std::size_t>(color)])];
        EXPECT_EQ(members, group.members) << "dp " << dp << " pp " << pp << " tp " << tp << " color " << color;
        EXPECT_EQ(group.family, call.family);
        ++made[static_cast<std::size_t>(call.groups[static_cast<std::size_t>(color)])];
      }
      for (int r = 0; r < n; ++r) {  // a rank in none of the call's groups passes NCCL_SPLIT_NOCOLOR
        bool member = false;
        for (int gi : call.groups)
          for (int m : groups[static_cast<std::size_t>(gi)].members) member = member || m == r;
        EXPECT_EQ(call.color[static_cast<std::size_t>(r)] == kSplitNoColor, !member);
      }
    }
    for (std::size_t g = 0; g < groups.size(); ++g)
      EXPECT_EQ(made[g], groups[g].members.size() >= 2 ? 1 : 0) << "group " << g;
  }
}

TEST(GpuLogic, SplitsBatchDisjointGroupsAndEveryRankMakesTheSameCalls) {
  // dp 2 x pp 2 x tp 2: 4 TP groups (one call), activations and gradients (one call each: the two
  // channels of one (d, t) share both ranks), the tied pairs (shared: a call of their own), DP (the
  // private calls are full: a new one), the replicas (the shared call is full: a new one). Each rank
  // lists the groups itself from the same config.
  std::vector<std::vector<SplitCall>> per_rank;
  for (int rank = 0; rank < 8; ++rank) per_rank.push_back(plan_splits(job_groups(2, 2, 2), 8));
  const std::vector<SplitCall>& calls = per_rank.front();
  ASSERT_EQ(calls.size(), 6u);
  const std::vector<SplitFamily> families = {SplitFamily::Private, SplitFamily::Private, SplitFamily::Private,
                                             SplitFamily::Shared,  SplitFamily::Private, SplitFamily::Shared};
  const std::vector<std::size_t> groups_per_call = {4, 4, 4, 4, 4, 2};
  for (std::size_t c = 0; c < calls.size(); ++c) {
    EXPECT_EQ(calls[c].family, families[c]) << "call " << c;
    EXPECT_EQ(calls[c].groups.size(), groups_per_call[c]) << "call " << c;
  }
  for (const auto& other : per_rank)
    for (std::size_t c = 0; c < calls.size(); ++c) {
      EXPECT_EQ(other[c].color, calls[c].color);
      EXPECT_EQ(other[c].key, calls[c].key);
      EXPECT_EQ(other[c].groups, calls[c].groups);
    }
  EXPECT_TRUE(needs_private_parent(calls));
  // Only compute-stream groups (pp 2, tp 1, dp 1: the tied pair and the replica): no private parent.
  std::vector<SplitGroup> shared_only = {{{0, 1}, SplitFamily::Shared}, {{0, 1}, SplitFamily::Shared}};
  const auto two = plan_splits(shared_only, 2);
  EXPECT_EQ(two.size(), 2u);  // the same two ranks twice: two calls
  EXPECT_FALSE(needs_private_parent(two));
}

TEST(GpuLogic, SplitKeysKeepTheGroupsRankOrderAndSkipGroupsOfOne) {
  // A channel from pipeline rank 3 to rank 1: group rank 0 is the source, whatever the world order.
  const auto calls = plan_splits({{{3, 1}, SplitFamily::Private}, {{2}, SplitFamily::Private}}, 4);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].color, (std::vector<int>{kSplitNoColor, 0, kSplitNoColor, 0}));
  EXPECT_EQ(calls[0].key[3], 0);
  EXPECT_EQ(calls[0].key[1], 1);
  EXPECT_EQ(nccl_children(calls[0]).at(0), (std::vector<int>{3, 1}));
  EXPECT_TRUE(plan_splits({{{0}, SplitFamily::Shared}}, 1).empty());  // one rank: make_self_comm
  EXPECT_THROW(plan_splits({{{0, 4}, SplitFamily::Private}}, 4), stp::Error);
  EXPECT_THROW(plan_splits({{{1, 1}, SplitFamily::Private}}, 4), stp::Error);
}

namespace {

// A communicator that records when it is destroyed.
class RecordingComm final : public stp::Communicator {
 public:
  RecordingComm(std::string name, std::vector<std::string>* log) : name_(std::move(name)), log_(log) {}
  ~RecordingComm() override { log_->push_back(name_); }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(stp::Stream&, float*, std::size_t) override {}
  void all_reduce_max(stp::Stream&, float*, std::size_t) override {}
  void reduce_scatter_sum(stp::Stream&, float*, std::size_t) override {}
  void all_gather(stp::Stream&, float*, std::size_t) override {}
  void all_gather_bf16(stp::Stream&, stp::bf16*, std::size_t) override {}
  void send(stp::Stream&, const void*, std::size_t, int, std::uint32_t) override {}
  void recv(stp::Stream&, void*, std::size_t, int, std::uint32_t) override {}
  void barrier(stp::Stream&) override {}
  void abort(const std::string&) override {}
  std::uint64_t bytes_sent() const override { return 0; }

 private:
  std::string name_;
  std::vector<std::string>* log_;
};

}  // namespace

TEST(GpuLogic, TeardownDestroysChildrenBeforeTheirParent) {
  // The trainer adds the world, then the private parent, then the children of each split call.
  std::vector<std::string> log;
  {
    stp::CommunicatorList comms;
    for (const char* name : {"world", "private parent", "tp", "channel", "replica"})
      comms.push_back(std::make_unique<RecordingComm>(name, &log));
    EXPECT_EQ(comms.size(), 5u);
  }
  EXPECT_EQ(log, (std::vector<std::string>{"replica", "channel", "tp", "private parent", "world"}));
}
