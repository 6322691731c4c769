// ParamStreamer: parameter streaming (memory.param_offload) for one rank. A streamed chunk's stage
// keeps its flat parameters, bf16 GEMM copies and gradients in pinned host memory
// (StageSpec::streamed); the device holds a unit's slices only while a pass of that unit runs.
//
//   begin_pass(chunk, stage, u, kind)   before F(u, mb), B(u, mb) or W(u, mb) of a streamed chunk.
//       The copy stream waits on an event recorded on compute (so it is ordered after everything
//       that wrote the host copies: zeroing, the optimizer's uploads, earlier gradient copies
//       back), takes device buffers from the rank's arena (first user: the copy stream; the
//       caching arena makes them a rotating set), copies the pass's parameters (f32 and bf16
//       copies) and, for B and W, the gradients the pass writes H2D, and compute waits for the
//       copies (a stream wait). The pass's ParamInfo::param / compute / grad views are rebound to
//       the device copies. A B with its W fused is one pass (kind BackwardWeight). Each pass
//       moves only what it uses:
//         weights: F(u) and B(u) unit u's (Stage::unit_params; B re-runs F's kernels under
//           recompute), B(u) also the norm of unit u+1 it finalizes (Stage::pass_grads(u, false));
//           a W pass none: W's GEMMs read the records B left, never a weight;
//         gradients: those the pass writes (Stage::pass_grads: B(u) the norm of unit u+1 and the
//           few B(u) writes itself, W(u) the rest of unit u's; a fused pass both).
//       A view the pass does not use (a weight or a gradient of a bound parameter) is unbound
//       (an undefined tensor) during the pass, so a use the stage did not declare fails instead of
//       reading or writing the host copy behind the copies' back. So a step moves each gradient
//       slice down once per microbatch and up once per microbatch but the first, and each weight
//       up twice per microbatch (F and B).
//   end_pass()   after the pass is enqueued. B and W: the copy stream waits on compute and copies
//       the pass's gradients D2H back to the host copy (so gradient accumulation over microbatches
//       is the same f32 additions in the same order as without streaming: a bitwise round trip).
//       The first pass of a walk that writes a slice's gradients zeroes its device buffer instead
//       of copying it up: the caller zeroes the gradients before a step (the trainer does, before
//       Executor::run_step), so the host copy is zero then and the bits are the same.
//       Every view goes back to its host copy and the device buffers are dropped (the arena's
//       fences keep them until the copy stream is past them).
//   Why a round trip and not adding on the host: the kernels that write most of the gradient
//   bytes accumulate inside, with the running sum starting from the gradient: the weight-gradient
//   GEMMs (beta 1) add their k blocks into C one after another (OpenBLAS past its k block, about
//   256-384 tokens; cuBLASLt's in-place split-K), and the chunked head's GEMMs add chunk after
//   chunk. So `g + (pass from zero)` is a different rounding from the pass run on g, and adding a
//   pass's partial on the host would not be bitwise equal to the run without streaming. Only the
//   column sums (biases, norms) and the embedding's scatter add once; they are a negligible share
//   of the bytes, so every written slice keeps the round trip.
//   prefetch(chunk, stage, u, kind)   the same weight copies for a pass that comes later (the
//       executor: the next unit of the same part, while this one computes); its begin_pass then
//       only binds them. At most two are held (one per part of a braided op; a third drops the
//       oldest). Weights only: a slice's gradients must come after the previous pass sent them
//       back; for a W pass (kind Weight) nothing. Copied from the host weights as they are when
//       prefetch is called, so only within a step, after the chunk's params_needed. Without
//       prefetch (constructed with prefetch false: RankPlan::late_params) it does nothing, and
//       every pass's weights come at its begin_pass: the device holds one pass's weights at a time,
//       and every weight copy is exposed.
//   host_ready(s)   stream s waits for every gradient copy back so far. The executor calls it
//       before a chunk's gradients are reported final and at the end of a walk, so the gradient
//       norm, the data-parallel reduction and the optimizer read the host copies after the last
//       D2H, and the next step's zeroing cannot overtake one.
//   walk_done(s)   at the end of a walk: host_ready(s); prefetched weights not used are dropped and
//       every gradient slice counts as unwritten again.
// One copy stream carries both directions in enqueue order, so a slice's next H2D never
// overtakes its previous D2H (the reload-before-offload ordering bug the offload engine guards
// against, by construction here).
//
// Chunks that do not stream are ignored (begin_pass / end_pass do nothing). Passes do not nest:
// the executor runs one unit at a time (braided parts alternate whole passes).
// Counters: bytes and copies each way. With a trace, each batch of copies is a span on the copy
// stream (trace::stream::kParamCopy): "weights up C uU" (F and W of unit U of local chunk C; " B" appended for
// a B pass, which brings unit U+1's too), "grads up C uU", "grads down".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "models/stage.h"

namespace stp {

struct ParamStreamCounters {
  std::uint64_t h2d_bytes = 0, d2h_bytes = 0;
  std::uint64_t h2d_copies = 0, d2h_copies = 0;
  std::uint64_t zeroed_bytes = 0;  // gradient slices zeroed on the device instead of copied up
};

enum class StreamedPass { Forward, Backward, Weight, BackwardWeight };

class ParamStreamer {
 public:
  // streamed: [local chunk] whether the chunk streams (RankPlan::param_stream). arena: the rank's
  // device allocator; compute: its compute stream (the arena's home stream). prefetch: false
  // makes prefetch() do nothing (RankPlan::late_params).
  ParamStreamer(Device& device, Stream& compute, Allocator& arena, std::vector<bool> streamed, bool prefetch = true);
  ~ParamStreamer();

  bool streams(int chunk) const;
  void prefetch(int chunk, Stage& stage, int u, StreamedPass kind);
  void begin_pass(int chunk, Stage& stage, int u, StreamedPass kind);
  void end_pass();
  void host_ready(Stream& s);
  void walk_done(Stream& s);

  Stream& copy_stream() { return *copy_; }
  ParamStreamCounters counters() const { return counters_; }

 private:
  struct Bound {
    ParamInfo* p = nullptr;
    Tensor param, compute, grad;  // the host views to restore
    bool grad_bound = false;      // the pass writes its gradient: a device slice, sent back after
  };
  // A pass's weights on the device: per parameter of `params` its f32 and bf16 device views
  // (undefined: not streamed, the host view stays), slices of `weights` and `copies`.
  struct Fetched {
    int chunk = -1;
    Stage* stage = nullptr;
    int u = -1;
    bool backward = false;
    std::vector<ParamInfo*> params;
    struct Views {
      Tensor param, compute;
    };
    std::vector<Views> views;
    Tensor weights, copies;
  };
  static constexpr std::size_t kMaxPrefetched = 2;  // one per part of a braided op

  Fetched fetch(int chunk, Stage& stage, int u, bool backward);
  Tensor up(const Tensor& host, const Tensor& into, std::int64_t& at);
  Tensor grads_in(const ParamInfo& p, std::int64_t& at);

  Stream& compute_;
  Allocator& arena_;
  std::vector<bool> streamed_;
  bool prefetch_ = true;
  std::unique_ptr<Stream> copy_;
  // Re-recorded for every pass: a wait captures the record made before it (core/device.h), and
  // each is recorded on one stream only.
  std::unique_ptr<Event> computed_, copied_;
  std::vector<Bound> bound_;
  bool grads_ = false;
  bool active_ = false;
  bool pending_d2h_ = false;            // gradient copies back since the last host_ready
  Fetched current_;                     // the bound pass's weights
  std::vector<Fetched> prefetched_;     // weights fetched ahead, oldest first
  Tensor grads_dev_;                    // the bound pass's gradients
  std::set<const ParamInfo*> written_;  // gradients some pass of this walk has written
  ParamStreamCounters counters_;

  void copy_stream_waits_for_compute();
};

}  // namespace stp
