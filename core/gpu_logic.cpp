#include "core/gpu_logic.h"

#include <algorithm>
#include <set>

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

int nccl_version_code(int major, int minor, int patch) {
  if (major <= 2 && minor <= 8) return major * 1000 + minor * 100 + patch;
  return major * 10000 + minor * 100 + patch;
}

bool nccl_has_split_share(int version) { return version >= nccl_version_code(2, 18, 0); }

std::vector<SplitCall> plan_splits(const std::vector<SplitGroup>& groups, int parent_size) {
  STP_CHECK(parent_size >= 1, "a split needs a parent of at least one rank, got ", parent_size);
  std::vector<SplitCall> calls;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::vector<int>& members = groups[g].members;
    std::set<int> seen;
    for (int m : members) {
      STP_CHECK(m >= 0 && m < parent_size, "communicator group ", g, " names rank ", m, ", outside the parent's 0..",
                parent_size - 1);
      STP_CHECK(seen.insert(m).second, "communicator group ", g, " names rank ", m, " twice");
    }
    if (members.size() < 2) continue;
    auto fits = [&](const SplitCall& c) {
      if (c.family != groups[g].family) return false;
      return std::all_of(members.begin(), members.end(),
                         [&](int m) { return c.color[static_cast<std::size_t>(m)] == kSplitNoColor; });
    };
    auto it = std::find_if(calls.begin(), calls.end(), fits);
    if (it == calls.end()) {
      SplitCall c;
      c.family = groups[g].family;
      c.color.assign(static_cast<std::size_t>(parent_size), kSplitNoColor);
      c.key.assign(static_cast<std::size_t>(parent_size), 0);
      calls.push_back(std::move(c));
      it = calls.end() - 1;
    }
    const int color = static_cast<int>(it->groups.size());
    it->groups.push_back(static_cast<int>(g));
    for (std::size_t i = 0; i < members.size(); ++i) {
      it->color[static_cast<std::size_t>(members[i])] = color;
      it->key[static_cast<std::size_t>(members[i])] = static_cast<int>(i);
    }
  }
  return calls;
}

bool needs_private_parent(const std::vector<SplitCall>& calls) {
  return std::any_of(calls.begin(), calls.end(), [](const SplitCall& c) { return c.family == SplitFamily::Private; });
}

}  // namespace stp::gpu
