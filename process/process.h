// The processes of a job. A job is either one process, which drives every rank as threads (the
// default, and the only mode without an MPI launcher), or several processes started by an MPI
// launcher (`mpirun -np N stp train ...`, `srun`), each driving its share of the ranks.
//
// ProcessGroup is the job seen from one process: who it is, communicators that span processes,
// and how a failure reaches every process. Only process/mpi/ includes mpi.h; everything else goes
// through this header (docs/scale-out.md).
//
// Failure contract:
//   * ProcessGroup::abort(why) — and Communicator::abort on a communicator made by make_comm —
//     makes every pending and future operation of every cross-process communicator of the job
//     fail with CommunicatorAborted(why), on every process: the message is broadcast, and every
//     process's waiting operations poll for it, so a waiting rank gives up within milliseconds
//     with the failing rank's message instead of hanging.
//   * terminate(status) ends every process of the job at once (MPI_Abort). Only main() calls it,
//     after printing the error, so a job whose process failed never hangs in shutdown.
//   * check_together(fn) is for the checks every process makes identically before any
//     communication (the config, the rank layout): they fail together with JobError on every
//     process, which then ends normally with its own message.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/comm.h"
#include "core/device.h"
#include "base/error.h"

namespace stp {

// Thrown on every process of the job at the same point (ProcessGroup::check_together): each
// process reports it itself and the job ends normally, without MPI_Abort.
class JobError : public Error {
 public:
  using Error::Error;
};

class ProcessGroup {
 public:
  // Finalizes MPI. Only after a clean run or a JobError: after any other error, main() calls
  // terminate() instead (pending operations would make finalization hang).
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;       // this process, 0..size-1 (MPI_COMM_WORLD rank)
  virtual int size() const = 0;       // processes in the job
  virtual int node_rank() const = 0;  // this process among the processes on its node (GPU choice)

  // Runs fn on every process. When it throws stp::Error on any process, every process throws
  // JobError: its own message, or the message of the lowest failing process. fn must not
  // communicate. Collective: every process calls it at the same point.
  virtual void check_together(const std::function<void()>& fn) = 0;

  // The largest `value` over every process (collective), e.g. to agree on a stop signal that
  // reached only some of them.
  virtual int max(int value) = 0;

  // Logical OR of `flag` over every process (collective).
  bool any(bool flag) { return max(flag ? 1 : 0) != 0; }

  // This process's communicator in the group of processes `members` (group rank i = process
  // members[i], no repeats), or nullptr when this process is not a member. `device` is this
  // process's device in the group: CPU devices get an MPI communicator (process/mpi/mpi_comm.h),
  // CUDA devices an NCCL communicator whose unique id is broadcast over MPI. Collective over
  // every process of the job: all call it for every group, in the same order. split_parent (CUDA
  // devices, two or more members): the communicator is made for core/backend.h's split_comms, its
  // children sharing its resources (ncclConfig_t::splitShare = 1).
  virtual std::unique_ptr<Communicator> make_comm(const std::vector<int>& members, Device& device,
                                                  bool split_parent = false) = 0;

  // See the failure contract above. Idempotent: the first reason wins.
  virtual void abort(const std::string& why) = 0;

  // Ends every process of the job with `status` (MPI_Abort); does not return.
  [[noreturn]] virtual void terminate(int status) = 0;
};

// Whether an MPI launcher started this process (Open MPI, PMIx or PMI environment variables).
bool launched_by_mpi();

// The processes of this job on this host, as the launcher announced them: Open MPI's
// OMPI_COMM_WORLD_LOCAL_SIZE, MPICH's and Intel MPI's MPI_LOCALNRANKS, or Slurm's
// SLURM_NTASKS_PER_NODE (the first that is set and positive); 1 when none is (one process, or a
// launcher that does not say: memory.host_budget: auto then takes the whole machine's share for
// each process, so such a job sets memory.host_budget itself). Read before MPI starts, so
// `stp plan` under the same launcher sees the same count.
int processes_on_this_host();

// Whether this build has MPI support (STP_HAVE_MPI).
bool mpi_built();

// Starts MPI with MPI_THREAD_MULTIPLE when launched_by_mpi(), and returns the job; nullptr when
// not launched by MPI (one process drives every rank). Throws stp::Error when MPI cannot give
// MPI_THREAD_MULTIPLE, or when launched with several processes by a build without MPI. Call at
// most once per process; the returned object finalizes MPI.
std::unique_ptr<ProcessGroup> start_processes();

}  // namespace stp
