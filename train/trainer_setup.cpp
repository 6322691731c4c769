// Building a training process: config checks that need the schedule and model together, devices,
// communicators (TP, PP lanes, world, tied embedding), and each rank's stages and optimizer.
#include <cblas.h>

#include <algorithm>

#include "core/backend.h"
#include "core/error.h"
#include "models/checkpoint.h"
#include "models/gpt2_config.h"
#include "train/memory_planning.h"
#include "train/stage_layout.h"
#include "train/trainer_impl.h"

extern "C" void openblas_set_num_threads(int);

namespace stp {

Trainer::Impl::Impl(const Config& cfg, TrainerOptions opts) : config(cfg), options(opts) {
  check_config();
  if (options.plan) {
    plan = *options.plan;
  } else {
    plan = make_memory_plan(config);
    check_plan(plan, config);
  }
  // parallel.cpu_threads is the process's CPU budget. Every rank runs its GEMMs concurrently on
  // its own stream thread, so each OpenBLAS call gets an equal share: oversubscribing the cores
  // (4 ranks x 2 threads on 2 cores) costs about 4x on the CPU backend.
  int ranks_in_process = config.parallel.tp * config.parallel.pp;
  openblas_set_num_threads(std::max(1, config.parallel.cpu_threads / ranks_in_process));
  if (!options.dry_run) dataset = std::make_unique<TokenDataset>(DataOptions::from_config(config));
  lr_schedule = LrSchedule::from_config(config.train);
  if (config.output.trace) trace = std::make_unique<TraceRecorder>();
  build_devices();
  build_communicators();
  for (int g = 0; g < static_cast<int>(devices.size()); ++g) build_rank(*ranks[static_cast<std::size_t>(g)]);
  initialize_parameters();
}

// Checks that need more than one section of the config (the rest is validate_config's job).
void Trainer::Impl::check_config() const {
  const Config& c = config;
  STP_CHECK(c.parallel.dp == 1, "parallel.dp = ", c.parallel.dp,
            ": data parallelism needs a multi-process launch, which this build does not support yet; set parallel.dp: 1");
  STP_CHECK(c.train.precision == "f32", "train.precision: ", c.train.precision,
            " is not available in this build yet; use f32");
  try {
    auto s = sched::generate(c.parallel.schedule, c.parallel.pp, c.train.microbatches);
    int stages = s.n_stages();
    STP_CHECK(c.model.n_layer % stages == 0, "model.n_layer = ", c.model.n_layer, " cannot be split evenly into ",
              stages, " pipeline stages (parallel.pp = ", c.parallel.pp, " x ", s.chunks, " chunk(s) per rank for schedule ",
              c.parallel.schedule, "); use a multiple of ", stages);
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
  o.count = config.parallel.pp * config.parallel.tp;
  if (config.memory.device_budget) o.capacity = static_cast<std::size_t>(*config.memory.device_budget);
  o.link_bytes_per_s = config.memory.link_bandwidth;
  o.dry_run = options.dry_run;
  devices = make_devices(o);
  for (int g = 0; g < o.count; ++g) {
    auto r = std::make_unique<Rank>();
    r->global = g;
    r->pp_rank = g / config.parallel.tp;
    r->tp_rank = g % config.parallel.tp;
    r->device = devices[static_cast<std::size_t>(g)].get();
    ranks.push_back(std::move(r));
  }
}

// Groups: TP (same pp rank), two PP lanes (same tp rank), the world (clipping), and the tied-
// embedding pair (ranks holding the first and the last stage, when those are different ranks).
void Trainer::Impl::build_communicators() {
  const int tp = config.parallel.tp, pp = config.parallel.pp;
  auto group = [&](const std::vector<Rank*>& members, Communicator* Rank::*slot) {
    std::vector<Device*> devs;
    for (Rank* m : members) devs.push_back(m->device);
    HostCommOptions link;
    if (slot == &Rank::tp) link.all_reduce_bytes_per_s = config.parallel.tp_link_bandwidth;
    auto made = make_comms(devs, link);
    for (std::size_t i = 0; i < members.size(); ++i) {
      members[i]->*slot = made[i].get();
      comms.push_back(std::move(made[i]));
    }
  };
  auto at = [&](int p, int t) { return ranks[static_cast<std::size_t>(p * tp + t)].get(); };
  for (int p = 0; p < pp; ++p) {
    std::vector<Rank*> members;
    for (int t = 0; t < tp; ++t) members.push_back(at(p, t));
    if (tp > 1) group(members, &Rank::tp);
  }
  int first_rank = sched::rank_of_stage(schedule, 0);
  int last_rank = sched::rank_of_stage(schedule, schedule.n_stages() - 1);
  for (int t = 0; t < tp; ++t) {
    std::vector<Rank*> members;
    for (int p = 0; p < pp; ++p) members.push_back(at(p, t));
    if (pp > 1) {
      group(members, &Rank::pp_act);
      group(members, &Rank::pp_grad);
    }
    if (first_rank != last_rank) group({at(first_rank, t), at(last_rank, t)}, &Rank::tied);
  }
  std::vector<Rank*> all;
  for (auto& r : ranks) all.push_back(r.get());
  group(all, &Rank::world);
}

void Trainer::Impl::build_rank(Rank& r) {
  r.compute = r.device->create_stream("compute");
  r.tp_comm = r.device->create_stream("tp-comm");
  r.p2p = r.device->create_stream("p2p");
  ArenaOptions arena = device_arena_options(*r.device, config.memory.device_budget
                                                           ? static_cast<std::size_t>(*config.memory.device_budget)
                                                           : SIZE_MAX);
  // With a budget the arena takes it as one segment: carving one range, with coalescing, leaves
  // far less fragmentation than exact-size segments once the budget is tight.
  if (arena.budget != SIZE_MAX) arena.segment_bytes = arena.budget;
  arena.advice = "Raise memory.device_budget, let stp offload and recompute activations (memory.offload: auto, "
                 "memory.recompute: auto; `stp plan CONFIG` shows what fits), or lower train.micro_batch_size.";
  r.alloc = std::make_unique<BlockArena>(*r.device, *r.compute, std::move(arena));
  if (trace) r.alloc->set_trace(trace.get(), r.global);  // "device memory" counters
  const RankPlan& rank_plan = plan.ranks.at(static_cast<std::size_t>(r.pp_rank));
  if (rank_plan.offloads()) build_offload(r);
  if (trace) {
    r.compute->set_trace(trace.get(), r.global, "compute");
    r.tp_comm->set_trace(trace.get(), r.global, "tp-comm");
    r.p2p->set_trace(trace.get(), r.global, "p2p");
  }
  const GPT2Config model = gpt2_config_of(config);
  for (int c = 0; c < schedule.chunks; ++c) {
    GPT2StageSpec spec = stage_spec_of(config, schedule, r.pp_rank, c, r.tp_rank);
    validate(model, spec);
    r.stages.push_back(std::make_unique<GPT2Stage>(model, spec, *r.alloc));
    const auto& decisions = rank_plan.units.at(static_cast<std::size_t>(c));
    for (int u = 0; u < r.stages.back()->num_units(); ++u)
      r.stages.back()->set_recompute(u, decisions.at(static_cast<std::size_t>(u)).recompute);
    for (ParamInfo& p : r.stages.back()->params()) {
      r.params.push_back(p);
      r.param_chunk.push_back(c);
    }
  }
  r.adamw = std::make_unique<AdamW>(r.params, adamw_hyper(config.optim), *r.alloc, *r.compute);
  // Each distinct gradient enters the global norm once: replicated tensors on TP rank 0 only, the
  // tied wte only in the first stage (its grads are summed into both copies before clipping).
  const ParamInfo* base = r.params.data();
  std::vector<bool> in_last(r.params.size());
  for (std::size_t i = 0; i < r.params.size(); ++i)
    in_last[i] = r.stages[static_cast<std::size_t>(r.param_chunk[i])]->is_last() &&
                 !r.stages[static_cast<std::size_t>(r.param_chunk[i])]->is_first();
  int tp_rank = r.tp_rank;
  r.clipper = std::make_unique<GradClipper>(r.params, *r.alloc, [base, in_last, tp_rank](const ParamInfo& p) {
    auto i = static_cast<std::size_t>(&p - base);
    if (p.replicated && tp_rank != 0) return false;
    return !(p.tied && in_last[i]);
  });
  RankResources res;
  res.schedule = &schedule;
  res.pp_rank = r.pp_rank;
  for (auto& s : r.stages) res.stages.push_back(s.get());
  res.device = r.device;
  res.compute = r.compute.get();
  res.tp_comm = r.tp_comm.get();
  res.p2p = r.p2p.get();
  res.tp = r.tp;
  res.pp_act = r.pp_act;
  res.pp_grad = r.pp_grad;
  res.trace = trace != nullptr;
  res.plan = &rank_plan;
  res.offload = r.offload.get();
  r.executor = std::make_unique<Executor>(res);
  if (r.holds_last()) {
    BlockArena::CategoryScope as(*r.alloc, MemoryCategory::Buffers);
    r.losses = Tensor::empty(*r.alloc, {config.train.microbatches});
    r.executor->set_loss_output(r.losses);
  }
}

// The pinned pool is sized by the plan (the exact bytes the dry run needed); a dry run itself
// gets a pool as large as the host budget allows, and reports what it used.
void Trainer::Impl::build_offload(Rank& r) {
  const std::size_t host_budget = config.memory.host_budget ? static_cast<std::size_t>(*config.memory.host_budget) : SIZE_MAX;
  PinnedPoolOptions p;
  p.host_budget = host_budget;
  if (options.dry_run) {
    p.bytes = std::min<std::size_t>(host_budget, std::size_t{1} << 40);
  } else {
    p.bytes = plan.predicted.at(static_cast<std::size_t>(r.global)).host_pinned_bytes;
  }
  // Home stream: the engine names each pool buffer's first user (the D2H stream) when it allocates.
  r.pool = std::make_unique<PinnedPool>(*r.device, *r.compute, p);
  if (trace) r.pool->set_trace(trace.get(), r.global);  // "pinned memory" counters
  r.offload = std::make_unique<OffloadEngine>(*r.device, *r.compute, *r.alloc, *r.pool);
  if (trace) {
    r.offload->d2h().set_trace(trace.get(), r.global, "d2h");
    r.offload->h2d().set_trace(trace.get(), r.global, "h2d");
  }
}

void Trainer::Impl::initialize_parameters() {
  if (options.dry_run) return;
  if (!config.train.resume.empty()) {
    resume(config.train.resume);
    return;
  }
  if (!config.model.init_from.empty()) {
    load_full_tensors(read_model_tensors(config.model.init_from), config.model.init_from);
    return;
  }
  run_on_ranks([&](Rank& r) {
    for (auto& s : r.stages) s->param_store().init_random(config.train.seed, *r.compute);
  });
}

}  // namespace stp
