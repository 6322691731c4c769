// Stage: the contract between a model and the executor (train/executor.h). One pipeline stage = one
// chunk (a contiguous range of layers, + the embedding if it is the first chunk, + the final
// LayerNorm, LM head and loss if it is the last) on one TP rank.
//
// A stage is a list of *units* 0..U-1 in forward order. Units are cut at every TP all-reduce
// (docs/schedules.md, STP op lists, Units and braided blocks), so the executor places each all-reduce on its own
// communication stream between units. Every unit has three passes:
//
//   F = forward(u, mb, s)           — in unit order 0..U-1;
//   B = backward_input(u, mb, s)    — in reverse unit order U-1..0, after F(U-1, mb);
//   W = backward_weight(u, mb, s)   — any time after B(u, mb) (fused right after it, or deferred
//                                     past any other F/B/W); accumulates into the grads.
//
// All-reduce protocol (the caller's job, never done inside a unit). F and B return the tensor to
// all-reduce (sum, in place, over the TP group), or an undefined Tensor when there is nothing to
// reduce (always with tp = 1). With streams `compute` and `comm` and events e1, e2:
//
//   Tensor t = stage.forward(u, mb, compute);
//   if (t.defined()) { compute.record(e1); comm.wait(e1);
//                      comm_group.all_reduce_sum(comm, t.f32(), t.numel());
//                      comm.record(e2); }
//   ... any units of other microbatches / the other pass may run here on `compute` ...
//   compute.wait(e2);                        // before F(u+1, mb) (resp. B(u-1, mb))
//
// Several microbatches are in flight at once: every per-microbatch state is keyed by mb, and F/B/W
// of different microbatches may interleave in any order the schedule allows. The only ordering
// rules are, per microbatch: F in unit order; B in reverse unit order after the last F; W(u)
// after B(u); the all-reduce of a returned tensor between the producing unit and the next unit of
// the same pass (W needs no all-reduce).
//
// Hand-over between stages (pipeline p2p) and microbatch inputs:
//   * tokens(mb), targets(mb): (B,T) int32 values in 4-byte elements (tensor.h has no integer
//     dtype yet), on the device; the executor fills them before F(0) (first stage) and before
//     F(U-1) (last stage). Buffers are allocated by the stage on first access.
//   * input_activation(mb): (B,T,C) the executor writes the hidden state received from the
//     previous stage here before F(0) (stages that are not first).
//   * output_activation(mb): (B,T,C) what the executor sends to the next stage, valid after F(U-1)
//     and its all-reduce (stages that are not last). Taken, once: the stage keeps no handle.
//   * grad_output(mb): (B,T,C) the executor writes the gradient received from the next stage here
//     before B(U-1) (stages that are not last).
//   * grad_input(mb): (B,T,C) what the executor sends to the previous stage, valid after B(0)
//     (stages that are not first). Taken, once, like output_activation.
//   * loss(mb): (1,) device scalar, valid after F(U-1) of the last stage: the sum of mb's token
//     cross-entropies over its N = B·T target positions, divided by N, where a target of -1 (an
//     ignored position, data/data.h) adds 0. Without ignored targets that is the mean token
//     cross-entropy. The backward seed of each counted target is loss_scale() / N, so the
//     gradient is that of loss_scale() · loss(mb); an ignored target's seed is 0. A caller that
//     wants the mean over the C counted targets of a batch of microbatches sets loss_scale() =
//     (its 1/m) · (m·N / C) (train/trainer.cpp: 1/(m·dp) · (dp·m·N / C) for the global batch).
//   The stage drops its own references to these buffers at release_microbatch(mb) or
//   zero_grads(); the executor keeps a Tensor copy of anything it still sends/receives
//   asynchronously (a Tensor holds its storage alive).
//
// Memory: the tensors saved between passes are the activation records (memory/activation.h) —
// nothing else is kept. Temporaries inside one call come from the stage's Allocator and are
// released in stream order at the end of the call.
//
// Recompute (activation checkpointing), per unit: a policy drops some of the records F(u) saved
// and B(u) regenerates them (re-running F's kernels on F's inputs: bitwise the same values) at
// the start of its call, before its own math, on B's stream, from the stage's allocator. The
// regenerated records have their usual names, readers and sizes, so W(u) and B(u-1) find them
// whenever they run (deferred W included); the executor calls F/B/W exactly as without it.
// What changes for the executor/planner/offload:
//   * between F(u) and B(u), unit u holds recompute_saving(u, r) fewer bytes;
//   * B(u) allocates the dropped records again (plus the recompute's temporaries) and does
//     recompute_cost(u, r) of F(u)'s FLOPs more work;
//   * B(u) then also reads the records the recompute starts from (the unit input "ln.x", tagged
//     BPrev, and for Selective "qkv" / "h"): an offloaded one must be back before B(u).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "memory/recompute.h"
#include "memory/activation.h"

namespace stp {

// Recompute (memory/recompute.h, shared with the planner) is a unit's policy; what it means here:
//   None       keep every record.
//   Selective  drop the records that are cheap to regenerate from kept ones (no GEMM with the
//              unit's weights is re-run): the LayerNorm output, and the attention core's records
//              and output (attention: the probabilities with naive attention, the log-sum-exp with
//              fused attention) or the GELU output (MLP).
//   Full       keep only the unit input (the checkpoint); re-run the unit's forward up to its
//              row-parallel GEMM (whose output is not a record, so it is not re-run).
// Only attention and MLP units support a policy other than None.

// How a rank's shard maps into the full (unsharded) tensor, both row-major:
//   shard row i  <->  full row  row_begin + i           (i < shard_rows)
//   within a row: for each segment, shard columns [shard_col, shard_col + len) <->
//                 full columns [full_col, full_col + len).
// A replicated tensor is one segment covering the row; a row-parallel weight selects rows; a
// column-parallel weight selects columns (c_attn's [C, 3C] takes one slice of each of q, k, v).
// Vectors are 1 x n. Shard rows past the full tensor (row_begin + i >= full_rows: the padding of
// a vocab-parallel embedding or head) map to nothing: scatter leaves them as they are, gather
// never reads them.
struct ShardSegment {
  std::int64_t full_col = 0, shard_col = 0, len = 0;
};

struct ShardLayout {
  std::int64_t full_rows = 1, full_cols = 1;
  std::int64_t shard_rows = 1, shard_cols = 1;
  std::int64_t row_begin = 0;
  std::vector<ShardSegment> segments;

  // Host-side data movement between a full tensor and this rank's shard (host buffers).
  std::int64_t real_rows() const {
    const std::int64_t left = full_rows - row_begin;
    return left < 0 ? 0 : (left < shard_rows ? left : shard_rows);
  }
  void scatter(const float* full, float* shard) const {
    for (std::int64_t i = 0; i < real_rows(); ++i)
      for (const ShardSegment& g : segments)
        for (std::int64_t j = 0; j < g.len; ++j)
          shard[i * shard_cols + g.shard_col + j] = full[(row_begin + i) * full_cols + g.full_col + j];
  }
  void gather(const float* shard, float* full) const {
    for (std::int64_t i = 0; i < real_rows(); ++i)
      for (const ShardSegment& g : segments)
        for (std::int64_t j = 0; j < g.len; ++j)
          full[(row_begin + i) * full_cols + g.full_col + j] = shard[i * shard_cols + g.shard_col + j];
  }
};

struct ParamInfo {
  std::string name;         // the architecture's name, e.g. "h.0.attn.c_attn.weight" (GPT-2: HF's, without
                            // "transformer."; llama: models/llama_params.h maps them to HF's)
  Tensor param;             // this rank's shard, on the device
  Tensor grad;              // same shape; accumulated by W (and by B for LayerNorm weights)
  Tensor compute;           // what GEMMs multiply by: `param` itself, or (bf16 precision, GEMM weights
                            // only) its bf16 copy, refreshed from `param` at the start of every step
  Shape full_shape;         // HF layout ([C, 3C] for c_attn.weight, ...)
  bool decay = false;       // weight decay applies (tensors with two or more dimensions)
  bool replicated = false;  // every TP rank holds the full tensor with identical values and
                            // identical grads: count it once in a global grad norm
  bool vocab = false;       // a vocabulary table: the token embedding or the LM head (V rows; split
                            // over the TP ranks with vocab parallelism, models/param_store.h vocab_layout)
  bool tied = false;        // the same parameter lives in another stage too ("wte.weight" in the
                            // first and the last stage when they differ): before the optimizer
                            // step, sum its grads over those stages; update both copies alike
  // `param` lives in pinned host memory (StageSpec::host_masters, bf16 with optimizer offload):
  // only `compute` (its bf16 copy) and `grad` are device memory.
  bool host_master = false;
  // No f32 master on this rank (bf16 with the distributed optimizer, StageSpec::shard_masters):
  // `param` is undefined; each dp rank keeps the master of the part it owns
  // (optim/distributed_optimizer.h), and `compute` is all-gathered from the owners' bf16 roundings.
  bool sharded_master = false;
  ShardLayout layout;
};

// Pinned host bytes of a stage's streamed model states (StageSpec::streamed): the flat parameters
// with their bf16 copies (weights) and the flat gradients.
struct StreamedBytes {
  std::size_t weights = 0, gradients = 0;
};

// What a unit computes (its name says the same: Stage::unit_name): the token embedding (first
// stage) or the hand-over input (the others), a layer's attention or MLP branch, or the head.
enum class UnitKind { Embed, Input, Attn, Mlp, Head };

class Stage {
 public:
  virtual ~Stage() = default;

  virtual int num_units() const = 0;               // forward order 0..U-1
  virtual std::string unit_name(int u) const = 0;  // "embed", "input", "h.3.attn", "h.3.mlp", "head"
  virtual UnitKind unit_kind(int u) const = 0;     // the kind unit_name(u) names
  virtual bool is_first() const = 0;               // owns the embedding
  virtual bool is_last() const = 0;                // owns ln_f, the head and the loss

  // Microbatch I/O (see the header comment).
  virtual Tensor tokens(int mb) = 0;
  virtual Tensor targets(int mb) = 0;
  // `writer`: the stream that fills the buffer when it is not the stage's compute stream (the
  // pipeline receive stream), so a freshly allocated buffer is ordered after its bytes' last use.
  virtual Tensor input_activation(int mb, Stream* writer = nullptr) = 0;
  virtual Tensor output_activation(int mb) = 0;
  virtual Tensor grad_output(int mb, Stream* writer = nullptr) = 0;
  virtual Tensor grad_input(int mb) = 0;
  virtual Tensor loss(int mb) = 0;

  virtual void set_loss_scale(float scale) = 0;  // default 1
  virtual float loss_scale() const = 0;

  // Chooses, at setup, whatever the stage's kernels decide once per shape on stream s (the fused
  // attention's library plans: Stream::prepare_attention). Nothing runs on s.
  virtual void prepare_kernels(Stream& s) { (void)s; }

  // The three passes. F and B return the tensor to all-reduce before the next unit of the same
  // pass and microbatch, or an undefined Tensor.
  virtual Tensor forward(int u, int mb, Stream& s) = 0;
  virtual Tensor backward_input(int u, int mb, Stream& s) = 0;
  virtual void backward_weight(int u, int mb, Stream& s) = 0;

  // The records unit u currently holds for mb (those saved by F and, after B, those kept for W).
  virtual std::vector<ActivationRecord> activation_records(int u, int mb) const = 0;
  // The record set of (u, mb) itself, or nullptr when it holds none: the offload engine
  // (offload/) moves record tensors to host memory and back in place.
  virtual RecordSet* record_set(int u, int mb) = 0;
  // Records of every unit for every microbatch in flight (0 after all passes have run).
  virtual std::size_t live_record_bytes() const = 0;

  // Recompute policy of unit u (default None). Set it between steps: an stp::Error while some
  // microbatch holds records of u, or for r != None on a unit that does not support it (embed,
  // input, head).
  virtual void set_recompute(int u, Recompute r) = 0;
  virtual Recompute recompute(int u) const = 0;
  // The fraction of unit u's forward FLOPs that policy r re-runs in B(u), in [0, 1]; 0 for None
  // and for a policy the unit does not support. Counted from the dims (docs/model.md).
  virtual double recompute_cost(int u, Recompute r) const = 0;
  // Device bytes per microbatch that policy r drops between F(u) and B(u): exactly the bytes of
  // the dropped records (0 for None and for a policy the unit does not support).
  virtual std::size_t recompute_saving(int u, Recompute r) const = 0;

  // Forward-only mode (evaluation): F(u) releases every record it saved before it returns, in
  // stream order, so nothing is kept between units; B and W must not run while it is on. Set it
  // between steps, while no microbatch is in flight.
  virtual void set_forward_only(bool on) = 0;

  // The loss head in chunks (a stage that is_last(); docs/memory.md, Chunked loss head): with
  // tokens > 0 the head's F runs the LM head and the cross-entropy over the microbatch's B·T rows
  // `tokens` at a time (the last chunk shorter), and with its backward fused: at most one chunk's
  // logits exist, F accumulates the head's weight gradient (so the head's W adds nothing) and keeps
  // only the gradient w.r.t. the head's input, which B hands over. The seed is loss_scale() as it
  // is when F runs. 0 (the default) is the unchunked head: the logits are the head's record from F
  // to B. A row's logits, loss and input gradient are the unchunked row's wherever the GEMM computes
  // the row by the same arithmetic (on the CPU backend: chunks cut where OpenBLAS's row tiles are,
  // tests/models/loss_chunk_test.cpp), and then the losses and every gradient but the head weight's
  // are bitwise; the head weight's sums its tokens in chunk order. Set it between steps, while no
  // microbatch is in flight (an stp::Error otherwise, or for tokens < 0).
  virtual void set_loss_chunk_tokens(std::int64_t tokens) = 0;
  virtual std::int64_t loss_chunk_tokens() const = 0;

  // A unit's backward tiled over the microbatch's sequences (docs/memory.md, Tiled unit backward):
  // with tiles = k > 1, B(u) of every attention / MLP unit whose policy is Recompute::Full runs in
  // k groups of B/k sequences (rows [g·N/k, (g+1)·N/k) of every (B, T, ·) tensor), one group at a
  // time: the recompute of the group's records from its rows of the kept input, the group's
  // backward (its rows of the returned gradient) and at once its weight gradients; the group's
  // records and temporaries are freed before the next group's are made. So the unit's W runs in its
  // B (W(u) adds nothing), and what B(u) holds at once is one group's working set plus the whole
  // returned gradient and the norm statistics B(u-1) reads. Other units, and k = 1 (the default),
  // run as before. Numerics: every row's recomputed records and input gradient are the rows of an
  // untiled GEMM of fewer rows (bitwise where the GEMM computes a row alike in both); the weight
  // gradients add the same products in group order (tests/models/unit_tiles_test.cpp states the
  // tolerance). Set it between steps, while no microbatch is in flight (an stp::Error otherwise,
  // or for a tiles that does not divide B).
  virtual void set_unit_tiles(int tiles) = 0;
  virtual int unit_tiles() const = 0;

  virtual std::vector<ParamInfo>& params() = 0;
  // The parameters unit u's passes read or accumulate into (the units' own: a branch's norm and
  // GEMM weights, the embedding's tables, the head's final norm and LM head), pointers into
  // params(). B(u) also finalizes the norm of unit u+1 (models/stage_base.h), so it touches unit
  // u+1's parameters too. Parameter streaming (offload/param_streamer.h) moves exactly these.
  virtual std::vector<ParamInfo*> unit_params(int u) = 0;
  // The parameters whose gradients W(u) (weight true) or B(u) (weight false) accumulates into: what
  // parameter streaming brings up and sends back around that pass, nothing more. B(u) writes the
  // norm of unit u+1 it finalizes (a branch's norm weight, and bias), the c_proj bias of a GPT-2
  // branch u (its column sum, from B's f32 gradient) and, on the head, the final norm; W(u) writes
  // the rest of unit u's parameters (a branch's GEMM weights and biases, the embedding's tables, the
  // LM head). With the chunked loss head, F of the head writes the final norm's and the LM head's
  // gradients, and its B and W write none. A tiled unit's B (set_unit_tiles) writes its W's
  // gradients too, and its W none. Every parameter is written by exactly one pass kind per
  // microbatch (a tied table once per unit that uses it).
  virtual std::vector<ParamInfo*> pass_grads(int u, bool weight) = 0;
  // Pinned host bytes of the flat buffers when the stage streams its parameters, else zero.
  virtual StreamedBytes streamed_bytes() const = 0;
  // Every parameter / gradient of params() in one flat buffer, in params() order (the
  // data-parallel buckets, the distributed optimizer's slices); with sharded masters
  // (StageSpec::shard_masters) flat_params() holds only the parameters with a master here, and
  // flat_grads() is [their gradients | the sharded_master gradients], whose bf16 copies are
  // flat_copies() in that order (empty without sharded masters).
  virtual Tensor flat_params() const = 0;
  virtual Tensor flat_grads() const = 0;
  virtual Tensor flat_copies() const = 0;
  // Seeded init of every parameter: each full tensor is drawn from a stream keyed by (seed,
  // name) and then sharded, so every TP and PP split sees the same model. Synchronizes s.
  virtual void init_random(std::uint64_t seed, Stream& s) = 0;
  // Copies a full host tensor (the layout of ParamInfo::full_shape) into this rank's shard.
  // Synchronizes s.
  virtual void load_full(const std::string& name, const std::vector<float>& full, Stream& s) = 0;
  // Zeroes the gradients, drops all microbatch state (in stream order) and refreshes the bf16
  // GEMM copies of the weights (refresh_compute).
  virtual void zero_grads(Stream& s) = 0;
  // zero_grads without the refresh: the caller calls refresh_compute before the stage's parameters
  // are first read (an offloaded optimizer's uploads may still be in flight at the step's start).
  virtual void zero_grads_keep_copies(Stream& s) = 0;
  // Rounds the f32 masters into their bf16 GEMM copies (no-op at f32 precision), in stream order;
  // host_masters = false leaves the copies of host_master parameters (ParamInfo) as they are.
  virtual void refresh_compute(Stream& s, bool host_masters) = 0;
  // Drops mb's I/O buffers (its records must be gone), in stream order on s.
  virtual void release_microbatch(int mb, Stream& s) = 0;
};

}  // namespace stp
