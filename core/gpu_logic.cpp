#include "core/gpu_logic.h"

#include "base/error.h"

namespace stp::gpu {

QueryState after_query(int status, const LastError& last) {
  if (status == last.success) return QueryState::Done;
  if (status == last.not_ready) {
    int pending = last.take();
    if (pending != last.success && pending != last.not_ready)  // a real error of an earlier call
      throw DeviceError(str("a CUDA call failed before this query: ", last.describe(pending), " (", pending, ")"));
    return QueryState::NotReady;
  }
  (void)last.take();
  return QueryState::Failed;
}

void before_launch(const LastError& last, const char* kernel) {
  int pending = last.take();
  if (pending == last.success || pending == last.not_ready) return;
  throw DeviceError(str("an earlier CUDA call failed before the launch of ", kernel, ": ", last.describe(pending), " (",
                        pending, "); not a failure of this launch"));
}

void after_launch(const LastError& last, const char* kernel) {
  int e = last.take();
  if (e != last.success) throw DeviceError(str("CUDA kernel launch failed (", kernel, "): ", last.describe(e)));
}

void DeviceHealth::poison(const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (poisoned_.load()) return;
  first_ = what;
  poisoned_.store(true, std::memory_order_release);
}

std::string DeviceHealth::first_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return first_;
}

void DeviceHealth::check_usable() const {
  if (poisoned()) throw DeviceError(str("the GPU failed earlier: ", first_error()));
}

void DeviceHealth::reset_for_tests() {
  std::lock_guard<std::mutex> lock(mu_);
  first_.clear();
  poisoned_.store(false);
}

DeviceHealth& device_health() {
  static DeviceHealth h;
  return h;
}

bool finalize_then_destroy(const FinalizeApi& api) {
  int r = api.finalize();
  bool ok = r == api.success || r == api.in_progress;  // non-blocking: "in progress" is the normal answer
  while (ok) {
    int state = api.success;
    if (api.state(&state) != api.success) ok = false;
    else if (state == api.success) break;
    else if (state != api.in_progress || api.timed_out()) ok = false;
    else api.pause();
  }
  (void)(ok ? api.destroy() : api.abort());
  return ok;
}

int select_gpu(int visible, int node_rank, int per_process) {
  STP_CHECK(visible >= 1, "no GPU is visible to this process (CUDA_VISIBLE_DEVICES)");
  if (visible == per_process) return 0;  // the launcher bound this process's GPUs
  int first = node_rank * per_process;
  STP_CHECK(first + per_process <= visible, "process ", node_rank, " on this node needs GPU(s) ", first, "..",
            first + per_process - 1, " but sees ", visible,
            " (bind one GPU per process, e.g. srun --gpus-per-task=1, or make every GPU of the node visible to every "
            "process; CUDA_VISIBLE_DEVICES)");
  return first;
}

}  // namespace stp::gpu
