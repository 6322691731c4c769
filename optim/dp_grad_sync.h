// Data-parallel gradient reduction of one rank: after the backward, every gradient of the rank's
// stages is summed over the data-parallel replicas (the DP group: the ranks with the same pp and
// tp rank in every replica), so all replicas take the same optimizer step.
//
// Buckets: each local chunk's gradients are one flat buffer (Stage::flat_grads, models/param_store.h); it is cut
// into buckets of at most `bucket_bytes` (0 = the whole chunk), each reduced by one in-place
// all-reduce on the rank's dp-comm stream.
//
// Overlap (chunk granularity): the executor reports when a chunk's gradients are final on the
// compute stream — after the last op of the step that runs a backward (B or W) of that chunk
// (the executor's grads_final hook, train/executor.h) — and that chunk's buckets start right then on dp-comm
// (a stream wait on an event, never a host wait), while compute goes on with the other chunks'
// backward. Schedules with two chunks per rank (1f1b-i, zb-v, stp) thus hide the later chunk's
// reduction under the earlier chunk's remaining backward; with one chunk per rank the reduction
// follows the backward (docs/scale-out.md).
//
// Per step (driven by ReplicatedOptimizer, optim/replicated_optimizer.h): begin_step(); the
// executor calls chunk_final(c) once per chunk; finish() starts any
// chunk not yet reported and makes compute wait for every bucket. Gradients are summed, not
// averaged: the loss scale 1 / (microbatches · dp) already makes the sum the global mean.
//
// Staged chunks (a streamed chunk's gradients live in pinned host memory, which a communicator
// such as NCCL cannot read): each bucket goes through one device staging piece of the bucket's
// size on dp-comm (optim/staged_comm.h: up, all-reduce, down), the same sums. Without a
// communicator (a dry run of a larger job) only the staged chunks' pieces are allocated and copied.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "core/comm.h"
#include "core/device.h"
#include "core/tensor.h"
#include "optim/staged_comm.h"

namespace stp {

class DpGradSync {
 public:
  // chunk_grads[c]: local chunk c's flat gradient buffer; staged[c]: whether it goes through
  // `staging` (empty: none). dp: null in a dry run. The communicator and streams must outlive this
  // object.
  DpGradSync(std::vector<Tensor> chunk_grads, Communicator* dp, Device& device, Stream& compute, Stream& dp_stream,
             std::size_t bucket_bytes, bool trace, std::vector<bool> staged = {},
             std::unique_ptr<StagedComm> staging = nullptr);

  void begin_step();
  void chunk_final(int chunk);
  void finish();

  std::size_t buckets() const;  // all-reduces per step

 private:
  struct Chunk {
    Tensor grads;
    std::vector<std::pair<std::size_t, std::size_t>> buckets;  // (first element, elements)
    std::unique_ptr<Event> final;
    bool started = false, staged = false;
  };
  std::vector<Chunk> chunks_;
  Communicator* dp_;
  std::unique_ptr<StagedComm> staging_;
  Stream& compute_;
  Stream& dp_stream_;
  std::unique_ptr<Event> done_;
  bool trace_;
};

}  // namespace stp
