// The CUDA backend's decisions that do not need a GPU, in plain C++ so the CPU build compiles and
// tests them with fake runtime functions (tests/core/gpu_logic_test.cpp). core/cuda/ calls them
// with the real CUDA/NCCL functions. Status codes are ints (the runtime's enum values).
//
//   * after_query / launch checks   finding 1 (docs/gpu-readiness.md, section 8): a query's
//                                   "not ready" is expected and leaves no error behind; a stale
//                                   error is never blamed on a kernel launch;
//   * DeviceHealth                  finding 2: after a sticky error the GPU is poisoned; release
//                                   paths (destructors) do nothing instead of throwing, work
//                                   paths throw the first error;
//   * finalize_then_destroy         finding 3: ncclCommFinalize on a non-blocking communicator
//                                   returns "in progress"; poll it to completion, then destroy;
//   * select_gpu                    finding 7: which visible GPU a process of a multi-process job
//                                   uses;
//   * plan_splits                   finding 6: the communicator groups as ncclCommSplit calls from
//                                   one world communicator (colors, keys, order, which share).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace stp::gpu {

// The calling thread's CUDA "last error" (cudaGetLastError: returns it and resets it to success)
// and the runtime's codes the logic needs.
struct LastError {
  int success = 0;
  int not_ready = 600;                       // cudaErrorNotReady
  std::function<int()> take;                 // cudaGetLastError
  std::function<std::string(int)> describe;  // cudaGetErrorString
};

enum class QueryState { Done, NotReady, Failed };

// After cudaEventQuery / cudaStreamQuery returned `status`: NotReady is an expected answer, and
// the runtime also leaves it as the thread's last error, so it is taken here (the next launch
// check would otherwise report it); a different error found there belongs to an earlier call and
// throws DeviceError naming it. Failed: the last error is taken and the caller reports `status`.
QueryState after_query(int status, const LastError& last);

// Before a kernel launch: takes the last error. NotReady (an expected query answer) is dropped;
// any other error is not this launch's: DeviceError naming it as an earlier failure.
void before_launch(const LastError& last, const char* kernel);
// After a kernel launch: its own error, DeviceError "CUDA kernel launch failed (KERNEL): MESSAGE".
void after_launch(const LastError& last, const char* kernel);

// Process-wide state of the GPUs: poisoned after the first sticky error (the CUDA context is
// unusable and every later call fails, so only the first message is worth reporting).
class DeviceHealth {
 public:
  void poison(const std::string& what);  // keeps the first
  bool poisoned() const { return poisoned_.load(std::memory_order_acquire); }
  std::string first_error() const;
  // Work paths (enqueueing, synchronizing): throws DeviceError naming the first error.
  void check_usable() const;
  // Release paths (free, event record/wait/query in a fence, destroy): runs `call` only while
  // healthy; once poisoned does nothing, so a destructor never throws an echo of the first error.
  template <class F>
  void release(F&& call) const {
    if (!poisoned()) call();
  }
  void reset_for_tests();

 private:
  std::atomic<bool> poisoned_{false};
  mutable std::mutex mu_;
  std::string first_;
};
DeviceHealth& device_health();

// ncclCommFinalize then ncclCommDestroy (or ncclCommAbort when finalizing fails or outlasts
// `timeout`). `in_progress` / `success` are NCCL's codes; `state` reads ncclCommGetAsyncError
// (returns the call's status, writes the communicator's state).
struct FinalizeApi {
  int success = 0;
  int in_progress = 7;  // ncclInProgress
  std::function<int()> finalize;
  std::function<int(int* state)> state;
  std::function<int()> destroy;
  std::function<int()> abort;
  std::function<void()> pause;  // between polls
  std::function<bool()> timed_out;
};
// Returns true if the communicator was finalized and destroyed, false if it was aborted.
bool finalize_then_destroy(const FinalizeApi& api);

// The GPU ordinal a process of a multi-process job uses, among the GPUs it sees (after
// CUDA_VISIBLE_DEVICES): with one visible GPU (the launcher bound one GPU to each process, e.g.
// `srun --gpus-per-task=1`) GPU 0; with several, this process's rank on its node (one process
// per GPU, all GPUs visible to all). Throws stp::Error when the node rank has no GPU.
int select_gpu(int visible, int node_rank, int per_process = 1);

// ---- Communicators split from one world communicator (docs/gpu-readiness.md, finding 6) ----
//
// The CUDA backend makes one NCCL communicator over every rank of the job (the world, created with
// ncclConfig_t::splitShare = 1) and derives the other groups from it with ncclCommSplit(parent,
// color, key, &child, &config): ranks passing the same color form one child, ordered by key; a
// rank passing NCCL_SPLIT_NOCOLOR gets no child (nccl.h). Every rank of the parent takes part in
// every call (an all-gather of colors and keys), in the same order (NCCL derives each child from
// the parent's count of splits so far), so the calls are a pure function of the groups, which every
// process derives identically from the config.
//
// NCCL decides sharing by the parent: a child of a parent created with splitShare = 1 shares the
// parent's resources, and communicators that share them launch their kernels through one internal
// stream, so their operations run one after another on the GPU in the order the host issued them,
// whatever CUDA streams the caller passed (NCCL's src/init.cc, ncclCommSplit and commAlloc;
// src/enqueue.cc, ncclLaunchPrepare/ncclLaunchFinish). Hence two families:
//   * Shared: groups whose every operation is issued on the rank's compute stream (world, replica,
//     tied embedding). They are ordered by that stream already, so sharing adds no order.
//   * Private: groups with streams of their own that must run concurrently (TP on tp-comm, the
//     vocab-parallel TP group, DP on dp-comm, every pipeline channel on its own stream). Sharing
//     would serialize them in issue order, which brings back the crossed sends that one channel
//     per stream removed (schedule/p2p_groups.h) and stops TP and DP from overlapping compute. They
//     are split from a second parent: one split of the world with every rank in color 0 and
//     splitShare = 0 in its config (it shares the world's resources; its own children do not).

constexpr int kSplitNoColor = -1;  // NCCL_SPLIT_NOCOLOR

// NCCL's version code (ncclGetVersion, the NCCL_VERSION macro of nccl.h): major*1000 + minor*100 +
// patch before 2.9, major*10000 + minor*100 + patch from 2.9 on.
int nccl_version_code(int major, int minor, int patch);
// ncclCommSplit and ncclConfig_t::splitShare first shipped in NCCL 2.18.0. Older: one
// ncclCommInitRank per group, as before.
bool nccl_has_split_share(int version);

enum class SplitFamily { Shared, Private };

struct SplitGroup {
  std::vector<int> members;  // parent ranks; the group rank of members[i] is i
  SplitFamily family = SplitFamily::Private;
};

// One ncclCommSplit call, collective over every rank of its parent (the world for Shared, the
// private parent for Private; both rank r = world rank r).
struct SplitCall {
  SplitFamily family = SplitFamily::Private;
  std::vector<int> color;   // [parent rank] the color of its group in this call, or kSplitNoColor
  std::vector<int> key;     // [parent rank] its group rank (0 with kSplitNoColor)
  std::vector<int> groups;  // [color] index of that group in the input
};

// The calls that make every group of two or more members (a group of one gets no NCCL
// communicator: core/backend.h, make_self_comm), in the order they must be made. Each group goes
// into the first call of its family in which it shares no rank with the groups already there
// (ncclCommSplit gives each rank one color per call), else into a new call; calls keep the order of
// their first group. Throws stp::Error on a member outside [0, parent_size) or a repeated member.
std::vector<SplitCall> plan_splits(const std::vector<SplitGroup>& groups, int parent_size);

// Whether `calls` need the private parent (some call is Private).
bool needs_private_parent(const std::vector<SplitCall>& calls);

}  // namespace stp::gpu
