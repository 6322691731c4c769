// Building a training process: config checks that need the schedule and model together, devices,
// communicators (TP, PP lanes, tied embedding, DP, replica, world — in one process or across the
// job's processes), and each rank's stages and optimizer.
#include <cblas.h>

#include <algorithm>
#include <optional>

#include "core/backend.h"
#include "core/gpu_logic.h"
#include "base/error.h"
#include "base/trace_names.h"
#include "formats/checkpoint.h"
#include "memory/numa.h"
#include "models/registry.h"
#include "train/memory_planning.h"
#include "train/memory_settings.h"
#include "train/stage_layout.h"
#include "train/trainer_impl.h"

extern "C" void openblas_set_num_threads(int);

namespace stp {

Trainer::Impl::Impl(const Config& cfg, TrainerOptions opts) : config(cfg), options(opts) {
  layout = RankLayout::of(config);
  if (options.dry_run) {  // one replica: the others are identical; never across processes
    layout.dp = 1;
    options.processes = nullptr;
  }
  fault = FaultHook::from_env();
  check_config();
  if (config.parallel.distributed_optimizer && config.parallel.dp == 1)
    warnings.push_back(
        "parallel.distributed_optimizer: true does nothing with parallel.dp = 1 (one replica holds the whole "
        "optimizer state; there is nothing to shard it over)");
  if (options.plan) {
    plan = *options.plan;
  } else {
    plan = make_memory_plan(config);
    check_plan(plan, config);
  }
  // parallel.cpu_threads is the process's CPU budget. Every rank runs its GEMMs concurrently on
  // its own stream thread, so each OpenBLAS call gets an equal share: oversubscribing the cores
  // (4 ranks x 2 threads on 2 cores) costs about 4x on the CPU backend.
  int ranks_in_process = multi_process() ? 1 : layout.size();
  openblas_set_num_threads(std::max(1, config.parallel.cpu_threads / ranks_in_process));
  if (!options.dry_run) dataset = std::make_unique<TokenDataset>(DataOptions::from_config(config));
  if (!options.dry_run && !config.data.val_path.empty()) {
    DataOptions val = DataOptions::from_config(config);
    val.path = config.data.val_path;
    val.sampling = "sequential";  // the held-out set is its first sequences, in order
    try {
      val_dataset = std::make_unique<TokenDataset>(val);
    } catch (const Error& e) {
      throw Error(str("data.val_path: ", e.what()));
    }
  }
  lr_schedule = LrSchedule::from_config(config.train);
  if (config.output.trace) trace = std::make_unique<TraceRecorder>();
  if (config.memory.copy_engine_cpus > 0 && !options.dry_run) {
    // Every thread made from here on (stream workers, oneTBB and OpenBLAS workers, the per-step
    // rank threads) inherits the compute CPUs; build_offload moves the copy streams off them.
    cpus = split_cpus_for_copies(config.memory.copy_engine_cpus);
    bind_current_thread_to_cpus(cpus.compute);
  }
  build_devices();
  // What the communicators take outside the budget (NCCL connects while they are made:
  // core/cuda/nccl_comm.cu), measured before the arenas reserve it.
  std::vector<std::optional<std::size_t>> free_before;
  for (auto& r : ranks) free_before.push_back(r->device->physical_free_bytes());
  build_communicators();
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    std::optional<std::size_t> after = ranks[i]->device->physical_free_bytes();
    if (free_before[i] && after && *free_before[i] > *after) ranks[i]->communicator_bytes = *free_before[i] - *after;
  }
  for (int g = 0; g < static_cast<int>(devices.size()); ++g) build_rank(*ranks[static_cast<std::size_t>(g)]);
  initialize_parameters();
}

// Checks that need more than one section of the config (the rest is validate_config's job).
void Trainer::Impl::check_config() const {
  const Config& c = config;
  if (multi_process()) check_processes(layout, options.processes->size());
  try {
    auto s = sched::generate(c.parallel.schedule, c.parallel.pp, c.train.microbatches);
    int stages = s.n_stages();
    STP_CHECK(c.model.n_layer % stages == 0, "model.n_layer = ", c.model.n_layer, " cannot be split evenly into ",
              stages, " pipeline stages (parallel.pp = ", c.parallel.pp, " x ", s.chunks,
              " chunk(s) per rank for schedule ", c.parallel.schedule, "); use a multiple of ", stages);
  } catch (const Error& e) {
    std::string what = e.what();
    if (what.rfind("model.n_layer", 0) == 0) throw;
    throw Error(str("train.microbatches / parallel.pp: ", what));
  }
}

void Trainer::Impl::build_devices() {
  schedule = sched::generate(config.parallel.schedule, config.parallel.pp, config.train.microbatches);
  BackendOptions o;
  o.kind = config.parallel.backend == "cuda" ? DeviceKind::Cuda : DeviceKind::Cpu;
  const std::vector<int> mine = multi_process()
                                    ? layout.ranks_of_process(options.processes->rank(), options.processes->size())
                                    : layout.ranks_of_process(0, 1);
  o.count = static_cast<int>(mine.size());
  o.first = multi_process() ? options.processes->node_rank() : 0;
  o.capacity = memory_settings(config).device_budget;
  o.link_bytes_per_s = config.memory.link_bandwidth;
  o.dry_run = options.dry_run;
  devices = make_devices(o);
  for (std::size_t i = 0; i < mine.size(); ++i) {
    auto r = std::make_unique<Rank>();
    r->global = mine[i];
    r->dp_rank = layout.dp_rank(mine[i]);
    r->pp_rank = layout.pp_rank(mine[i]);
    r->tp_rank = layout.tp_rank(mine[i]);
    r->device = devices[i].get();
    ranks.push_back(std::move(r));
  }
}

Rank* Trainer::Impl::local_rank(int global) const {
  for (auto& r : ranks)
    if (r->global == global) return r.get();
  return nullptr;
}

// One communicator group: members as global ranks (group rank = position) and where each member's
// communicator goes.
struct CommGroup {
  std::vector<int> members;
  bool tp_link = false;  // the CPU backend's emulated TP link applies
  // Every operation of the group is issued on the rank's compute stream, so it may share NCCL's
  // resources with the world (core/gpu_logic.h, SplitFamily).
  bool compute_only = false;
  std::function<void(Rank&, Communicator*)> assign;
};

// Groups (members as global ranks, group rank = position): TP (same dp and pp rank), the pipeline
// channels (same dp and tp rank; one per direction and message kind between two pp ranks, the
// source first: schedule/p2p_groups.h), the tied-embedding pair (ranks holding the first and the last stage, when
// those differ), DP (same pp and tp rank), the replica (grad norm, checkpoint gather) and the world
// (losses), and with vocab parallelism the TP groups once more (Rank::vocab). Every process lists them
// in this order. Each group is then made on its own (the CPU backend, NCCL older than 2.18: a HostComm or
// NCCL group over local devices, or across processes ProcessGroup::make_comm, every process taking
// part in every group in this order), or, on CUDA, split from the world (build_split_communicators).
void Trainer::Impl::build_communicators() {
  const int dp = layout.dp, tp = layout.tp, pp = layout.pp;
  std::vector<CommGroup> groups;
  auto group = [&](const std::vector<int>& members, Communicator* Rank::*slot, bool compute_only) {
    groups.push_back({members, slot == &Rank::tp, compute_only, [slot](Rank& r, Communicator* c) { r.*slot = c; }});
  };
  auto members = [](int n, const std::function<int(int)>& global) {
    std::vector<int> out;
    for (int i = 0; i < n; ++i) out.push_back(global(i));
    return out;
  };
  for (int d = 0; d < dp; ++d)
    for (int p = 0; p < pp; ++p)
      if (tp > 1) group(members(tp, [&](int t) { return layout.global(d, p, t); }), &Rank::tp, false);
  for (int d = 0; d < dp; ++d)
    for (int p = 0; p < pp; ++p)
      if (tp > 1 && config.parallel.vocab_parallel)
        groups.push_back({members(tp, [&](int t) { return layout.global(d, p, t); }), true, false,
                          [](Rank& r, Communicator* c) { r.vocab = c; }});
  int first_rank = sched::rank_of_stage(schedule, 0);
  int last_rank = sched::rank_of_stage(schedule, schedule.n_stages() - 1);
  for (int d = 0; d < dp; ++d) {
    for (int t = 0; t < tp; ++t) {
      for (const sched::P2pChannel& c : sched::p2p_channels(schedule))
        groups.push_back(
            {{layout.global(d, c.src, t), layout.global(d, c.dst, t)}, false, false, [c](Rank& r, Communicator* comm) {
               r.pp_channels[c] = comm;
             }});
      if (first_rank != last_rank)  // the tied gradients' sum, on compute (Trainer::Impl::sum_tied_grads)
        group({layout.global(d, first_rank, t), layout.global(d, last_rank, t)}, &Rank::tied, true);
    }
  }
  for (int p = 0; p < pp; ++p)
    for (int t = 0; t < tp; ++t)
      if (dp > 1) group(members(dp, [&](int d) { return layout.global(d, p, t); }), &Rank::dp, false);
  for (int d = 0; d < dp; ++d)  // grad norm and checkpoint gather, on compute
    group(members(layout.replica_size(), [&](int i) { return layout.global(d, 0, 0) + i; }), &Rank::replica, true);
  group(members(layout.size(), [](int g) { return g; }), &Rank::world, true);  // losses, on compute

  std::string why;
  const DeviceKind kind = devices.front()->kind();
  bool split = layout.size() > 1 && comm_split_available(kind, &why);
  if (multi_process()) split = !options.processes->any(!split);  // every process takes the same path
  if (kind == DeviceKind::Cuda && layout.size() > 1 && !split)
    warnings.push_back(str(why.empty() ? "a process cannot split NCCL communicators" : why,
                           "; every communicator group is created on its own"));
  if (split) {
    build_split_communicators(groups);
    return;
  }
  for (const CommGroup& g : groups) {
    if (multi_process()) {
      Rank& me = *ranks.front();
      if (auto made = options.processes->make_comm(g.members, *me.device)) {
        g.assign(me, made.get());
        comms.push_back(std::move(made));
      }
      continue;
    }
    std::vector<Device*> devs;
    for (int m : g.members) devs.push_back(local_rank(m)->device);
    HostCommOptions link;
    if (g.tp_link) link.all_reduce_bytes_per_s = config.parallel.tp_link_bandwidth;
    auto made = make_comms(devs, link);
    for (std::size_t i = 0; i < g.members.size(); ++i) {
      g.assign(*local_rank(g.members[i]), made[i].get());
      comms.push_back(std::move(made[i]));
    }
  }
}

// CUDA with NCCL 2.18 or later: the world (the last group) is the one communicator initialised from a
// unique id, as a split parent; every other group of two or more ranks is split from it in the calls
// gpu::plan_splits lists, which every process computes from the same groups and makes in the same
// order, each call with all its local ranks (ncclCommSplit is collective over the parent). Groups on
// the compute stream share the world's resources; the others are split from a private parent
// (core/gpu_logic.h, SplitFamily, says why). Communicators are added to `comms` parents first, which
// destroys them in reverse (children before their parents).
void Trainer::Impl::build_split_communicators(const std::vector<CommGroup>& groups) {
  const int n = layout.size();
  std::vector<int> everyone;
  for (int g = 0; g < n; ++g) everyone.push_back(g);
  // [local rank index] this process's member of the world and of the private parent.
  std::vector<Communicator*> world(ranks.size(), nullptr), priv(ranks.size(), nullptr);
  if (multi_process()) {
    auto made = options.processes->make_comm(everyone, *ranks.front()->device, /*split_parent=*/true);
    STP_ASSERT(made != nullptr, "this process is not in the world");
    world[0] = made.get();
    comms.push_back(std::move(made));
  } else {
    std::vector<Device*> devs;
    for (int g : everyone) devs.push_back(local_rank(g)->device);
    auto made = make_split_parent_comms(devs);
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      world[i] = made[static_cast<std::size_t>(ranks[i]->global)].get();
    }
    for (auto& c : made) comms.push_back(std::move(c));
  }
  const CommGroup& world_group = groups.back();
  STP_ASSERT(world_group.members == everyone, "the last communicator group is not the world");
  for (std::size_t i = 0; i < ranks.size(); ++i) world_group.assign(*ranks[i], world[i]);

  std::vector<gpu::SplitGroup> split_groups;
  for (std::size_t g = 0; g + 1 < groups.size(); ++g)
    split_groups.push_back(
        {groups[g].members, groups[g].compute_only ? gpu::SplitFamily::Shared : gpu::SplitFamily::Private});
  const std::vector<gpu::SplitCall> calls = gpu::plan_splits(split_groups, n);
  auto split = [&](const std::vector<Communicator*>& parents, const std::vector<int>& color,
                   const std::vector<int>& key) {
    std::vector<int> colors, keys;
    for (auto& r : ranks) {
      colors.push_back(color[static_cast<std::size_t>(r->global)]);
      keys.push_back(key[static_cast<std::size_t>(r->global)]);
    }
    return split_comms(parents, colors, keys, /*share=*/false);
  };
  if (gpu::needs_private_parent(calls)) {  // every rank in color 0, ordered as the world
    auto made = split(world, std::vector<int>(static_cast<std::size_t>(n), 0), everyone);
    for (std::size_t i = 0; i < ranks.size(); ++i) priv[i] = made[i].get();
    for (auto& c : made) comms.push_back(std::move(c));
  }
  for (const gpu::SplitCall& call : calls) {
    auto made = split(call.family == gpu::SplitFamily::Shared ? world : priv, call.color, call.key);
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      const int color = call.color[static_cast<std::size_t>(ranks[i]->global)];
      if (color == gpu::kSplitNoColor) continue;
      const CommGroup& g = groups[static_cast<std::size_t>(call.groups[static_cast<std::size_t>(color)])];
      const int key = call.key[static_cast<std::size_t>(ranks[i]->global)];
      STP_CHECK(made[i] && made[i]->rank() == key && made[i]->size() == static_cast<int>(g.members.size()),
                "ncclCommSplit gave global rank ", ranks[i]->global, " rank ", made[i] ? made[i]->rank() : -1, " of ",
                made[i] ? made[i]->size() : 0, " in a group where it is rank ", key, " of ", g.members.size());
      g.assign(*ranks[i], made[i].get());
      comms.push_back(std::move(made[i]));
    }
  }
  for (const CommGroup& g : groups)  // groups of one rank: the identity (core/backend.h)
    if (g.members.size() == 1)
      if (Rank* r = local_rank(g.members.front())) {
        auto self = make_self_comm();
        g.assign(*r, self.get());
        comms.push_back(std::move(self));
      }
}

void Trainer::Impl::build_rank(Rank& r) {
  if (r.device->kind() == DeviceKind::Cuda && r.device->numa_node_hint() >= 0 && numa_node_count() > 1)
    r.host_node = nearest_numa_node(*r.device);
  r.compute = r.device->create_stream(trace::stream::kCompute);
  r.tp_comm = r.device->create_stream(trace::stream::kTpComm);
  for (const auto& [channel, comm] : r.pp_channels)
    r.p2p.push_back(r.device->create_stream(trace::p2p_channel_stream(sched::to_string(channel))));
  if (layout.dp > 1) r.dp_comm = r.device->create_stream(trace::stream::kDpComm);
  ArenaOptions arena = budgeted_arena_options(*r.device, memory_settings(config).device_budget);
  arena.advice =
      "Raise memory.device_budget, let stp offload and recompute activations (memory.offload: auto, "
      "memory.recompute: auto; `stp plan CONFIG` shows what fits), or lower train.micro_batch_size.";
  r.alloc = std::make_unique<BlockArena>(*r.device, *r.compute, std::move(arena));
  if (trace) r.alloc->set_trace(trace.get(), r.global);  // device memory counters
  const RankPlan& rank_plan = plan.ranks.at(static_cast<std::size_t>(r.pp_rank));
  if (rank_plan.offloads()) build_offload(r);
  if (trace) {
    r.compute->set_trace(trace.get(), r.global, trace::stream::kCompute);
    r.tp_comm->set_trace(trace.get(), r.global, trace::stream::kTpComm);
    for (auto& s : r.p2p) s->set_trace(trace.get(), r.global, trace::stream::kP2p);
    if (r.dp_comm) r.dp_comm->set_trace(trace.get(), r.global, trace::stream::kDpComm);
  }
  // The distributed optimizer with dp > 1 (config.parallel.dp: a dry run plans one replica of the
  // real job, so it allocates replica 0's shard of the state without communicating).
  const bool sharded = config.parallel.distributed_optimizer && config.parallel.dp > 1;
  // The chunks whose optimizer state the plan puts in pinned host memory (updated by the CPU); the
  // others keep it on the device. One HostUpdate per rank with any such chunk.
  std::vector<bool> host_chunks;
  for (int c = 0; c < schedule.chunks; ++c)
    host_chunks.push_back(rank_plan.optimizer_placement(c) == OptimizerPlacement::Host);
  if (std::find(host_chunks.begin(), host_chunks.end(), true) != host_chunks.end()) {
    r.host_update =
        std::make_unique<HostUpdate>(*r.device, *r.compute, static_cast<std::size_t>(schedule.chunks), options.dry_run);
    for (Stream* s : {&r.host_update->d2h(), &r.host_update->h2d()}) {
      if (!cpus.copy.empty()) bind_stream_threads_to_cpus(*s, cpus.copy);
      else if (r.host_node >= 0) bind_stream_threads_near(*s, r.host_node);
    }
    // The CPU updates' stream is no copy engine: its tasks run the oneTBB AdamW near the state.
    if (r.host_node >= 0) bind_stream_threads_near(r.host_update->cpu(), r.host_node);
    if (trace) {
      r.host_update->d2h().set_trace(trace.get(), r.global, trace::stream::kOptimizerD2h);
      r.host_update->h2d().set_trace(trace.get(), r.global, trace::stream::kOptimizerH2d);
      r.host_update->cpu().set_trace(trace.get(), r.global, trace::stream::kOptimizerCpu);
    }
  }
  // A host chunk's GEMM weights keep their f32 masters in the optimizer's pinned host memory when
  // the settings allow it (MemorySettings::host_masters).
  const bool host_masters = r.host_update && memory_settings(config).host_masters;
  const ModelSpec model = model_spec_of(config);
  for (int c = 0; c < schedule.chunks; ++c) {
    StageSpec spec = stage_spec_of(config, schedule, r.pp_rank, c, r.tp_rank);
    spec.vocab_comm = r.vocab;
    if (host_masters && host_chunks[static_cast<std::size_t>(c)]) spec.host_masters = &r.host_update->allocator();
    // The distributed optimizer at bf16 keeps the GEMM weights' masters sharded over the dp ranks.
    spec.shard_masters = sharded && config.train.precision == "bf16";
    validate_model(model, spec);
    r.stages.push_back(make_stage(model, spec, *r.alloc));
    const auto& decisions = rank_plan.units.at(static_cast<std::size_t>(c));
    for (int u = 0; u < r.stages.back()->num_units(); ++u)
      r.stages.back()->set_recompute(u, decisions.at(static_cast<std::size_t>(u)).recompute);
    for (ParamInfo& p : r.stages.back()->params()) {
      r.params.push_back(p);
      r.param_chunk.push_back(c);
    }
  }
  // Each distinct gradient enters the global norm once: replicated tensors on TP rank 0 only, the
  // tied wte only in the first stage (its grads are summed into both copies before clipping).
  const ParamInfo* base = r.params.data();
  std::vector<bool> in_last(r.params.size());
  for (std::size_t i = 0; i < r.params.size(); ++i)
    in_last[i] = r.stages[static_cast<std::size_t>(r.param_chunk[i])]->is_last() &&
                 !r.stages[static_cast<std::size_t>(r.param_chunk[i])]->is_first();
  int tp_rank = r.tp_rank;
  auto counted = [base, in_last, tp_rank](const ParamInfo& p) {
    auto i = static_cast<std::size_t>(&p - base);
    if (p.replicated && tp_rank != 0) return false;
    return !(p.tied && in_last[i]);
  };
  if (sharded) {
    std::vector<ShardedOptimizer::ChunkBuffers> chunks;
    for (auto& s : r.stages) chunks.push_back({s->flat_params(), s->flat_grads(), s->flat_copies()});
    r.sharded = std::make_unique<ShardedOptimizer>(
        std::move(chunks), r.params, r.param_chunk, config.parallel.dp, r.dp_rank, layout.dp > 1 ? r.dp : nullptr,
        *r.device, *r.compute, layout.dp > 1 ? r.dp_comm.get() : nullptr,
        static_cast<std::size_t>(config.parallel.dp_bucket.value_or(0)), adamw_hyper(config.optim), *r.alloc, counted,
        trace != nullptr, r.host_update.get(), host_chunks);
  } else {
    r.adamw = std::make_unique<AdamW>(r.params, adamw_hyper(config.optim), *r.alloc, *r.compute, r.host_update.get(),
                                      r.param_chunk, host_chunks);
    r.clipper = std::make_unique<GradClipper>(r.params, *r.alloc, counted);
  }
  RankResources res;
  res.schedule = &schedule;
  res.pp_rank = r.pp_rank;
  for (auto& s : r.stages) res.stages.push_back(s.get());
  res.device = r.device;
  res.compute = r.compute.get();
  res.tp_comm = r.tp_comm.get();
  res.tp = r.tp;
  {
    std::size_t i = 0;
    for (const auto& [channel, comm] : r.pp_channels) res.channels.push_back({channel, comm, r.p2p[i++].get()});
  }
  res.trace = trace != nullptr;
  res.plan = &rank_plan;
  res.offload = r.offload.get();
  if (layout.dp > 1 && r.sharded) {
    res.grads_final = [opt = r.sharded.get()](int chunk) { opt->chunk_final(chunk); };
  } else if (layout.dp == 1 && r.host_update && !r.sharded) {
    // Offloaded, one replica: a host chunk without the tied parameter (whose gradient the tied sum
    // still changes) downloads its parameters and gradients as soon as its last backward is enqueued.
    for (std::size_t c = 0; c < r.stages.size(); ++c) {
      const auto& ps = r.stages[c]->params();
      r.host_update->set_early(
          c, host_chunks[c] && std::none_of(ps.begin(), ps.end(), [](const ParamInfo& p) { return p.tied; }));
    }
    res.grads_final = [host = r.host_update.get()](int chunk) { host->grads_final(static_cast<std::size_t>(chunk)); };
  } else if (layout.dp > 1) {
    std::vector<Tensor> grads;
    for (auto& s : r.stages) grads.push_back(s->flat_grads());
    r.dp_grads =
        std::make_unique<DpGradSync>(std::move(grads), *r.dp, *r.device, *r.compute, *r.dp_comm,
                                     static_cast<std::size_t>(config.parallel.dp_bucket.value_or(0)), trace != nullptr);
    res.grads_final = [sync = r.dp_grads.get()](int chunk) { sync->chunk_final(chunk); };
  }
  if (r.host_update || r.sharded) res.params_needed = [&r](int chunk) { r.params_needed(chunk); };
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

void Trainer::Impl::initialize_parameters() {
  if (options.dry_run) return;
  if (!config.train.resume.empty()) {
    resume(config.train.resume);
    return;
  }
  if (!config.model.init_from.empty()) {
    load_init_from(config.model.init_from);
    return;
  }
  run_on_ranks([&](Rank& r) {
    for (auto& s : r.stages) s->init_random(config.train.seed, *r.compute);
    if (r.sharded) r.sharded->adopt_masters();  // the sharded masters' draws wait in the gradients
  });
}

}  // namespace stp
