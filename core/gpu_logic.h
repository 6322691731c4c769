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
//                                   uses.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>

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

}  // namespace stp::gpu
