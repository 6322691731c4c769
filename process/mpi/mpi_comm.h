// MpiComm: core/comm.h across processes on the CPU backend, over MPI. One member per process.
//
// Every operation is enqueued on the caller's CPU stream (as HostComm's): the stream task posts
// non-blocking MPI operations and waits for their requests (mpi::wait: polling, abort-aware), so
// the operation completes through the stream's order and events like any other stream work.
//
//   * Issue order: MPI matches collectives and messages by the order they are posted, while
//     stream tasks of one communicator may run on different streams. Each operation takes a
//     ticket when it is enqueued (host order) and posts its MPI calls only in ticket order, so
//     every process posts in its host issue order, as HostComm matches by sequence number.
//   * all_reduce_sum is deterministic and bitwise equal to HostComm's: the vector is cut into
//     one slice per rank; MPI_Ialltoallv gives rank r every rank's copy of slice r, which it sums
//     in rank order (s = x0 + x1 + ...), and MPI_Iallgatherv gives everyone every summed slice.
//     Traffic per rank ~ 2 (n-1)/n of the vector, like a ring all-reduce.
//   * send is buffered like HostComm's: the task copies the message (a 16-byte header with the
//     tag and the size, then the bytes) and posts MPI_Isend without waiting; the stream goes on.
//     recv posts MPI_Irecv for header + bytes and checks the tag and size on arrival (a mismatch
//     is an error that aborts the job, never silent corruption). Messages of one (src, dst) pair
//     arrive in send order (MPI's non-overtaking rule).
//   * abort (and any error inside an operation) raises the job-wide abort (mpi::JobAbort): every
//     pending and future operation of every process fails with the reason.
// Limits: one message or all-reduce slice is at most INT_MAX elements (MPI counts are int).
#pragma once

#include <mpi.h>

#include <memory>

#include "core/comm.h"
#include "process/mpi/mpi_util.h"

namespace stp::mpi {

// Takes ownership of `comm` (freed at destruction unless the job was aborted).
std::unique_ptr<Communicator> make_mpi_comm(MPI_Comm comm, std::shared_ptr<JobAbort> abort);

}  // namespace stp::mpi
