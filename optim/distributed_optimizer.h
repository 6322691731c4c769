// The distributed optimizer of one rank (parallel.distributed_optimizer with dp > 1, ZeRO-1;
// optim/rank_optimizer.h): the dp replicas of a (pp, tp) position split the AdamW state between
// them, each updating only the part of every gradient bucket it owns.
//
// Ownership: each local chunk's flat gradient (and parameter) buffer is cut into the same buckets
// as the DP all-reduce (parallel.dp_bucket; 0 = one bucket per chunk); rank d of the dp ranks owns
// slice d of every bucket (core/comm.h: comm_slice). Owned slices are split at parameter
// boundaries into segments, each updated with its parameter's weight decay.
//
// Per step (replacing DpGradSync + AdamW + the grad clipper over whole tensors):
//   begin_step(lr); the executor reports chunk c's gradients final (the grads_final hook) and that
//   chunk's buckets are reduce-scattered on the dp stream, overlapped with the rest of the
//   backward; chunks holding a tied parameter wait for finish_gradients(sum_tied), which runs the
//   caller's tied-gradient sum (over whole tensors, before any reduction: the sum is linear) first.
//   After it compute has waited for every reduce-scatter: the owned slices hold the sum over
//   replicas, exactly what the all-reduce leaves there (HostComm, MPI: the same rank-order sum).
//   grad_sumsq / clip: global-norm clipping over the owned segments; the sum of squares is summed
//   over the replica *and* the dp ranks (each owns a disjoint part of every gradient).
//   step(lr): AdamW on the owned segments (compute stream; back-to-back segments of a device
//   chunk fused into one flat run, adamw_flat_step, which reads the gradients times the clip
//   coefficient: clip() scales only the host chunks' gradients), then every bucket's parameters are
//   all-gathered on the dp stream, chunk by chunk (a chunk's all-gather overlaps the next chunk's
//   update; offloaded (host), it waits for that chunk's upload). The all-gathers are left in
//   flight: the next step's first use of a chunk waits for that chunk's (params_needed, a stream
//   wait), so the next step's forward of one chunk overlaps the all-gather of the others;
//   anything outside a step waits for all (settle).
//
// State: per chunk, one flat exp_avg and one flat exp_avg_sq of sum over buckets of
// ceil(bucket / dp) elements — the same bytes on every replica, so the planner's dry run (one
// replica, dp_rank 0, no communicator) allocates exactly what every rank does: 1/dp of the whole
// AdamW state, rounded up per bucket.
//
// Sharded masters (bf16, StageSpec::shard_masters): a chunk's flat gradients are [head | tail]:
// the head's parameters have f32 masters in the chunk's flat parameters; the tail's
// (ParamInfo::sharded_master) have only bf16 copies (ChunkBuffers::copies, tail order). Buckets
// are cut in each part separately. This rank keeps the f32 masters of its owned tail slices (one
// flat buffer per chunk, indexed like the moments: the masters of the tail's state elements);
// after updating one it rounds it into its slice of the copy (convert), and the tail buckets are
// all-gathered in bf16, the head buckets in f32. Offloaded, the owned masters are host memory and
// HostUpdate host masters (their rounding is uploaded into the copy).
//
// Staged chunks (RankOptimizerOptions::stage_host_collectives: a streamed chunk's gradients,
// parameters and copies live in pinned host memory, which the communicator cannot read): each
// bucket's reduce-scatter and all-gather go through one device piece of the bucket's size
// (optim/staged_comm.h), the same collectives on the same values. A dry run of a larger job (no
// communicator) runs them too, sending nothing, so the plan counts the pieces.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "core/comm.h"
#include "core/device.h"
#include "core/tensor.h"
#include "optim/host_update.h"
#include "optim/adamw.h"
#include "optim/grad_clipper.h"
#include "optim/rank_optimizer.h"
#include "optim/rank_optimizer_parts.h"
#include "optim/staged_comm.h"

namespace stp {

class DistributedOptimizer final : public RankOptimizer {
 public:
  // One owned piece of one parameter.
  struct Segment {
    std::size_t param;     // index into params()
    std::size_t offset;    // first element within the parameter's (local) shard
    std::size_t count;     // elements
    std::size_t chunk;     // local chunk
    std::size_t state_at;  // first element in the chunk's flat moments
  };

  // options.dp_comm null: a dry run (state is allocated, nothing is communicated).
  explicit DistributedOptimizer(RankOptimizerOptions options);

  StageMasters masters(int chunk) const override;
  void attach(const std::vector<Stage*>& stages) override;
  OptimizerHooks hooks() override;
  const std::vector<ParamInfo>& params() const override { return params_.list; }

  void begin_step(float lr) override;
  void finish_gradients(const std::function<void()>& sum_tied) override;
  void order_gradient_writes(Stream& s) override;
  float* owned_gradient() override;
  float* grad_sumsq(Communicator& replica) override;
  void clip(float max_norm) override;
  const float* clip_coef() const override { return clipper_->coef(); }
  void step(float lr) override;

  std::vector<Stream*> streams(bool except_in_flight) override;
  void settle() override;
  // Both gather into the chunks' gradient buffers (dead between steps; no device memory beyond
  // the plan's): the moments assembled from every dp rank's owned parts; the parameters whole on
  // every rank already, but a sharded_master parameter's owned parts all-gathered into its
  // gradient.
  std::vector<Tensor> full_parameters() override;
  std::vector<Tensor> full_moments(int which) override;
  void load_moment(int which, std::size_t param, const std::vector<float>& shard) override;
  // After a load or init (ParamStore::load_full and the init leave each sharded_master parameter's
  // f32 shard in its gradient): copies this rank's owned parts into its masters, on compute.
  void parameters_loaded() override;
  std::int64_t step_count() const override { return step_count_; }
  void set_step_count(std::int64_t steps) override { step_count_ = steps; }
  std::size_t host_state_bytes() const override { return host_ ? host_->host_bytes() : 0; }
  std::size_t host_master_bytes() const override;
  Speculation speculation() const override;
  std::size_t host_shadow_bytes() const override { return host_ ? host_->shadow_bytes() : 0; }

  const std::vector<Segment>& segments() const { return segments_; }
  // The chunk's flat moments (0: exp_avg, 1: exp_avg_sq); segment s lives at [state_at, + count).
  const Tensor& moments(std::size_t chunk, int which) const { return chunks_[chunk].state[which]; }
  std::size_t state_bytes() const;  // both moments of every chunk
  // The owned parts of the sharded masters of the chunks on the host (on_host) or the device.
  std::size_t master_bytes(bool on_host) const;
  std::size_t buckets() const;  // reduce-scatters (and all-gathers) per step

 private:
  struct Chunk {
    Tensor params, grads, copies;  // the stage's flat buffers (Stage::flat_params / _grads / _copies)
    std::size_t split = 0;         // elements of params: the gradients after it are the copies'
    std::size_t master_base = 0;   // state element of the first tail bucket (masters[0] = its master)
    Tensor masters;                // the owned parts of the tail's f32 masters (undefined: no tail)
    std::vector<std::pair<std::size_t, std::size_t>> buckets;  // (first element, elements)
    std::vector<std::size_t> bucket_state;                     // first state element of each bucket
    Tensor state[2];
    std::unique_ptr<Event> final, gathered;
    bool started = false, delayed = false;
    bool staged = false;          // its collectives go through staging_ (staged_chunks)
    bool gather_pending = false;  // gathered recorded, compute not ordered after it yet
  };
  void add_chunk(Stage& stage);
  void add_segments(std::size_t param);
  void add_runs();
  void chunk_final(int chunk);
  void params_needed(int chunk);
  void reduce(std::size_t chunk);
  // All-gathers the chunk's buckets: head (f32 parameter) buckets into data when `head`, tail
  // buckets into copies (bf16) when given, else into data (f32).
  void gather(std::size_t chunk, float* data, bf16* copies, bool head);
  void gather_parameters(std::size_t chunk);  // after the update; left in flight (params_needed)
  // A checkpoint gather into a chunk-sized f32 buffer, compute ordered before and after it.
  void gather_into(std::size_t chunk, float* data, bool head);
  float* master(const Segment& s) const;  // the f32 master of a segment (param or masters)
  bf16* copy(const Segment& s) const;     // a sharded_master segment's part of its bf16 copy
  bool on_host(std::size_t chunk) const { return host_ && host_chunks_.at(chunk); }
  // Whether the chunk's collectives run: with a communicator, or staged (also in a dry run).
  bool communicates(const Chunk& c) const { return comm_ || c.staged; }

  RankOptimizerOptions o_;
  Communicator* comm_;             // options.dp_comm
  std::vector<bool> host_chunks_;  // [local chunk]
  RankParams params_;
  std::vector<Chunk> chunks_;
  std::vector<Segment> segments_;
  std::vector<ParamInfo> owned_;  // one view per segment (param and grad), for the clipper
  // A flat run of a device chunk's segments (back to back in gradients, masters, state and
  // copies), updated by one fused AdamW: segments_[first] and those in `segments`' order after it.
  struct Run {
    std::size_t first;  // the run's first segment (its pointers are the run's)
    std::size_t count;  // elements
    std::vector<FlatSegment> segments;
  };
  std::vector<Run> runs_;  // chunk order
  bool clipped_ = false;   // this step's clip() ran: step() reads the coefficient
  std::unique_ptr<GradClipper> clipper_;
  std::int64_t step_count_ = 0;
  // Declared last, destroyed first: the CPU update waits in its destructor for the work that
  // reads the state above.
  std::unique_ptr<Stream> dp_stream_;
  std::unique_ptr<StagedComm> staging_;  // when a chunk is staged
  std::unique_ptr<Event> done_;
  std::unique_ptr<HostUpdate> host_;  // when a chunk's state is on the host
};

}  // namespace stp
