// Building one rank of a training process, in named steps: its streams, its device memory (the
// budgeted arena, the pinned pool and offload engine when its plan offloads), its optimizer (which
// says where the stages keep their masters), its stages, and the executor that walks its ops.
#include <algorithm>

#include "base/error.h"
#include "base/trace_names.h"
#include "memory/numa.h"
#include "models/registry.h"
#include "optim/adamw.h"
#include "train/memory_settings.h"
#include "train/stage_layout.h"
#include "train/trainer_impl.h"

namespace stp {

void Trainer::Impl::build_rank(Rank& r) {
  if (r.device->kind() == DeviceKind::Cuda && r.device->numa_node_hint() >= 0 && numa_node_count() > 1)
    r.host_node = nearest_numa_node(*r.device);
  build_streams(r);
  build_memory(r);
  build_optimizer(r);
  build_stages(r);
  build_executor(r);
}

void Trainer::Impl::build_streams(Rank& r) {
  r.compute = r.device->create_stream(trace::stream::kCompute);
  r.tp_comm = r.device->create_stream(trace::stream::kTpComm);
  for (const auto& [channel, comm] : r.pp_channels)
    r.p2p.push_back(r.device->create_stream(trace::p2p_channel_stream(sched::to_string(channel))));
  if (!trace) return;
  r.compute->set_trace(trace.get(), r.global, trace::stream::kCompute);
  r.tp_comm->set_trace(trace.get(), r.global, trace::stream::kTpComm);
  for (auto& s : r.p2p) s->set_trace(trace.get(), r.global, trace::stream::kP2p);
}

void Trainer::Impl::build_memory(Rank& r) {
  ArenaOptions arena = budgeted_arena_options(*r.device, memory_settings(config).device_budget);
  arena.placement = plan.ranks.at(static_cast<std::size_t>(r.pp_rank)).block_placement;  // the planner's choice
  arena.table = plan.ranks.at(static_cast<std::size_t>(r.pp_rank)).placement_table;
  arena.record_allocations = options.record_allocations;
  arena.advice =
      "Raise memory.device_budget, let stp offload and recompute activations (memory.offload: auto, "
      "memory.recompute: auto; `stp plan CONFIG` shows what fits), or lower train.micro_batch_size.";
  r.alloc = std::make_unique<BlockArena>(*r.device, *r.compute, std::move(arena));
  if (trace) r.alloc->set_trace(trace.get(), r.global);  // device memory counters
  // The compute stream's GEMM workspace, from the arena: sized by the configured backend, not by
  // the device, so the dry run that makes the memory plan (CPU devices) counts the bytes the GPU
  // run allocates. Only the compute stream runs GEMMs; the others get none.
  const DeviceKind backend = config.parallel.backend == "cuda" ? DeviceKind::Cuda : DeviceKind::Cpu;
  if (const std::size_t ws = gemm_workspace_bytes(backend)) {
    BlockArena::CategoryScope as(*r.alloc, MemoryCategory::Buffers);
    r.gemm_workspace = r.alloc->allocate(ws);
    r.compute->set_gemm_workspace(r.gemm_workspace->data, ws);
  }
  // The fused attention's library workspace (cuDNN's, Stream::set_attention_workspace), the same way:
  // only where the library can run, the fused attention in bf16 on a CUDA backend.
  if (const std::size_t ws = attention_library_workspace_bytes(config)) {
    BlockArena::CategoryScope as(*r.alloc, MemoryCategory::Buffers);
    r.attention_workspace = r.alloc->allocate(ws);
    r.compute->set_attention_workspace(r.attention_workspace->data, ws);
  }
  const RankPlan& rank_plan = plan.ranks.at(static_cast<std::size_t>(r.pp_rank));
  if (rank_plan.offloads()) build_offload(r);
  if (rank_plan.streams_any()) build_param_stream(r, rank_plan);
}

// Parameter streaming: the streamed chunks' flat buffers in pinned host memory of their own (the
// stages report the bytes, Stage::streamed_bytes), the copy stream beside the offload engine's.
void Trainer::Impl::build_param_stream(Rank& r, const RankPlan& rank_plan) {
  r.param_host = std::make_unique<DeviceAllocator>(*r.device, true);
  std::vector<bool> streamed;
  for (int c = 0; c < schedule.chunks; ++c) streamed.push_back(rank_plan.streams_params(c));
  r.streamer =
      std::make_unique<ParamStreamer>(*r.device, *r.compute, *r.alloc, std::move(streamed), !rank_plan.late_params);
  Stream& s = r.streamer->copy_stream();
  if (!cpus.copy.empty()) bind_stream_threads_to_cpus(s, cpus.copy);
  if (trace) s.set_trace(trace.get(), r.global, trace::stream::kParamCopy);
}

// The pinned pool is sized by the plan (the exact bytes the dry run needed); a dry run itself
// gets a pool as large as the host budget allows, and reports what it used.
void Trainer::Impl::build_offload(Rank& r) {
  const std::size_t host_budget = memory_settings(config).host_budget;
  PinnedPoolOptions p;
  p.host_budget = host_budget;
  if (options.dry_run) {
    p.bytes = std::min<std::size_t>(host_budget, std::size_t{1} << 40);
  } else {
    p.bytes = plan.predicted.at(static_cast<std::size_t>(r.pp_rank * layout.tp + r.tp_rank)).host_pinned_bytes;
  }
  // Home stream: the engine names each pool buffer's first user (the D2H stream) when it allocates.
  r.pool = std::make_unique<PinnedPool>(*r.device, *r.compute, p);
  if (trace) r.pool->set_trace(trace.get(), r.global);  // pinned memory counters
  r.offload = std::make_unique<OffloadEngine>(*r.device, *r.compute, *r.alloc, *r.pool);
  // The copy threads run next to the pool's pages (or on the emulated copy engine's CPUs).
  for (Stream* s : {&r.offload->d2h(), &r.offload->h2d()}) {
    if (!cpus.copy.empty()) bind_stream_threads_to_cpus(*s, cpus.copy);
    else if (r.pool->numa_node() >= 0) bind_stream_threads_near(*s, r.pool->numa_node());
  }
  if (trace) {
    r.offload->d2h().set_trace(trace.get(), r.global, trace::stream::kD2h);
    r.offload->h2d().set_trace(trace.get(), r.global, trace::stream::kH2d);
  }
}

// The optimizer's options: the plan's placement of every chunk's state, the data-parallel group
// (config.parallel.dp: a dry run plans one replica of the real job, so it allocates replica 0's
// share of a sharded state without communicating) and where the CPU update's threads run.
void Trainer::Impl::build_optimizer(Rank& r) {
  const RankPlan& rank_plan = plan.ranks.at(static_cast<std::size_t>(r.pp_rank));
  RankOptimizerOptions o;
  o.device = r.device;
  o.compute = r.compute.get();
  o.alloc = r.alloc.get();
  o.hyper = adamw_hyper(config.optim);
  for (int c = 0; c < schedule.chunks; ++c) o.placement.push_back(rank_plan.optimizer_placement(c));
  o.host_masters = memory_settings(config).host_masters;
  o.bf16 = config.train.precision == "bf16";
  o.distributed = config.parallel.distributed_optimizer;
  o.dp = config.parallel.dp;
  o.dp_rank = r.dp_rank;
  o.dp_comm = r.dp;  // null unless this process builds several replicas
  o.bucket_bytes = static_cast<std::size_t>(config.parallel.dp_bucket.value_or(0));
  o.stage_host_collectives = stages_host_collectives(config) && rank_plan.streams_any();
  // A dry run allocates the shadows whenever the key allows them: the plan decides auto from its bytes.
  o.speculate =
      options.dry_run ? memory_settings(config).optimizer_overlap != OffloadPolicy::None : plan.optimizer_overlap;
  o.tp_rank = r.tp_rank;
  o.copy_cpus = cpus.copy;
  o.host_node = r.host_node;
  o.trace = trace.get();
  o.trace_rank = r.global;
  o.dry_run = options.dry_run;
  r.optimizer = make_rank_optimizer(o);
}

void Trainer::Impl::build_stages(Rank& r) {
  const RankPlan& rank_plan = plan.ranks.at(static_cast<std::size_t>(r.pp_rank));
  const ModelSpec model = model_spec_of(config);
  std::vector<Stage*> stages;
  for (int c = 0; c < schedule.chunks; ++c) {
    StageSpec spec = stage_spec_of(config, schedule, r.pp_rank, c, r.tp_rank);
    spec.vocab_comm = r.vocab;
    const StageMasters masters = r.optimizer->masters(c);
    spec.host_masters = masters.host;
    spec.shard_masters = masters.sharded;
    if (rank_plan.streams_params(c)) spec.streamed = r.param_host.get();
    validate_model(model, spec);
    r.stages.push_back(make_stage(model, spec, *r.alloc));
    r.stages.back()->prepare_kernels(*r.compute);  // library plans per shape, once, before any step
    const auto& decisions = rank_plan.units.at(static_cast<std::size_t>(c));
    for (int u = 0; u < r.stages.back()->num_units(); ++u)
      r.stages.back()->set_recompute(u, decisions.at(static_cast<std::size_t>(u)).recompute);
    if (r.stages.back()->is_last()) r.stages.back()->set_loss_chunk_tokens(rank_plan.loss_chunk_tokens);
    r.stages.back()->set_unit_tiles(rank_plan.unit_tiles);
    stages.push_back(r.stages.back().get());
  }
  r.optimizer->attach(stages);  // the optimizer state, after the parameters
}

void Trainer::Impl::build_executor(Rank& r) {
  RankResources res;
  res.schedule = &schedule;
  res.pp_rank = r.pp_rank;
  for (auto& s : r.stages) res.stages.push_back(s.get());
  res.device = r.device;
  res.compute = r.compute.get();
  res.tp_comm = r.tp_comm.get();
  res.tp = r.tp;
  std::size_t i = 0;
  for (const auto& [channel, comm] : r.pp_channels) res.channels.push_back({channel, comm, r.p2p[i++].get()});
  res.trace = trace != nullptr;
  res.plan = &plan.ranks.at(static_cast<std::size_t>(r.pp_rank));
  res.offload = r.offload.get();
  res.params = r.streamer.get();
  const OptimizerHooks hooks = r.optimizer->hooks();
  res.grads_final = hooks.grads_final;
  res.params_needed = hooks.params_needed;
  r.executor = std::make_unique<Executor>(res);
  const int m = config.train.microbatches;
  {
    BlockArena::CategoryScope as(*r.alloc, MemoryCategory::Buffers);
    // One buffer: the step's losses, the health scalars and (with validation) the eval losses.
    const std::int64_t n_loss = std::int64_t{config.parallel.dp} * m;
    const std::int64_t n_eval = config.data.val_path.empty() ? 0 : config.train.eval_batches * config.parallel.dp * m;
    Tensor scalars = Tensor::empty(*r.alloc, {n_loss + 3 + n_eval});
    r.losses = scalars.view(0, {n_loss});
    r.health = scalars.view(n_loss, {3});
    if (n_eval > 0) r.eval_losses = scalars.view(n_loss + 3, {n_eval});
  }
  if (r.holds_last() && r.tp_rank == 0) r.executor->set_loss_output(r.losses.view(std::int64_t{r.dp_rank} * m, {m}));
}

}  // namespace stp
