// StagedComm: collectives over buffers a communicator cannot read — the gradients, parameters and
// bf16 copies of a streamed chunk (memory.param_offload), which live in pinned host memory, under
// a communicator without host access (NCCL). Each call brings the part of the buffer the
// collective reads up into one device staging piece from the rank's arena, runs the same
// collective there, and copies the part the caller gets back down, all in order on the caller's
// stream; the piece is released with that stream recorded, so the device holds one piece at a
// time (the arena's stream-ordered reuse makes the pieces of a run one rotating block).
//
//   all_reduce_sum(s, data, count, piece)   in pieces of at most `piece` elements (0: one), each
//       brought up, all-reduced and brought back whole: elementwise, so the bits are those of
//       one all-reduce of the whole buffer.
//   reduce_scatter_sum(s, data, count)   one piece of `count` (the caller's bucket): the whole
//       buffer up, this rank's comm_slice back (the other slices of `data` keep their values;
//       the contract leaves them unspecified).
//   all_gather(s, data, count) / all_gather_bf16   one piece of `count`: this rank's slice up,
//       the whole buffer back.
//
// The same reduction of the same values as the collective on `data` itself, so on a backend whose
// communicator reads host memory (the CPU backend) the staged and the direct path give identical
// bits (tests/optim/staged_comm_test.cpp). With a null communicator (a dry run of a larger job:
// nothing is sent) the pieces are allocated and copied alike, so the plan counts them exactly.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/comm.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace stp {

struct StagedCommCounters {
  std::uint64_t pieces = 0;
  std::uint64_t h2d_bytes = 0, d2h_bytes = 0;
  std::size_t largest_piece_bytes = 0;
};

class StagedComm {
 public:
  // comm: null in a dry run; otherwise rank and size are its own. device_memory: the rank's arena.
  StagedComm(Communicator* comm, Allocator& device_memory, int rank, int size);

  void all_reduce_sum(Stream& s, float* data, std::size_t count, std::size_t piece);
  void reduce_scatter_sum(Stream& s, float* data, std::size_t count);
  void all_gather(Stream& s, float* data, std::size_t count);
  void all_gather_bf16(Stream& s, bf16* data, std::size_t count);

  const StagedCommCounters& counters() const { return counters_; }

 private:
  Tensor piece(Stream& s, std::size_t count, DType dtype);
  void up(Stream& s, void* device, const void* host, std::size_t bytes);
  void down(Stream& s, void* host, const void* device, std::size_t bytes);

  Communicator* comm_;
  Allocator& memory_;
  int rank_, size_;
  StagedCommCounters counters_;
};

}  // namespace stp
