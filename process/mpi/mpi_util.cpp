#include "process/mpi/mpi_util.h"

#include <algorithm>
#include <thread>

namespace stp::mpi {

namespace {
constexpr int kAbortTag = 1;
}

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  throw Error(str(call, " failed: ", std::string(text, static_cast<std::size_t>(len)), " (MPI error ", rc, ")"));
}

void backoff(int iteration) {
  if (iteration < 32) {
    std::this_thread::yield();
    return;
  }
  auto sleep =
      std::chrono::microseconds(std::min<long>(kMaxPollSleep.count(), 10L << std::min(6, (iteration - 32) / 8)));
  std::this_thread::sleep_for(sleep);
}

JobAbort::JobAbort(MPI_Comm world) {
  check(MPI_Comm_dup(world, &control_), "MPI_Comm_dup");
  check(MPI_Comm_rank(control_, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(control_, &size_), "MPI_Comm_size");
}

JobAbort::~JobAbort() {
  // After an abort, sends may be pending and peers gone: the process is ending, leave them.
  if (!aborted() && control_ != MPI_COMM_NULL) (void)MPI_Comm_free(&control_);
}

void JobAbort::set(const std::string& why) {
  // Caller holds mu_.
  reason_ = why;
  aborted_.store(true, std::memory_order_release);
}

void JobAbort::raise(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted()) return;
  set(why);
  sent_ = why;
  sends_.assign(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    // Best effort: a failed send still leaves this process aborted (and main() terminates the job).
    (void)MPI_Isend(sent_.data(), static_cast<int>(sent_.size()), MPI_CHAR, p, kAbortTag, control_,
                    &sends_[static_cast<std::size_t>(p)]);
  }
}

bool JobAbort::poll() {
  if (aborted()) return true;
  int flag = 0;
  MPI_Message message;
  MPI_Status status;
  if (MPI_Improbe(MPI_ANY_SOURCE, kAbortTag, control_, &flag, &message, &status) != MPI_SUCCESS || !flag)
    return aborted();
  int count = 0;
  MPI_Get_count(&status, MPI_CHAR, &count);
  std::string why(static_cast<std::size_t>(std::max(count, 0)), '\0');
  MPI_Mrecv(why.data(), count, MPI_CHAR, &message, MPI_STATUS_IGNORE);
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted()) set(why);
  return true;
}

std::string JobAbort::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

void JobAbort::throw_aborted() const { throw CommunicatorAborted("communicator aborted: " + reason()); }

MPI_Status wait(MPI_Request& request, JobAbort& abort) {
  MPI_Status status{};
  for (int i = 0;; ++i) {
    int done = 0;
    check(MPI_Test(&request, &done, &status), "MPI_Test");
    if (done) return status;
    if (abort.poll()) abort.throw_aborted();
    backoff(i);
  }
}

}  // namespace stp::mpi
