// MPI helpers shared by process/mpi/: error checks, the job-wide abort channel and the polling wait
// that every pending MPI operation goes through. Includes mpi.h: process/mpi/ only.
//
// Progress: the MPI library progresses communication only inside MPI calls (Open MPI has no
// progress thread), so a waiting operation polls MPI_Test, backing off from yields to sleeps of
// at most kMaxPollSleep, and between polls checks the abort channel.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "core/comm.h"
#include "base/error.h"

namespace stp::mpi {

inline constexpr auto kMaxPollSleep = std::chrono::microseconds(500);

// Throws stp::Error naming the call and MPI's message when rc is not MPI_SUCCESS (communicators
// use MPI_ERRORS_RETURN).
void check(int rc, const char* call);

// The job-wide abort channel: a duplicate of MPI_COMM_WORLD that carries one kind of message,
// the reason a process gave up. raise() records the reason and sends it to every other process;
// poll() notices a reason raised here or received from elsewhere. Thread-safe.
class JobAbort {
 public:
  explicit JobAbort(MPI_Comm world);  // duplicates world (collective)
  ~JobAbort();

  void raise(const std::string& why);
  bool poll();  // true once the job is aborted
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  std::string reason() const;
  [[noreturn]] void throw_aborted() const;  // CommunicatorAborted("communicator aborted: " + reason)

 private:
  void set(const std::string& why);
  MPI_Comm control_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;
  std::string reason_;
  std::string sent_;  // the broadcast text (alive while its sends are pending)
  std::vector<MPI_Request> sends_;
};

// Waits for `request` to complete, polling the abort channel. On abort the request is left
// pending (collectives cannot be cancelled; the process is going to end) and CommunicatorAborted
// is thrown. Returns the completion status.
MPI_Status wait(MPI_Request& request, JobAbort& abort);

// One step of the polling back-off: call with 0, 1, 2, ... while waiting.
void backoff(int iteration);

}  // namespace stp::mpi
