// MpiJob: ProcessGroup over MPI_COMM_WORLD (process/process.h).
#include "process/mpi/mpi_job.h"

#include <algorithm>
#include <cstdlib>

#include "process/mpi/mpi_comm.h"
#include "process/mpi/mpi_util.h"
#include "core/backend.h"
#if defined(STP_HAVE_CUDA)
#include "core/cuda/cuda_backend.h"
#endif

namespace stp {

namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
  }
}

class MpiJob final : public ProcessGroup {
 public:
  MpiJob() {
    int provided = MPI_THREAD_SINGLE;
    mpi::check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    if (provided < MPI_THREAD_MULTIPLE) {
      MPI_Finalize();
      throw Error(str("the MPI library provides ", thread_level_name(provided),
                      ", stp needs MPI_THREAD_MULTIPLE (every rank's streams call MPI concurrently); use an MPI "
                      "built with thread support (Debian's Open MPI is)"));
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    mpi::check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    mpi::check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
    MPI_Comm node;
    mpi::check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
               "MPI_Comm_split_type");
    mpi::check(MPI_Comm_rank(node, &node_rank_), "MPI_Comm_rank");
    MPI_Comm_free(&node);
    abort_ = std::make_shared<mpi::JobAbort>(MPI_COMM_WORLD);
  }

  // After an abort, requests of the aborted communicators stay pending (they are never freed);
  // MPI_Finalize still completes when every process reaches it. After an error that was not
  // raised by every process main() terminates the job instead (process/process.h).
  ~MpiJob() override {
    abort_.reset();
    MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int node_rank() const override { return node_rank_; }

  void check_together(const std::function<void()>& fn) override {
    std::string mine;
    try {
      fn();
    } catch (const Error& e) {
      mine = e.what();
      if (mine.empty()) mine = "unknown error";
    }
    int me = mine.empty() ? size_ : rank_, first = size_;
    mpi::check(MPI_Allreduce(&me, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce");
    if (first == size_) return;
    int len = first == rank_ ? static_cast<int>(mine.size()) : 0;
    mpi::check(MPI_Bcast(&len, 1, MPI_INT, first, MPI_COMM_WORLD), "MPI_Bcast");
    std::string text = first == rank_ ? mine : std::string(static_cast<std::size_t>(len), '\0');
    mpi::check(MPI_Bcast(text.data(), len, MPI_CHAR, first, MPI_COMM_WORLD), "MPI_Bcast");
    throw JobError(mine.empty() ? str("process ", first, " failed: ", text) : mine);
  }

  int max(int value) override {
    int all = 0;
    mpi::check(MPI_Allreduce(&value, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
    return all;
  }

  std::unique_ptr<Communicator> make_comm(const std::vector<int>& members, Device& device,
                                          bool split_parent = false) override {
    auto it = std::find(members.begin(), members.end(), rank_);
    const int index = it == members.end() ? -1 : static_cast<int>(it - members.begin());
    MPI_Comm comm = MPI_COMM_NULL;
    mpi::check(MPI_Comm_split(MPI_COMM_WORLD, index >= 0 ? 0 : MPI_UNDEFINED, index, &comm), "MPI_Comm_split");
    if (index < 0) return nullptr;
    if (device.kind() == DeviceKind::Cpu) return mpi::make_mpi_comm(comm, abort_);
#if defined(STP_HAVE_CUDA)
    if (members.size() == 1) {  // the identity: no NCCL communicator (core/backend.h)
      MPI_Comm_free(&comm);
      return make_self_comm();
    }
    std::vector<char> id = index == 0 ? nccl_unique_id() : std::vector<char>(nccl_unique_id_size());
    int rc = MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_BYTE, 0, comm);
    MPI_Comm_free(&comm);
    mpi::check(rc, "MPI_Bcast (NCCL unique id)");
    return make_nccl_comm_rank(device, static_cast<int>(members.size()), index, id, split_parent);
#else
    (void)split_parent;
    STP_UNREACHABLE("CUDA device in a build without CUDA");
#endif
  }

  void abort(const std::string& why) override { abort_->raise(why); }

  [[noreturn]] void terminate(int status) override {
    MPI_Abort(MPI_COMM_WORLD, status);
    std::abort();  // MPI_Abort does not return; if it ever did, still end this process
  }

 private:
  int rank_ = 0, size_ = 1, node_rank_ = 0;
  std::shared_ptr<mpi::JobAbort> abort_;
};

}  // namespace

std::unique_ptr<ProcessGroup> start_mpi_job() { return std::make_unique<MpiJob>(); }

}  // namespace stp
