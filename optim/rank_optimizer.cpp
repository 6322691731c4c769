#include "optim/rank_optimizer.h"

#include <algorithm>

#include "base/error.h"
#include "base/trace_names.h"
#include "memory/numa.h"
#include "optim/distributed_optimizer.h"
#include "optim/offloaded_optimizer.h"
#include "optim/rank_optimizer_parts.h"
#include "optim/replicated_optimizer.h"

namespace stp {

std::unique_ptr<RankOptimizer> make_rank_optimizer(const RankOptimizerOptions& o) {
  STP_ASSERT(o.device && o.compute && o.alloc && !o.placement.empty(), "make_rank_optimizer: incomplete options");
  if (o.distributed && o.dp > 1) return std::make_unique<DistributedOptimizer>(o);
  const std::vector<bool> on_host = RankParams::host_chunks(o);
  if (std::find(on_host.begin(), on_host.end(), true) != on_host.end()) return std::make_unique<OffloadedOptimizer>(o);
  return std::make_unique<ReplicatedOptimizer>(o);
}

// ---- the shared parts (optim/rank_optimizer_parts.h)

RankParams RankParams::of(const std::vector<Stage*>& stages, int tp_rank) {
  RankParams r;
  r.stages = stages;
  for (std::size_t c = 0; c < stages.size(); ++c) {
    const bool only_last = stages[c]->is_last() && !stages[c]->is_first();
    for (const ParamInfo& p : stages[c]->params()) {
      r.list.push_back(p);
      r.chunk.push_back(static_cast<int>(c));
      r.norm_counts.push_back(!(p.replicated && tp_rank != 0) && !(p.tied && only_last));
    }
  }
  return r;
}

std::function<bool(const ParamInfo&)> RankParams::counted() const {
  return [base = list.data(), counts = norm_counts](const ParamInfo& p) {
    return counts[static_cast<std::size_t>(&p - base)];
  };
}

std::vector<Tensor> RankParams::flat_grads() const {
  std::vector<Tensor> out;
  for (Stage* s : stages) out.push_back(s->flat_grads());
  return out;
}

std::vector<bool> RankParams::host_chunks(const RankOptimizerOptions& o) {
  std::vector<bool> out;
  for (OptimizerPlacement p : o.placement) out.push_back(p == OptimizerPlacement::Host);
  return out;
}

void clip_gradients(GradClipper& clipper, Stream& compute, HostUpdate* host, float max_norm) {
  if (host) host->order_after_downloads(compute);
  clipper.clip(compute, max_norm);
  if (!host) return;
  float coef = 1.0f;
  compute.copy(&coef, clipper.coef(), sizeof(float));
  compute.synchronize();
  host->set_clip_coefficient(coef);
}

RankOptimizer::Speculation speculation_of(const HostUpdate* host) {
  if (!host) return {};
  const HostUpdate::Speculation s = host->last_speculation();
  return {s.committed, s.discarded, static_cast<double>(host->hidden_ns()) * 1e-9};
}

void add_host_streams(HostUpdate& host, bool except_in_flight, std::vector<Stream*>& out) {
  out.push_back(&host.d2h());
  if (except_in_flight) return;
  out.push_back(&host.cpu());
  out.push_back(&host.h2d());
}

void set_direct_groups(HostUpdate& host, const std::vector<Stage*>& stages) {
  for (std::size_t c = 0; c < stages.size(); ++c) host.set_direct(c, stages[c]->streamed_bytes().gradients > 0);
}

std::vector<bool> staged_chunks(const RankOptimizerOptions& o, const std::vector<Stage*>& stages) {
  std::vector<bool> out;
  for (const Stage* s : stages)
    out.push_back(o.stage_host_collectives && o.dp > 1 && s->streamed_bytes().gradients > 0);
  return out;
}

std::unique_ptr<Stream> make_dp_stream(const RankOptimizerOptions& o) {
  if (!o.dp_comm && !(o.dp > 1 && o.stage_host_collectives)) return nullptr;
  std::unique_ptr<Stream> s = o.device->create_stream(trace::stream::kDpComm);
  if (o.trace) s->set_trace(o.trace, o.trace_rank, trace::stream::kDpComm);
  return s;
}

std::unique_ptr<HostUpdate> make_host_update(const RankOptimizerOptions& o) {
  const std::vector<bool> on_host = RankParams::host_chunks(o);
  if (std::find(on_host.begin(), on_host.end(), true) == on_host.end()) return nullptr;
  auto host = std::make_unique<HostUpdate>(*o.device, *o.compute, o.placement.size(), o.dry_run);
  host->set_speculative(o.speculate);
  // The copy threads run on the emulated copy engine's CPUs, or near the device's NUMA node.
  for (Stream* s : {&host->d2h(), &host->h2d()}) {
    if (!o.copy_cpus.empty()) bind_stream_threads_to_cpus(*s, o.copy_cpus);
    else if (o.host_node >= 0) bind_stream_threads_near(*s, o.host_node);
  }
  // The CPU updates' stream is no copy engine: its tasks run the oneTBB AdamW near the state.
  if (o.host_node >= 0) bind_stream_threads_near(host->cpu(), o.host_node);
  if (o.trace) {
    host->d2h().set_trace(o.trace, o.trace_rank, trace::stream::kOptimizerD2h);
    host->h2d().set_trace(o.trace, o.trace_rank, trace::stream::kOptimizerH2d);
    host->cpu().set_trace(o.trace, o.trace_rank, trace::stream::kOptimizerCpu);
  }
  return host;
}

}  // namespace stp
