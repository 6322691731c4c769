// NcclComm: core/comm.h on NCCL. In one process (one thread per GPU) groups are created with
// ncclCommInitAll over the devices of the group (TP and PP groups are separate communicators);
// across processes (one GPU each) with ncclCommInitRank from a unique id that rank 0 of the group
// creates and core/mpi broadcasts over MPI.
// Every operation is enqueued on the caller's stream; its completion is that stream's order.
// NCCL has no message tags: the tag is ignored here (HostComm checks it on the CPU backend, where
// the same schedules run, so channel-order mismatches are caught before a GPU run).
//
// abort(): ncclCommAbort frees the communicator, so it runs once, and every later operation of
// this object throws CommunicatorAborted instead of touching the freed handle; the destructor
// does not destroy an aborted communicator again. Known limit (docs/gpu-readiness.md): the
// trainer aborts every rank's communicator from the failing rank's thread, and an operation
// another rank's thread is enqueueing at that very moment is not fenced against the abort.
#include <cuda_runtime.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"
#include "core/launch.h"

namespace stp {

namespace {

class NcclComm final : public Communicator {
 public:
  NcclComm(ncclComm_t comm, int rank, int size, int ordinal) : comm_(comm), rank_(rank), size_(size), ordinal_(ordinal) {
    STP_CUDA_CHECK(cudaSetDevice(ordinal_));
    STP_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
  }
  ~NcclComm() override {
    (void)cudaSetDevice(ordinal_);
    (void)cudaFree(scratch_);
    if (!aborted_.load()) (void)ncclCommDestroy(comm_);  // ncclCommAbort already freed it
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::uint64_t bytes_sent() const override { return bytes_sent_.load(); }

  void all_reduce_sum(Stream& stream, float* data, std::size_t count) override {
    check_alive();
    bytes_sent_ += count * sizeof(float);
    STP_CUDA_CHECK(ncclAllReduce(data, data, count, ncclFloat, ncclSum, comm_, handle(stream)));
  }
  void send(Stream& stream, const void* data, std::size_t bytes, int peer, std::uint32_t) override {
    check_alive();
    bytes_sent_ += bytes;
    STP_CUDA_CHECK(ncclSend(data, bytes, ncclChar, peer, comm_, handle(stream)));
  }
  void recv(Stream& stream, void* data, std::size_t bytes, int peer, std::uint32_t) override {
    check_alive();
    STP_CUDA_CHECK(ncclRecv(data, bytes, ncclChar, peer, comm_, handle(stream)));
  }
  void barrier(Stream& stream) override {
    check_alive();
    STP_CUDA_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, handle(stream)));
  }
  void abort(const std::string& why) override {
    {
      std::lock_guard<std::mutex> lock(why_mu_);
      if (aborted_.load()) return;  // once: a second ncclCommAbort would free the comm twice
      why_ = why;
      aborted_.store(true);
    }
    (void)ncclCommAbort(comm_);
  }
  // Groups are per host thread and span communicators (ncclGroupStart/End); they touch no comm.
  void group_begin() override { STP_CUDA_CHECK(ncclGroupStart()); }
  void group_end() override { STP_CUDA_CHECK(ncclGroupEnd()); }

 private:
  void check_alive() {
    if (!aborted_.load()) return;
    std::lock_guard<std::mutex> lock(why_mu_);
    throw CommunicatorAborted(str("communicator aborted: ", why_));
  }
  static cudaStream_t handle(Stream& s) { return static_cast<cudaStream_t>(cuda_stream_handle(s)); }
  ncclComm_t comm_;
  int rank_, size_, ordinal_;
  float* scratch_ = nullptr;
  std::atomic<std::uint64_t> bytes_sent_{0};
  std::atomic<bool> aborted_{false};
  std::mutex why_mu_;
  std::string why_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_comms(const std::vector<Device*>& devices) {
  int n = static_cast<int>(devices.size());
  std::vector<int> ordinals;
  for (auto* d : devices) ordinals.push_back(d->index());
  std::vector<ncclComm_t> comms(devices.size());
  STP_CUDA_CHECK(ncclCommInitAll(comms.data(), n, ordinals.data()));
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r)
    out.push_back(std::make_unique<NcclComm>(comms[static_cast<std::size_t>(r)], r, n, ordinals[static_cast<std::size_t>(r)]));
  return out;
}

std::vector<char> nccl_unique_id() {
  ncclUniqueId id;
  STP_CUDA_CHECK(ncclGetUniqueId(&id));
  const char* bytes = reinterpret_cast<const char*>(&id);
  return std::vector<char>(bytes, bytes + sizeof id);
}

std::size_t nccl_unique_id_size() { return sizeof(ncclUniqueId); }

std::unique_ptr<Communicator> make_nccl_comm_rank(Device& device, int size, int rank, const std::vector<char>& unique_id) {
  STP_ASSERT(unique_id.size() == sizeof(ncclUniqueId), "NCCL unique id of ", unique_id.size(), " bytes, expected ",
             sizeof(ncclUniqueId));
  ncclUniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof id);
  STP_CUDA_CHECK(cudaSetDevice(device.index()));
  ncclComm_t comm;
  STP_CUDA_CHECK(ncclCommInitRank(&comm, size, id, rank));
  return std::make_unique<NcclComm>(comm, rank, size, device.index());
}

}  // namespace stp
