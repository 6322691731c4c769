// NcclComm: core/comm.h on NCCL. In one process (one thread per GPU) a group's communicators are
// created together (ncclCommInitRankConfig for every device inside one NCCL group); across
// processes (one GPU each) with ncclCommInitRankConfig from a unique id that rank 0 of the group
// creates and process/mpi/ broadcasts over MPI. From NCCL 2.18 the trainer makes only the world
// that way (a split parent: ncclConfig_t::splitShare = 1) and splits every other group from it
// (split_nccl_comms, ncclCommSplit; core/gpu_logic.h, plan_splits, says which groups share the
// world's resources and why).
// Every operation is enqueued on the caller's stream; its completion is that stream's order.
// NCCL has no message tags: the tag is ignored here (HostComm checks it on the CPU backend, where
// the same schedules run, so channel-order mismatches are caught before a GPU run).
//
// Failure handling (docs/gpu-readiness.md, How a CUDA failure reaches the user):
//   * Non-blocking communicators (ncclConfig_t::blocking = 0): no NCCL call blocks its host
//     thread waiting for a peer (connection set-up runs in the background and the call returns
//     ncclInProgress). stp then polls ncclCommGetAsyncError until the operation is enqueued, so
//     every call still returns with its work on the stream (the ordering arguments of
//     gpu-readiness.md section 4 hold unchanged), and the poll notices an abort or an
//     asynchronous error instead of waiting for ever.
//   * abort() goes through an AbortGate (core/abort_gate.h): ncclCommAbort frees the
//     communicator, so it runs once, and only when no thread is inside an NCCL call on it or has
//     operations on it queued in an open NCCL group; those threads finish (or notice the abort in
//     their poll and stop) and the last one runs it. Later operations throw CommunicatorAborted.
//   * Asynchronous errors (a failed peer or network, ncclCommGetAsyncError) are polled while
//     enqueuing and, through nccl_poll_async_errors(), by CudaStream::synchronize while it waits:
//     such an error aborts the communicator and throws a DeviceError instead of hanging.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "core/abort_gate.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"
#include "core/gpu_logic.h"
#include "core/launch.h"

namespace stp {

namespace {

class NcclComm;

// Every live communicator of the process, for nccl_poll_async_errors().
std::mutex registry_mu;
std::set<NcclComm*>& registry() {
  static std::set<NcclComm*> r;
  return r;
}

// NCCL groups are per host thread and span communicators: the communicators with operations in
// this thread's open group, released (AbortGate::leave) after the outermost ncclGroupEnd.
thread_local int group_depth = 0;
thread_local std::vector<NcclComm*> group_members;

// The NCCL the CUDA backend is written and reviewed against: 2.26 and later (groups spanning
// communicators progress together; docs/gpu-readiness.md section 8, finding 4). The pipeline no
// longer depends on it (one communicator and stream per channel, schedule/p2p_groups.h), but
// nothing older has been reviewed. Refused before any communicator is made.
void require_nccl_version() {
  int version = 0;
  STP_CUDA_CHECK(ncclGetVersion(&version));
  if (version < NCCL_VERSION(2, 26, 0))
    throw Error(str("NCCL ", version < 10000 ? version / 1000 : version / 10000, ".",
                    version < 10000 ? version / 100 % 10 : version / 100 % 100, ".", version % 100,
                    " is too old: stp needs NCCL 2.26 or later (the version its CUDA backend is reviewed "
                    "against; install a newer libnccl2, or point NCCL_ROOT at one)"));
}

// NCCL (2.22 and later) connects peers lazily, at a communicator's first operation: in the middle
// of step 1, after the arena took memory.device_budget, and for each channel of each communicator
// separately. NCCL_RUNTIME_CONNECT=0 makes communicator initialisation connect everything, so
// NCCL's buffers exist before the arena reserves and the trainer can measure them
// (Trainer::DeviceMemory::communicator_bytes). A value the user set is kept. Called before the
// first NCCL call of the process, while no NCCL thread reads the environment.
void connect_at_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
    unsetenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");  // stp decides per communicator (nonblocking_config)
  });
}

// splitShare (NCCL 2.18): the children split from this communicator share its resources. NCCL
// reads it from the parent's config when the parent is split. NCCL_COMM_SPLIT_SHARE_RESOURCES,
// when set, overrides every config's value (src/init.cc, parseCommConfig), so connect_at_init
// removes it: a 1 there would make the private parent share and serialize TP, DP and the pipeline
// channels (core/gpu_logic.h, SplitFamily).
ncclConfig_t nonblocking_config(bool split_parent = false) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.splitShare = split_parent ? 1 : 0;
  return config;
}

// Waits until `comm` has no operation in progress. `stop` is checked between polls (an abort
// requested by another thread); then false is returned without waiting longer. Errors throw.
bool wait_ready(ncclComm_t comm, const std::function<bool()>& stop, const char* what) {
  for (int spins = 0;; ++spins) {
    ncclResult_t state = ncclSuccess;
    STP_CUDA_CHECK(ncclCommGetAsyncError(comm, &state));
    if (state == ncclSuccess) return true;
    if (state != ncclInProgress) ::stp::cuda::fail(state, what, __FILE__, __LINE__);
    if (stop && stop()) return false;
    if (spins < 1000) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

class NcclComm final : public Communicator {
 public:
  NcclComm(ncclComm_t comm, int rank, int size, int ordinal)
      : comm_(comm), rank_(rank), size_(size), ordinal_(ordinal), gate_([this] { (void)ncclCommAbort(comm_); }) {
    cuda::set_device(ordinal_);
    STP_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
    std::lock_guard<std::mutex> lock(registry_mu);
    registry().insert(this);
  }
  ~NcclComm() override {
    {
      std::lock_guard<std::mutex> lock(registry_mu);
      registry().erase(this);
    }
    cuda::set_device_quietly(ordinal_);
    (void)cudaFree(scratch_);
    if (gate_.requested()) {
      // Aborted: ncclCommAbort has run, or runs now if a thread died with this communicator in
      // its open group (its leave() never came).
      if (!gate_.done()) (void)ncclCommAbort(comm_);
      return;
    }
    // A non-blocking communicator is finalized (flushing its operations) before it is destroyed:
    // ncclCommFinalize answers ncclInProgress and completes in the background, so its state is
    // polled (ncclCommGetAsyncError) until ncclSuccess (finding 3, gpu::finalize_then_destroy);
    // if that fails, never completes, or the GPU is poisoned, abort instead of hanging here.
    if (gpu::device_health().poisoned()) {
      (void)ncclCommAbort(comm_);
      return;
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    gpu::FinalizeApi api;
    api.success = ncclSuccess;
    api.in_progress = ncclInProgress;
    api.finalize = [this] { return static_cast<int>(ncclCommFinalize(comm_)); };
    api.state = [this](int* state) {
      ncclResult_t st = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &st);
      *state = static_cast<int>(st);
      return static_cast<int>(r);
    };
    api.destroy = [this] { return static_cast<int>(ncclCommDestroy(comm_)); };
    api.abort = [this] { return static_cast<int>(ncclCommAbort(comm_)); };
    api.pause = [] { std::this_thread::sleep_for(std::chrono::microseconds(100)); };
    api.timed_out = [deadline] { return std::chrono::steady_clock::now() > deadline; };
    (void)gpu::finalize_then_destroy(api);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::uint64_t bytes_sent() const override { return bytes_sent_.load(); }

  void all_reduce_sum(Stream& stream, float* data, std::size_t count) override {
    issue("ncclAllReduce", [&] { return ncclAllReduce(data, data, count, ncclFloat, ncclSum, comm_, handle(stream)); });
    bytes_sent_ += count * sizeof(float);
  }
  void all_reduce_max(Stream& stream, float* data, std::size_t count) override {
    issue("ncclAllReduce (max)",
          [&] { return ncclAllReduce(data, data, count, ncclFloat, ncclMax, comm_, handle(stream)); });
    bytes_sent_ += count * sizeof(float);
  }
  // Even slices (count a multiple of the size): NCCL's own in-place collectives. Uneven ones: one
  // reduce (or broadcast) per slice, rooted at its owner, in one group.
  void reduce_scatter_sum(Stream& stream, float* data, std::size_t count) override {
    const CommSlice mine = comm_slice(count, rank_, size_);
    if (count % static_cast<std::size_t>(size_) == 0) {
      issue("ncclReduceScatter", [&] {
        return ncclReduceScatter(data, data + mine.first, mine.count, ncclFloat, ncclSum, comm_, handle(stream));
      });
    } else {
      group_begin();
      for (int r = 0; r < size_; ++r) {
        const CommSlice s = comm_slice(count, r, size_);
        issue("ncclReduce", [&] {
          return ncclReduce(data + s.first, data + s.first, s.count, ncclFloat, ncclSum, r, comm_, handle(stream));
        });
      }
      group_end();
    }
    bytes_sent_ += (count - mine.count) * sizeof(float);
  }
  void all_gather(Stream& stream, float* data, std::size_t count) override { gather(stream, data, count, ncclFloat); }
  void all_gather_bf16(Stream& stream, bf16* data, std::size_t count) override {
    gather(stream, data, count, ncclBfloat16);
  }
  void send(Stream& stream, const void* data, std::size_t bytes, int peer, std::uint32_t) override {
    issue("ncclSend", [&] { return ncclSend(data, bytes, ncclChar, peer, comm_, handle(stream)); });
    bytes_sent_ += bytes;
  }
  void recv(Stream& stream, void* data, std::size_t bytes, int peer, std::uint32_t) override {
    issue("ncclRecv", [&] { return ncclRecv(data, bytes, ncclChar, peer, comm_, handle(stream)); });
  }
  void barrier(Stream& stream) override {
    issue("ncclAllReduce (barrier)",
          [&] { return ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, handle(stream)); });
  }
  void abort(const std::string& why) override { gate_.abort(why); }

  // Groups are per host thread and span communicators (ncclGroupStart/End). The outermost end
  // launches what the group queued; with non-blocking communicators it may return ncclInProgress,
  // so every member is polled until its operations are on their streams, then released.
  void group_begin() override {
    STP_CUDA_CHECK(ncclGroupStart());
    ++group_depth;
  }
  void group_end() override {
    STP_ASSERT(group_depth > 0, "group_end without group_begin");
    ncclResult_t r = ncclGroupEnd();
    if (--group_depth > 0) {
      if (r != ncclSuccess) ::stp::cuda::fail(r, "ncclGroupEnd()", __FILE__, __LINE__);
      return;
    }
    std::vector<NcclComm*> members;
    std::swap(members, group_members);
    std::exception_ptr error;
    if (r != ncclSuccess && r != ncclInProgress) {
      try {
        ::stp::cuda::fail(r, "ncclGroupEnd()", __FILE__, __LINE__);
      } catch (...) {
        error = std::current_exception();
      }
    }
    for (NcclComm* c : members) {
      if (!error) {
        try {
          c->wait_enqueued("ncclGroupEnd()");
        } catch (...) {
          error = std::current_exception();
        }
      }
      c->gate_.leave();  // after an error too: a pending abort must still run
    }
    if (error) std::rethrow_exception(error);
  }

  // Polls this communicator's asynchronous error state (thread-safe); on an error other than
  // "in progress", aborts it and throws DeviceError. No-op once aborted.
  void poll_async_error() {
    if (!gate_.try_enter()) return;
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    gate_.leave();
    if (r == ncclSuccess && (state == ncclSuccess || state == ncclInProgress)) return;
    ncclResult_t bad = r != ncclSuccess ? r : state;
    std::string why = str("NCCL asynchronous error on the communicator of rank ", rank_, "/", size_, " (GPU ", ordinal_,
                          "): ", ncclGetErrorString(bad), " (", static_cast<int>(bad), ")");
    gate_.abort(why);
    throw DeviceError(why);
  }
  int ordinal() const { return ordinal_; }
  ncclComm_t handle() const { return comm_; }

 private:
  // One NCCL call: inside the gate; outside a group it is polled until enqueued, inside a group
  // the communicator stays entered until the group's end.
  template <class Call>
  void issue(const char* what, Call&& call) {
    GateUse use(gate_);
    ncclResult_t r = call();
    if (r != ncclSuccess && r != ncclInProgress) ::stp::cuda::fail(r, what, __FILE__, __LINE__);
    if (group_depth > 0) {
      if (std::find(group_members.begin(), group_members.end(), this) == group_members.end()) {
        group_members.push_back(this);
        use.release();  // left in group_end()
      }
      return;
    }
    wait_enqueued(what);
  }
  void wait_enqueued(const char* what) {
    if (!wait_ready(
            comm_, [this] { return gate_.requested(); }, what))
      throw CommunicatorAborted(str("communicator aborted: ", gate_.why()));
  }
  static cudaStream_t handle(Stream& s) { return static_cast<cudaStream_t>(cuda_stream_handle(s)); }
  static std::size_t element_bytes(ncclDataType_t type) { return type == ncclBfloat16 ? 2 : 4; }

  // In place: ncclAllGather when every slice has the same size (its send buffer is this rank's
  // slice of the receive buffer, which NCCL allows in place); otherwise one broadcast per slice.
  void gather(Stream& stream, void* data, std::size_t count, ncclDataType_t type) {
    const CommSlice mine = comm_slice(count, rank_, size_);
    auto* bytes = static_cast<char*>(data);
    const std::size_t e = element_bytes(type);
    if (count % static_cast<std::size_t>(size_) == 0) {
      issue("ncclAllGather",
            [&] { return ncclAllGather(bytes + mine.first * e, bytes, mine.count, type, comm_, handle(stream)); });
    } else {
      group_begin();
      for (int r = 0; r < size_; ++r) {
        const CommSlice s = comm_slice(count, r, size_);
        issue("ncclBroadcast", [&] {
          return ncclBroadcast(bytes + s.first * e, bytes + s.first * e, s.count, type, r, comm_, handle(stream));
        });
      }
      group_end();
    }
    bytes_sent_ += (count - mine.count) * e;
  }

  ncclComm_t comm_;
  int rank_, size_, ordinal_;
  float* scratch_ = nullptr;
  std::atomic<std::uint64_t> bytes_sent_{0};
  AbortGate gate_;
};

}  // namespace

void nccl_poll_async_errors(int ordinal) {
  std::vector<NcclComm*> mine;
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    for (NcclComm* c : registry())
      if (c->ordinal() == ordinal) mine.push_back(c);
  }
  // The trainer destroys communicators only after every rank thread has joined, so none of
  // these dies while a rank's synchronize polls it.
  for (NcclComm* c : mine) c->poll_async_error();
}

std::vector<std::unique_ptr<Communicator>> make_nccl_comms(const std::vector<Device*>& devices, bool split_parent) {
  connect_at_init();
  require_nccl_version();
  int n = static_cast<int>(devices.size());
  std::vector<int> ordinals;
  for (auto* d : devices) ordinals.push_back(d->index());
  std::vector<ncclComm_t> comms(devices.size());
  ncclUniqueId id;
  STP_CUDA_CHECK(ncclGetUniqueId(&id));
  ncclConfig_t config = nonblocking_config(split_parent);
  // ncclCommInitAll takes no config: the equivalent, one ncclCommInitRankConfig per device in a group.
  STP_CUDA_CHECK(ncclGroupStart());
  for (int r = 0; r < n; ++r) {
    cuda::set_device(ordinals[static_cast<std::size_t>(r)]);
    ncclResult_t res = ncclCommInitRankConfig(&comms[static_cast<std::size_t>(r)], n, id, r, &config);
    if (res != ncclSuccess && res != ncclInProgress) {
      (void)ncclGroupEnd();
      ::stp::cuda::fail(res, "ncclCommInitRankConfig(...)", __FILE__, __LINE__);
    }
  }
  ncclResult_t end = ncclGroupEnd();
  cuda::forget_current_device();  // the group may leave another GPU current
  if (end != ncclSuccess && end != ncclInProgress) ::stp::cuda::fail(end, "ncclGroupEnd() (init)", __FILE__, __LINE__);
  for (ncclComm_t c : comms) wait_ready(c, nullptr, "ncclCommInitRankConfig(...)");
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r)
    out.push_back(
        std::make_unique<NcclComm>(comms[static_cast<std::size_t>(r)], r, n, ordinals[static_cast<std::size_t>(r)]));
  return out;
}

std::vector<char> nccl_unique_id() {
  connect_at_init();
  ncclUniqueId id;
  STP_CUDA_CHECK(ncclGetUniqueId(&id));
  const char* bytes = reinterpret_cast<const char*>(&id);
  return std::vector<char>(bytes, bytes + sizeof id);
}

std::size_t nccl_unique_id_size() { return sizeof(ncclUniqueId); }

std::unique_ptr<Communicator> make_nccl_comm_rank(Device& device, int size, int rank,
                                                  const std::vector<char>& unique_id, bool split_parent) {
  STP_ASSERT(unique_id.size() == sizeof(ncclUniqueId), "NCCL unique id of ", unique_id.size(), " bytes, expected ",
             sizeof(ncclUniqueId));
  connect_at_init();
  require_nccl_version();
  ncclUniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof id);
  cuda::set_device(device.index());
  ncclComm_t comm;
  ncclConfig_t config = nonblocking_config(split_parent);
  ncclResult_t res = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  cuda::forget_current_device();  // NCCL may leave another GPU current
  if (res != ncclSuccess && res != ncclInProgress)
    ::stp::cuda::fail(res, "ncclCommInitRankConfig(...)", __FILE__, __LINE__);
  wait_ready(comm, nullptr, "ncclCommInitRankConfig(...)");
  return std::make_unique<NcclComm>(comm, rank, size, device.index());
}

bool nccl_split_available(std::string* why) {
  connect_at_init();  // before the process's first NCCL call
  int version = 0;
  STP_CUDA_CHECK(ncclGetVersion(&version));
  if (gpu::nccl_has_split_share(version)) return true;
  if (why)
    *why = str("NCCL (version code ", version, ") has no ncclCommSplit with shared resources (NCCL 2.18 or later has)");
  return false;
}

// One ncclCommSplit per local parent inside one NCCL group (several devices of this process, like
// the initialisation above; one device in a multi-process job). Non-blocking parents: the call and
// the group end may answer ncclInProgress; NCCL then runs the split in the background, keeps the
// parent's state at ncclInProgress until it is done, and writes the child's handle only when it is
// complete (src/init.cc, ncclCommSplit), so every parent is polled to completion before a child is
// read. The caller guarantees that no operation is outstanding on a parent (NCCL requires it of a
// split): the trainer splits while it builds, before any rank runs.
std::vector<std::unique_ptr<Communicator>> split_nccl_comms(const std::vector<Communicator*>& parents,
                                                            const std::vector<int>& colors,
                                                            const std::vector<int>& keys, bool share) {
  const std::size_t n = parents.size();
  std::vector<NcclComm*> ps;
  for (Communicator* c : parents) {
    auto* p = dynamic_cast<NcclComm*>(c);
    STP_ASSERT(p != nullptr, "split_comms: a parent that is not an NCCL communicator");
    ps.push_back(p);
  }
  std::vector<ncclComm_t> children(n, nullptr);
  ncclConfig_t config = nonblocking_config(share);
  STP_CUDA_CHECK(ncclGroupStart());
  for (std::size_t i = 0; i < n; ++i) {
    cuda::set_device(ps[i]->ordinal());
    const int color = colors[i] < 0 ? NCCL_SPLIT_NOCOLOR : colors[i];
    ncclResult_t res = ncclCommSplit(ps[i]->handle(), color, colors[i] < 0 ? 0 : keys[i], &children[i], &config);
    if (res != ncclSuccess && res != ncclInProgress) {
      (void)ncclGroupEnd();
      ::stp::cuda::fail(res, "ncclCommSplit(...)", __FILE__, __LINE__);
    }
  }
  ncclResult_t end = ncclGroupEnd();
  cuda::forget_current_device();  // the group may leave another GPU current
  if (end != ncclSuccess && end != ncclInProgress) ::stp::cuda::fail(end, "ncclGroupEnd() (split)", __FILE__, __LINE__);
  for (NcclComm* p : ps) wait_ready(p->handle(), nullptr, "ncclCommSplit(...) (the parent's state)");
  std::vector<std::unique_ptr<Communicator>> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (colors[i] < 0) {
      STP_ASSERT(children[i] == nullptr, "ncclCommSplit with NCCL_SPLIT_NOCOLOR returned a communicator");
      continue;
    }
    STP_CHECK(children[i] != nullptr, "ncclCommSplit completed without a communicator for color ", colors[i],
              " on GPU ", ps[i]->ordinal());
    wait_ready(children[i], nullptr, "ncclCommSplit(...)");
    int rank = 0, size = 0;
    STP_CUDA_CHECK(ncclCommUserRank(children[i], &rank));
    STP_CUDA_CHECK(ncclCommCount(children[i], &size));
    out[i] = std::make_unique<NcclComm>(children[i], rank, size, ps[i]->ordinal());
  }
  return out;
}

}  // namespace stp
