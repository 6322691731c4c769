// Communicators: one interface for the collectives and point-to-point transfers of the runtime,
// enqueued on a stream like any other work and completing through that stream's events.
//
//   HostComm  (core/cpu/host_comm.cpp)    — CPU ranks: threads of one process, shared memory.
//   MpiComm   (process/mpi/mpi_comm.cpp)  — CPU ranks in separate processes, over MPI.
//   NcclComm  (core/cuda/nccl_comm.cu)    — GPUs: NCCL communicators, one thread per GPU in a
//                                           process, or one GPU per process.
// The dry run's communicators (make_null_comms, core/cpu/dry_stream.h) do nothing.
//
// Contract (every communicator that moves data):
//   * every rank of a communicator issues the same collectives in the same order;
//   * all_reduce_sum reduces in place; the result is identical on every rank (HostComm sums
//     in rank order, so it is also deterministic run to run); all_reduce_max likewise leaves the
//     elementwise maximum over ranks (exact, so identical on every rank on every backend);
//   * reduce_scatter_sum and all_gather work in place on a buffer of the same count on every
//     rank, cut into size() slices by comm_slice (rank r owns slice r). reduce_scatter_sum leaves
//     the sum over ranks in this rank's slice, bitwise what all_reduce_sum leaves there (HostComm
//     and MpiComm sum in rank order; NCCL makes no such promise), and the other slices
//     unspecified; all_gather copies every rank's slice to every rank. One all-reduce is one
//     reduce_scatter_sum then one all_gather;
//   * send/recv on a directed pair (src -> dst) deliver in issue order; `tag` is a debugging
//     aid that HostComm and MpiComm check (a mismatch — e.g. two ranks disagreeing on the order
//     of message kinds on a channel — is an error instead of silent corruption); sizes must match;
//   * errors inside a collective abort the whole communicator: every rank's pending operation
//     fails (rethrown at Stream::synchronize) instead of hanging.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "base/error.h"

namespace stp {

// What a pending or later operation throws after Communicator::abort: an echo of another rank's
// failure, so callers can report the original error instead.
class CommunicatorAborted : public Error {
 public:
  using Error::Error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual void all_reduce_sum(Stream& stream, float* data, std::size_t count) = 0;  // (count,)
  virtual void all_reduce_max(Stream& stream, float* data, std::size_t count) = 0;  // (count,)
  virtual void reduce_scatter_sum(Stream& stream, float* data, std::size_t count) = 0;
  virtual void all_gather(Stream& stream, float* data, std::size_t count) = 0;
  // all_gather of bf16 elements: the same slices (comm_slice of count), their bits copied.
  virtual void all_gather_bf16(Stream& stream, bf16* data, std::size_t count) = 0;
  virtual void send(Stream& stream, const void* data, std::size_t bytes, int peer, std::uint32_t tag) = 0;
  virtual void recv(Stream& stream, void* data, std::size_t bytes, int peer, std::uint32_t tag) = 0;
  virtual void barrier(Stream& stream) = 0;

  // Point-to-point operations between group_begin and group_end are issued together (NCCL pairs
  // blocking sends and receives only within a group). HostComm sends are buffered: no-ops there.
  virtual void group_begin() {}
  virtual void group_end() {}

  // Makes every pending and future operation of the group fail with `why` (on all ranks), so a
  // rank that hit an error never leaves its peers waiting forever.
  virtual void abort(const std::string& why) = 0;

  // Bytes this rank has sent (all-reduce counts its buffer once per call; reduce-scatter and
  // all-gather count the buffer less this rank's slice, (n-1)/n of it), for accounting.
  virtual std::uint64_t bytes_sent() const = 0;
};

// Rank r's slice of a (count,) buffer among `size` ranks in reduce_scatter_sum / all_gather:
// elements [first, first + count) with first = count * r / size (slices differ by at most one).
struct CommSlice {
  std::size_t first, count;
};
inline CommSlice comm_slice(std::size_t count, int rank, int size) {
  const auto r = static_cast<std::size_t>(rank), n = static_cast<std::size_t>(size);
  return CommSlice{count * r / n, count * (r + 1) / n - count * r / n};
}

// Emulated interconnect of HostComm: an all-reduce of `bytes` (one rank's buffer) takes at least
// bytes / all_reduce_bytes_per_s seconds, so braiding can be studied on the CPU backend, where
// shared-memory reductions are otherwise nearly free. 0 = as fast as memory allows.
struct HostCommOptions {
  double all_reduce_bytes_per_s = 0;
};

// `size` in-process communicators forming one group (index i = rank i). CPU streams only.
std::vector<std::unique_ptr<Communicator>> make_host_comms(int size, const HostCommOptions& options = {});

}  // namespace stp
