// What the RankOptimizer implementations (optim/rank_optimizer.h) share: the rank's parameter
// list and the rule for which gradients enter its norm, and the streams they create from their
// options. Internal to optim/.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "models/stage.h"
#include "optim/host_update.h"
#include "optim/adamw.h"
#include "optim/grad_clipper.h"
#include "optim/rank_optimizer.h"

namespace stp {

// Every stage's parameters (views into the stages' flat buffers), in chunk order.
struct RankParams {
  std::vector<Stage*> stages;     // [local chunk]
  std::vector<ParamInfo> list;    // every stage's parameters, chunk order
  std::vector<int> chunk;         // local chunk of list[i]
  std::vector<bool> norm_counts;  // whether list[i]'s gradient enters this rank's sum of squares

  // norm_counts: each distinct gradient once over all ranks — a TP-replicated tensor on TP rank 0
  // only, the tied parameter only in the first stage (its two copies' gradients are summed into
  // both before the norm).
  static RankParams of(const std::vector<Stage*>& stages, int tp_rank);

  // A predicate over list's elements (by address) for GradClipper.
  std::function<bool(const ParamInfo&)> counted() const;
  // Whether list[i] is a gradient of this rank's own: counted, and not the tied parameter (whose
  // sum another stage or rank shares).
  bool own(std::size_t i) const { return norm_counts[i] && !list[i].tied; }
  std::vector<Tensor> flat_grads() const;  // [local chunk]
  // Where every parameter's local chunk keeps its state (options.placement), [local chunk].
  static std::vector<bool> host_chunks(const RankOptimizerOptions& o);
};

// Global-norm clipping of `clipper`'s gradients on `compute`. With a CPU update (host, may be
// null): ordered after its early downloads (they read the gradients it scales), and the
// coefficient read back for the early copies, which hold the gradients before clipping
// (optim/host_update.h). A host wait when host is given.
void clip_gradients(GradClipper& clipper, Stream& compute, HostUpdate* host, float max_norm);
// The speculation counters of a CPU update (null: none).
RankOptimizer::Speculation speculation_of(const HostUpdate* host);
// The CPU update's streams to drain (RankOptimizer::streams): the downloads, and unless
// except_in_flight the updates and uploads too.
void add_host_streams(HostUpdate& host, bool except_in_flight, std::vector<Stream*>& out);
// Marks the streamed chunks (StageSpec::streamed: their parameters, gradients and bf16 copies
// already live in pinned host memory) as the CPU update's direct groups (HostUpdate::set_direct).
void set_direct_groups(HostUpdate& host, const std::vector<Stage*>& stages);

// The stream of the data-parallel collectives (trace::stream::kDpComm; null without a dp
// communicator, unless a dry run of a larger job stages them: stage_host_collectives).
std::unique_ptr<Stream> make_dp_stream(const RankOptimizerOptions& o);
// Per local chunk: whether its dp collectives go through a device staging piece (a streamed
// chunk, StageSpec::streamed, when options.stage_host_collectives and dp > 1).
std::vector<bool> staged_chunks(const RankOptimizerOptions& o, const std::vector<Stage*>& stages);
// The CPU update of the chunks placed on the host, its streams bound and traced (null when every
// chunk keeps its state on the device).
std::unique_ptr<HostUpdate> make_host_update(const RankOptimizerOptions& o);

}  // namespace stp
