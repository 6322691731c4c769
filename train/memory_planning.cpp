#include "train/memory_planning.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <cmath>
#include <vector>

#include "core/cpu/cpu_device.h"
#include "base/error.h"
#include "memory/planner.h"
#include "models/registry.h"
#include "schedule/schedule.h"
#include "train/host_needs.h"
#include "train/loss_chunk.h"
#include "train/unit_tiles.h"
#include "train/memory_settings.h"
#include "train/planner_rates.h"
#include "train/stage_layout.h"
#include "train/trainer.h"

namespace stp {
namespace {

// The CPU AdamW's streaming rate (host memory bandwidth class); the GEMM and link rates are
// train/planner_rates.h's (documented in docs/memory.md).
constexpr double kCpuAdamWBytesPerS = 20e9;

struct ModelLayout {
  sched::Schedule schedule;
  std::unique_ptr<CpuDevice> device;  // declared before the stages, which free into it
  std::unique_ptr<Allocator> alloc;
  // Where the stages' host masters go (MemorySettings::host_masters; ModelStateBytes::host_masters
  // marks them), or null.
  std::unique_ptr<Allocator> pinned;
  std::vector<std::vector<std::unique_ptr<Stage>>> stages;  // [pp rank][chunk], TP rank 0, dry device
};

// The stages of TP rank 0 of every pipeline rank on a dry device: unit names, counts, savings.
ModelLayout build_shape(const Config& c) {
  ModelLayout s;
  s.schedule = sched::generate(c.parallel.schedule, c.parallel.pp, c.train.microbatches);
  CpuDeviceOptions dry;
  dry.dry_run = true;
  s.device = std::make_unique<CpuDevice>(0, dry);
  s.alloc = std::make_unique<DeviceAllocator>(*s.device);
  if (memory_settings(c).host_masters) s.pinned = std::make_unique<DeviceAllocator>(*s.device, true);
  for (int r = 0; r < c.parallel.pp; ++r) {
    s.stages.emplace_back();
    for (int ch = 0; ch < s.schedule.chunks; ++ch) {
      StageSpec spec = stage_spec_of(c, s.schedule, r, ch, 0);
      spec.host_masters = s.pinned.get();
      s.stages.back().push_back(make_stage(model_spec_of(c), spec, *s.alloc));
    }
  }
  return s;
}

// Where each offloaded set starts its reload: `lookahead` ops before its first backward, never
// before the op after its last forward; STP's reload markers (docs/schedules.md, STP op lists, Offload markers) win
// where present, except under late reloads (lookahead 0: the op that reads the set). A set whose W
// is deferred also reloads its W-only records `lookahead` ops before its first W, never before the
// op after its B.
void place_prefetches(RankPlan& plan, const std::vector<sched::Op>& ops, int lookahead) {
  plan.prefetch.assign(ops.size(), {});
  std::map<std::pair<int, int>, int> last_f, first_b, first_w, marker;
  for (int k = 0; k < static_cast<int>(ops.size()); ++k) {
    const sched::Op& op = ops[static_cast<std::size_t>(k)];
    for (int i = 0; i < op.n_parts(); ++i) {
      const sched::Part& p = op.part(i);
      if (p.pass == sched::Pass::F) last_f[{p.chunk, p.mb}] = k;
      if (p.pass == sched::Pass::B && !first_b.count({p.chunk, p.mb})) first_b[{p.chunk, p.mb}] = k;
      if (p.pass == sched::Pass::W && !first_w.count({p.chunk, p.mb})) first_w[{p.chunk, p.mb}] = k;
    }
    for (const sched::ChunkMb& m : op.reload)
      if (!marker.count({m.chunk, m.mb})) marker[{m.chunk, m.mb}] = k;
  }
  for (auto& [key, b] : first_b) {
    const auto& units = plan.units[static_cast<std::size_t>(key.first)];
    if (std::none_of(units.begin(), units.end(), [](const UnitPlan& u) { return u.offload; })) continue;
    int f = last_f.count(key) ? last_f[key] : -1;
    int at = std::max(f + 1, b - lookahead);
    auto m = marker.find(key);
    if (!plan.late_reloads && m != marker.end() && m->second > f && m->second <= b) at = m->second;
    plan.prefetch[static_cast<std::size_t>(at)].push_back({key.first, key.second, false});
    auto w = first_w.find(key);
    if (w == first_w.end()) continue;
    int w_at = std::min(w->second, std::max(b + 1, w->second - lookahead));
    plan.prefetch[static_cast<std::size_t>(w_at)].push_back({key.first, key.second, true});
  }
}

// Two steps of the training process on dry-run devices (the second is the steady state: optimizer
// state exists, caches are warm), then, with validation (data.val_path), one evaluation, so the
// peaks cover it too; what each device's allocators and offload engine saw. `stream`, when given:
// the second step's parameter streaming per device (empty when nothing streams).
std::vector<Trainer::DeviceMemory> dry_run(const Config& config, const MemoryPlan& plan,
                                           std::vector<ParamStreamCounters>* stream = nullptr) {
  TrainerOptions o;
  o.dry_run = true;
  o.plan = &plan;
  Trainer dry(config, o);
  dry.step();
  StepResult second = dry.step();
  if (stream) *stream = std::move(second.param_stream);
  if (!config.data.val_path.empty()) dry.evaluate();
  return dry.device_memory();
}

// Model-state bytes of one device from its dry run: live bytes by category at the end of the
// second step (the steady state), and the optimizer's pinned host bytes.
void account_model_states(RankPrediction& p, const Trainer::DeviceMemory& d) {
  p.weight_bytes = d.device.by_category[static_cast<std::size_t>(MemoryCategory::Weights)];
  p.grad_bytes = d.device.by_category[static_cast<std::size_t>(MemoryCategory::Gradients)];
  p.optimizer_device_bytes = d.device.by_category[static_cast<std::size_t>(MemoryCategory::OptimizerState)];
  p.optimizer_host_bytes = d.optimizer_host_bytes;
  p.host_master_bytes = d.host_master_bytes;
  p.optimizer_shadow_bytes = d.optimizer_shadow_bytes;
  p.streamed_weight_bytes = d.streamed_weight_bytes;
  p.streamed_grad_bytes = d.streamed_grad_bytes;
}

// The copy time per step a device's compute cannot hide: the activation offload's (both
// directions overlap compute on their own streams, each at the link rate; a late reload starts
// when its reader needs it, so every H2D copy is exposed). Parameter streaming's copies (`stream`:
// the step's counters, or null) are recorded for the planner, which prices them as
// RankPrediction::param_stream_s (memory/planner.h, streaming_exposed_seconds).
void price_copies(RankPrediction& p, const ParamStreamCounters* stream, bool late_reloads, double link) {
  const double one_way_s = static_cast<double>(p.offload_bytes_per_step) / link;
  p.exposed_copy_s = std::max(0.0, one_way_s - p.compute_s);
  if (late_reloads) p.exposed_copy_s += one_way_s;
  if (!stream) return;
  // Every pass that writes a slice's gradients brings it up, or zeroes it on the device when it is
  // the step's first writer, and sends it back: the bytes up are those down less the zeroed ones.
  p.stream_grads_down_bytes = stream->d2h_bytes;
  p.stream_grads_up_bytes = stream->d2h_bytes - stream->zeroed_bytes;
  p.stream_weights_up_bytes = stream->h2d_bytes - p.stream_grads_up_bytes;
}

MemoryPlan keep_everything(const ModelLayout& s, int pp) {
  MemoryPlan mp;
  for (int r = 0; r < pp; ++r) {
    RankPlan rp;
    for (auto& st : s.stages[static_cast<std::size_t>(r)])
      rp.units.emplace_back(static_cast<std::size_t>(st->num_units()));
    rp.optimizer.assign(rp.units.size(), OptimizerPlacement::Device);
    rp.prefetch.assign(s.schedule.ranks[static_cast<std::size_t>(r)].size(), {});
    mp.ranks.push_back(std::move(rp));
  }
  return mp;
}

// ---- Pass 1: measure ----------------------------------------------------------------------------
// Contract: from the config and the stages' shapes alone (no dry run, no timing probe; nominal rates,
// so `stp plan` and `stp train` measure the same numbers): the planner's input without its cost
// model — policies and budget, per candidate unit the bytes each lever frees per microbatch and its
// forward time, unit counts, the model-state bytes of every chunk — and each pp rank's compute time
// per step. A unit's time is its FLOPs (the architecture's count: Architecture::unit_flops,
// models/registry.h) at the nominal rate.
struct Measured {
  PlannerInput input;             // evaluate and placeable_budget unset
  std::vector<double> compute_s;  // [pp rank] per step
};

ModelStateBytes chunk_state_bytes(Stage& st) {
  ModelStateBytes b;
  for (const ParamInfo& p : st.params()) {
    b.weights += p.param.bytes();
    if (p.compute.defined() && p.compute.storage() != p.param.storage()) b.weights += p.compute.bytes();
    b.gradients += p.grad.bytes();
    b.optimizer += 2 * p.param.bytes();  // AdamW m and v, f32 like the parameter
    if (p.host_master) b.host_masters += p.param.bytes();
    b.tied = b.tied || p.tied;
  }
  return b;
}

Measured measure(const Config& config, const ModelLayout& shape) {
  const int pp = config.parallel.pp, m = config.train.microbatches;
  const PlannerRates rates = planner_rates(config);
  const double flops = rates.flops_per_s;
  const double link = rates.link_bytes_per_s;

  const MemorySettings settings = memory_settings(config);
  const ModelSpec model = model_spec_of(config);
  const Architecture& arch = find_architecture(model.arch);
  Measured out;
  PlannerInput& in = out.input;
  in.device_budget = settings.device_budget;
  in.offload = settings.offload;
  in.recompute = settings.recompute;
  in.pp = pp;
  in.tp = config.parallel.tp;
  in.microbatches = m;
  in.link_bytes_per_s = link;
  in.optimizer_offload = settings.optimizer_offload;
  in.cpu_adamw_bytes_per_s = kCpuAdamWBytesPerS;
  // Host chunks without the tied parameter speculate (optim/host_update.h, Speculation).
  in.optimizer_overlap = settings.optimizer_overlap != OffloadPolicy::None;
  // Parameter streaming per (rank, chunk), in the same search (memory/planner.h).
  in.param_offload = settings.param_offload;
  out.compute_s.assign(static_cast<std::size_t>(pp), 0.0);
  for (int r = 0; r < pp; ++r) {
    in.units.emplace_back();
    in.chunk_states.emplace_back();
    for (int ch = 0; ch < shape.schedule.chunks; ++ch) {
      Stage& st = *shape.stages[static_cast<std::size_t>(r)][static_cast<std::size_t>(ch)];
      in.units.back().push_back(st.num_units());
      in.chunk_states.back().push_back(chunk_state_bytes(st));
      const StageSpec spec = stage_spec_of(config, shape.schedule, r, ch, 0);
      for (int u = 0; u < st.num_units(); ++u) {
        double fs = arch.unit_flops(model, spec, st.unit_kind(u)) / flops;
        out.compute_s[static_cast<std::size_t>(r)] += 3.0 * m * fs;  // F + B + W ~ 3 F
        std::size_t full = st.recompute_saving(u, Recompute::Full);
        if (full == 0) continue;  // only the transformer units have records worth moving
        PlanCandidate c;
        c.pp_rank = r;
        c.chunk = ch;
        c.unit = u;
        c.name = st.unit_name(u);
        // What F leaves behind: everything Full drops plus the kept input (B, T, C).
        c.offload_bytes = full + static_cast<std::size_t>(config.train.micro_batch_size) * config.model.seq_len *
                                     config.model.n_embd * sizeof(float);
        c.selective_saving = st.recompute_saving(u, Recompute::Selective);
        c.full_saving = full;
        c.forward_s = fs;
        c.selective_cost = st.recompute_cost(u, Recompute::Selective);
        c.full_cost = st.recompute_cost(u, Recompute::Full);
        in.candidates.push_back(c);
      }
    }
  }
  return out;
}

// ---- The cost model: dry runs ---------------------------------------------------------------------
// Contract: evaluate() places each rank's prefetches and predicts every device's peaks (exact: the
// real run's allocation sequence), pinned pool, copy bytes and step-time cost; places() says whether
// the real allocator can place a plan within a budget; placeable() finds the smallest such budget.
// Candidate plans run without a budget, so an over-budget plan reports its peak instead of failing;
// without a host budget too, so a pinned pool over memory.host_budget is measured (and check_plan
// names it) instead of failing the dry run as if the device could not place the plan.
class DryRunCostModel {
 public:
  // loss_chunk: the loss head's chunk every plan it runs has (RankPlan::loss_chunk_tokens); tiles:
  // the sequence groups of its tiled unit backward (RankPlan::unit_tiles).
  DryRunCostModel(const Config& config, const ModelLayout& shape, const Measured& measured, std::int64_t loss_chunk,
                  int tiles)
      : shape_(shape), measured_(measured), dry_config_(config), loss_chunk_(loss_chunk), tiles_(tiles) {
    dry_config_.output.trace = false;
    dry_config_.memory.device_budget.reset();
    dry_config_.memory.host_budget.reset();
  }

  std::vector<RankPrediction> evaluate(std::vector<RankPlan>& plans) const {
    const PlannerInput& in = measured_.input;
    const int pp = in.pp, tp = in.tp, m = in.microbatches;
    const double link = in.link_bytes_per_s;
    MemoryPlan mp;  // the optimizer placement and the loss chunk travel in each RankPlan
    for (int r = 0; r < pp; ++r) {
      plans[static_cast<std::size_t>(r)].loss_chunk_tokens = loss_chunk_;
      plans[static_cast<std::size_t>(r)].unit_tiles = tiles_;
      // Lookahead in ops: enough average op time to cover one set's copy.
      const auto& ops = shape_.schedule.ranks[static_cast<std::size_t>(r)];
      double set_bytes = 0;
      for (const PlanCandidate& c : in.candidates)
        if (c.pp_rank == r && plans[static_cast<std::size_t>(r)]
                                  .units[static_cast<std::size_t>(c.chunk)][static_cast<std::size_t>(c.unit)]
                                  .offload)
          set_bytes += static_cast<double>(c.offload_bytes) / shape_.schedule.chunks;
      double op_s = measured_.compute_s[static_cast<std::size_t>(r)] / std::max<std::size_t>(1, ops.size());
      int lookahead = std::max(1, static_cast<int>(std::ceil(set_bytes / link / std::max(op_s, 1e-12))));
      if (plans[static_cast<std::size_t>(r)].late_reloads) lookahead = 0;
      place_prefetches(plans[static_cast<std::size_t>(r)], ops, lookahead);
    }
    mp.ranks = plans;
    // The search evaluates some plans more than once (a fragmentation retry replays the first
    // rounds; the reverse and the second pass of the activation levers revisit plans): a dry run is
    // a pure function of the plan, so each distinct plan runs once.
    std::string key = plan_key(mp.ranks);
    if (auto it = evaluated_.find(key); it != evaluated_.end()) return it->second;
    std::vector<RankPrediction> out;
    std::vector<ParamStreamCounters> stream;
    auto mem = dry_run(dry_config_, mp, &stream);
    for (int g = 0; g < pp * tp; ++g) {
      const auto& d = mem[static_cast<std::size_t>(g)];
      const int r = g / tp;
      RankPrediction p;
      p.peak_device_bytes = d.device.peak_allocated;
      p.peak_reserved_bytes = d.device.peak_reserved;
      p.peak_by_category = d.device.peak_by_category;
      p.host_pinned_bytes = d.pinned.high_water;
      account_model_states(p, d);
      p.offload_bytes_per_step = d.d2h_bytes / 2;
      p.compute_s = measured_.compute_s[static_cast<std::size_t>(r)];
      for (const PlanCandidate& c : in.candidates) {
        if (c.pp_rank != r) continue;
        Recompute level = plans[static_cast<std::size_t>(r)]
                              .units[static_cast<std::size_t>(c.chunk)][static_cast<std::size_t>(c.unit)]
                              .recompute;
        double cost = level == Recompute::Full ? c.full_cost : level == Recompute::Selective ? c.selective_cost : 0;
        p.recompute_s += m * c.forward_s * cost;
      }
      price_copies(p, g < static_cast<int>(stream.size()) ? &stream[static_cast<std::size_t>(g)] : nullptr,
                   plans[static_cast<std::size_t>(r)].late_reloads, link);
      out.push_back(p);
    }
    evaluated_.emplace(std::move(key), out);
    return out;
  }

  // Live bytes that fit a budget may still not be placeable in it (fragmentation). The dry run
  // places them exactly as the real run will, so "does plan P fit budget B" is one dry run. When
  // P's placements do not place it, each rank takes the placement that needs the least memory
  // (choose_placement) and, when that fits, `plans` keep them.
  bool places(std::vector<RankPlan>& plans, std::size_t budget) const {
    if (fits(plans, budget)) return true;
    std::vector<RankPlan> placed = plans;
    if (choose_placement(placed, budget) > budget) return false;
    STP_ASSERT(fits(placed, budget), "a placement's high water did not place the plan in its budget");
    plans = std::move(placed);
    return true;
  }

  // The smallest budget that places `plans`, each rank under its best placement (choose_placement,
  // remembered for place_as_minimum()).
  std::size_t placeable(const std::vector<RankPlan>& plans, std::size_t live_peak) {
    min_exact_ = true;
    std::vector<RankPlan> placed = plans;
    const std::size_t high_water = choose_placement(placed, live_peak);
    STP_ASSERT(high_water >= live_peak, "placement below the live peak");
    min_placements_.clear();
    for (const RankPlan& rp : placed) min_placements_.push_back({rp.block_placement, rp.placement_table});
    return high_water;
  }
  // Gives the strongest plan, measured by the last placeable() call, the placements that place it
  // in min_device_budget.
  void place_as_minimum(std::vector<RankPlan>& strongest) const {
    STP_ASSERT(min_placements_.size() == strongest.size(), "the strongest plan's placements are unknown");
    for (std::size_t r = 0; r < strongest.size(); ++r)
      strongest[r].block_placement = min_placements_[r].first, strongest[r].placement_table = min_placements_[r].second;
  }
  bool min_exact() const { return min_exact_; }
  // A new choice starts without an exact minimum: placeable() ran for the plans of the last one.
  void forget_min() {
    min_exact_ = false;
    min_placements_.clear();
  }

 private:
  // A plan of `plans` (their streaming decisions included) with this model's loss chunk and tiles.
  MemoryPlan with_settings(const std::vector<RankPlan>& plans) const {
    MemoryPlan mp;
    mp.ranks = plans;
    for (RankPlan& rp : mp.ranks) rp.loss_chunk_tokens = loss_chunk_, rp.unit_tiles = tiles_;
    return mp;
  }

  bool fits(const std::vector<RankPlan>& plans, std::size_t budget) const {
    MemoryPlan mp = with_settings(plans);
    Config budgeted = dry_config_;
    budgeted.memory.device_budget = budget;
    try {
      dry_run(budgeted, mp);
      return true;
    } catch (const OutOfMemoryError&) {
      return false;
    }
  }

  // Per pp rank, the furthest byte its TP ranks' device arenas use when every rank places by `p`
  // (Planned: by `tables`, one per rank): the arena's layout does not depend on its capacity
  // (memory/block_arena.h), so it is the high water of one dry run in a budget that holds the plan
  // (`hint` twice, doubled until it does). SIZE_MAX for a rank whose planned placement missed.
  std::vector<std::size_t> high_waters(const std::vector<RankPlan>& plans, BlockPlacement p, std::size_t hint,
                                       const std::vector<std::shared_ptr<const PlacementTable>>& tables = {}) const {
    MemoryPlan mp = with_settings(plans);
    for (std::size_t r = 0; r < mp.ranks.size(); ++r)
      mp.ranks[r].block_placement = p, mp.ranks[r].placement_table = tables.empty() ? nullptr : tables[r];
    Config budgeted = dry_config_;
    for (std::size_t budget = 2 * std::max<std::size_t>(hint, 1 << 20);; budget *= 2) {
      budgeted.memory.device_budget = budget;
      try {
        const auto mem = dry_run(budgeted, mp);
        std::vector<std::size_t> out(plans.size(), 0);
        for (std::size_t g = 0; g < mem.size(); ++g) {
          std::size_t& hw = out[g / static_cast<std::size_t>(measured_.input.tp)];
          hw = mem[g].device.placement_misses ? SIZE_MAX : std::max(hw, mem[g].device.high_water);
        }
        return out;
      } catch (const OutOfMemoryError&) {
        STP_ASSERT(budget < (std::size_t{1} << 50), "no budget places the plan");
      }
    }
  }

  // Gives each pp rank the placement (BlockPlacement, in its order: best fit wins ties) that places
  // `plans` in the least memory, and returns the smallest budget that then places them all.
  // Placement moves no allocation or free, only addresses, so a rank's high water does not depend
  // on the other ranks' placements: one dry run per placement decides every rank.
  // The planned placement (a table per rank from the plan's trace, placement_tables()) is the last
  // candidate: a rank takes it where its dry run places every allocation at the table's offset and
  // the high water is lower than every online placement's.
  std::size_t choose_placement(std::vector<RankPlan>& plans, std::size_t hint) const {
    std::vector<std::size_t> best(plans.size(), SIZE_MAX);
    for (RankPlan& rp : plans) rp.placement_table = nullptr;
    for (std::size_t i = 0; i < kOnlinePlacements; ++i) {
      const BlockPlacement p = static_cast<BlockPlacement>(i);
      const std::vector<std::size_t> hw = high_waters(plans, p, hint);
      for (std::size_t r = 0; r < plans.size(); ++r)
        if (hw[r] < best[r]) best[r] = hw[r], plans[r].block_placement = p;
    }
    const auto tables = placement_tables(plans);
    if (std::any_of(tables.begin(), tables.end(), [](const auto& t) { return t != nullptr; })) {
      const std::vector<std::size_t> hw = high_waters(plans, BlockPlacement::Planned, hint, tables);
      for (std::size_t r = 0; r < plans.size(); ++r)
        if (tables[r] && hw[r] < best[r])
          best[r] = hw[r], plans[r].block_placement = BlockPlacement::Planned, plans[r].placement_table = tables[r];
    }
    return *std::max_element(best.begin(), best.end());
  }

  // Per pp rank, the planned placement of `plans` (memory/placement_table.h): laid out from a dry run
  // of the setup and three steps that records every device arena's allocations. Null where the trace
  // is not a steady state or the rank's TP ranks allocate differently, and on every rank under data
  // parallelism: the dry runs trace the first replica only, and another replica's shards (the
  // distributed optimizer's) may allocate otherwise.
  std::vector<std::shared_ptr<const PlacementTable>> placement_tables(const std::vector<RankPlan>& plans) const {
    if (dry_config_.parallel.dp > 1) return std::vector<std::shared_ptr<const PlacementTable>>(plans.size());
    MemoryPlan mp = with_settings(plans);
    Config unbudgeted = dry_config_;  // the trace does not depend on the placement or the budget
    unbudgeted.memory.device_budget = kNoBudget;
    TrainerOptions o;
    o.dry_run = true;
    o.plan = &mp;
    o.record_allocations = true;
    Trainer dry(unbudgeted, o);
    const std::size_t devices = static_cast<std::size_t>(measured_.input.pp * measured_.input.tp);
    std::vector<std::vector<StepMark>> marks(devices);
    auto mark = [&] {
      const auto mem = dry.device_memory();
      for (std::size_t g = 0; g < devices; ++g)
        marks[g].push_back({mem[g].device.alloc_count, mem[g].device.alloc_count + mem[g].device.free_count});
    };
    for (int step = 0; step < 3; ++step) mark(), dry.step();
    mark();
    const auto mem = dry.device_memory();
    std::vector<std::shared_ptr<const PlacementTable>> out(plans.size());
    const std::size_t tp = static_cast<std::size_t>(measured_.input.tp);
    for (std::size_t r = 0; r < plans.size(); ++r) {
      bool alike = true;
      for (std::size_t g = r * tp + 1; g < (r + 1) * tp; ++g)
        alike = alike && mem[g].allocations == mem[r * tp].allocations;
      auto table = plan_placement(mem[r * tp].allocations, marks[r * tp], marks[r * tp].back().events);
      if (alike && table) out[r] = std::make_shared<const PlacementTable>(std::move(*table));
    }
    return out;
  }

  // Every decision of `ranks` the dry run reads, as a string: equal strings, equal dry runs.
  static std::string plan_key(const std::vector<RankPlan>& ranks) {
    std::string k;
    auto put = [&k](long long v) { k += std::to_string(v), k += ','; };
    for (const RankPlan& rp : ranks) {
      k += 'R';
      for (const auto& chunk : rp.units) {
        k += 'c';
        for (const UnitPlan& u : chunk) put(static_cast<int>(u.recompute) * 2 + u.offload);
      }
      k += 'p';
      for (const auto& op : rp.prefetch) {
        k += ';';
        for (const PrefetchPoint& pf : op) put(pf.chunk), put(pf.mb), put(pf.weight);
      }
      k += 'o';
      for (OptimizerPlacement o : rp.optimizer) put(static_cast<int>(o));
      k += 's';
      for (bool b : rp.param_stream) put(b);
      put(rp.late_reloads), put(rp.late_params), put(rp.loss_chunk_tokens), put(rp.unit_tiles);
      put(static_cast<int>(rp.block_placement));
      put(rp.placement_table ? static_cast<long long>(rp.placement_table->digest() >> 1) : -1);
    }
    return k;
  }

  const ModelLayout& shape_;
  const Measured& measured_;
  // evaluate()'s predictions by plan_key: the planner asks for some plans more than once.
  mutable std::map<std::string, std::vector<RankPrediction>> evaluated_;
  Config dry_config_;
  std::int64_t loss_chunk_ = 0;
  int tiles_ = 1;
  bool min_exact_ = false;
  std::vector<std::pair<BlockPlacement, std::shared_ptr<const PlacementTable>>> min_placements_;
};

// ---- Pass 2: choose levers ------------------------------------------------------------------------
// Contract: plan_memory (memory/planner.h) on the measured numbers for `budget`, priced by `model`:
// keep / offload / recompute per unit and, jointly, each chunk's optimizer placement
// (memory.optimizer_offload). The minimum feasible budget is the placeable one (exact)
// when `exact_minimum` is set or the budget is infeasible, else the strongest plan's live-byte peak.
MemoryPlan choose_levers(Measured& measured, DryRunCostModel& model, const ModelLayout& shape, std::size_t budget,
                         bool exact_minimum, bool first) {
  PlannerInput& in = measured.input;
  in.device_budget = budget;
  in.evaluate = [&model](std::vector<RankPlan>& plans) { return model.evaluate(plans); };
  in.placeable_budget = nullptr;  // after the first choice the minimum is known
  if (first)
    in.placeable_budget = [&, exact_minimum](const std::vector<RankPlan>& plans, std::size_t live_peak) {
      return exact_minimum || live_peak > in.device_budget ? model.placeable(plans, live_peak) : live_peak;
    };
  MemoryPlan plan = plan_memory(in);
  if (plan.ranks.empty()) {  // no candidates: nothing to decide
    MemoryPlan keep = keep_everything(shape, in.pp);
    plan.ranks = std::move(keep.ranks);
  }
  return plan;
}

// ---- Pass 3: verify by dry run --------------------------------------------------------------------
// Contract: the chosen plan's allocations, placed by the real allocator within the real budget,
// never fail. The choice is made on live bytes; when the dry run under the budget cannot place them
// with best fit, nor with each rank's best placement (DryRunCostModel::places; fragmentation),
// choose again for 5% less, up to 8 times. A budget at or above the minimum always ends feasible:
// when the shrunken budget leaves only the strongest plan, that plan places in the real budget
// under the minimum's placements. Returns the plan with feasible, min_device_budget and the
// summary's notes set.
MemoryPlan choose_and_verify(Measured& measured, DryRunCostModel& model, const ModelLayout& shape, bool exact_minimum) {
  model.forget_min();
  const std::size_t budget = measured.input.device_budget;
  std::size_t planning_budget = budget;
  MemoryPlan plan;
  std::size_t min_budget = 0;
  for (int attempt = 0;; ++attempt) {
    plan = choose_levers(measured, model, shape, planning_budget, exact_minimum, attempt == 0);
    plan.device_budget = budget;
    if (attempt == 0) min_budget = plan.min_device_budget;
    if (budget != kNoBudget && !plan.feasible && attempt && !model.min_exact())  // plan.ranks: the strongest plan
      min_budget = model.placeable(plan.ranks, min_budget);
    plan.min_device_budget = min_budget;
    plan.min_budget_exact = model.min_exact();
    if (budget == kNoBudget) break;
    if (!plan.feasible) {  // plan.ranks: the strongest plan, which placeable() measured
      model.place_as_minimum(plan.ranks);
      if (attempt && budget >= plan.min_device_budget) {
        plan.feasible = true;
        plan.summary += "(the strongest plan: weaker ones could not be placed in the budget)\n";
      }
      break;
    }
    if (model.places(plan.ranks, budget)) {
      if (attempt)  // a share, not bytes: planning_budget is the budget less `attempt` twentieths of it
        plan.summary += str("(planned for ", 100 - 5 * attempt, "% of the budget to leave room for fragmentation)\n");
      break;
    }
    if (attempt == 7) {
      plan.feasible = false;
      plan.summary += "fragmentation: the live bytes fit but the allocator could not place them\n";
      break;
    }
    planning_budget -= budget / 20;
  }
  return plan;
}

// ---- Pass 4: report -------------------------------------------------------------------------------
// Contract: fills what people read and nothing the run depends on: per device the model states on
// the device (the dry run's category bytes at the peak) and on the host (chunks whose optimizer is
// placed there), the CPU optimizer time, and the optimizer placement lines of the summary.
// The dry run's pinned model states: the f32 masters that moved (weights: host masters, or the
// owned sharded masters of the distributed optimizer), the AdamW moments and the staging of
// parameters and gradients (optimizer).
// Parameter streaming adds the streamed chunks' weights, bf16 copies and gradients.
void fill_host_states(RankPrediction& p) {
  p.host_states.weights = p.host_master_bytes + p.streamed_weight_bytes;
  p.host_states.gradients = p.streamed_grad_bytes;
  p.host_states.optimizer = p.optimizer_host_bytes - p.host_master_bytes;
}

void report(MemoryPlan& plan, const Measured& measured) {
  const PlannerInput& in = measured.input;
  for (std::size_t g = 0; g < plan.predicted.size(); ++g) {
    RankPrediction& p = plan.predicted[g];
    const int r = static_cast<int>(g) / in.tp;
    p.device_states.weights = p.peak_by_category[static_cast<std::size_t>(MemoryCategory::Weights)];
    p.device_states.gradients = p.peak_by_category[static_cast<std::size_t>(MemoryCategory::Gradients)];
    p.device_states.optimizer = p.peak_by_category[static_cast<std::size_t>(MemoryCategory::OptimizerState)];
    p.host_states = {};
    const auto& chunks = in.chunk_states[static_cast<std::size_t>(r)];
    std::size_t host_params = 0;
    for (std::size_t ch = 0; ch < chunks.size(); ++ch) {
      if (plan.ranks[static_cast<std::size_t>(r)].optimizer_placement(static_cast<int>(ch)) != OptimizerPlacement::Host)
        continue;
      host_params += chunks[ch].weights / sizeof(float);
    }
    fill_host_states(p);
    // AdamW streams 28 bytes per parameter (read p, g, m, v; write p, m, v).
    p.cpu_optimizer_s = static_cast<double>(host_params) * 28.0 / kCpuAdamWBytesPerS;
  }
  std::string placement;
  for (std::size_t r = 0; r < plan.ranks.size(); ++r)
    for (std::size_t ch = 0; ch < plan.ranks[r].units.size(); ++ch)
      if (plan.ranks[r].optimizer_placement(static_cast<int>(ch)) == OptimizerPlacement::Host)
        placement +=
            str("rank ", r, " chunk ", ch, ": optimizer on the host",
                plan.ranks[r].streams_params(static_cast<int>(ch)) ? ", weights and gradients streamed" : "", "\n");
  plan.summary += placement.empty() ? "every optimizer on the device\n" : placement;
  for (std::size_t r = 0; r < plan.ranks.size(); ++r)  // best fit is the default: only the others
    if (plan.ranks[r].block_placement != BlockPlacement::BestFit)
      plan.summary +=
          plan.ranks[r].placement_table
              ? str("rank ", r, ": device blocks placed by a table of ", plan.ranks[r].placement_table->entries(),
                    " offsets laid out from the dry run's trace (planned: it places this plan in the least "
                    "memory)\n")
              : str("rank ", r, ": device blocks placed ", to_string(plan.ranks[r].block_placement),
                    " (it places this plan in the least memory)\n");
  if (plan.optimizer_overlap)
    plan.summary += "optimizer overlap: the host chunks downloaded early update during the backward (speculation)\n";
}

// memory.optimizer_overlap: the dry runs allocated the shadows unless it is none; auto keeps them
// when the process's pinned total (train/host_needs.h: activation pools and model states, shadows
// included, every replica it drives) fits memory.host_budget, and otherwise drops them from the
// prediction (the run then allocates none).
void decide_overlap(MemoryPlan& plan, const Config& config) {
  const MemorySettings settings = memory_settings(config);
  std::size_t shadows = 0;
  for (RankPrediction& p : plan.predicted)
    shadows += p.optimizer_shadow_bytes, fill_host_states(p);  // host_needs reads them
  plan.optimizer_overlap = shadows > 0 && (settings.optimizer_overlap == OffloadPolicy::All ||
                                           (settings.optimizer_overlap == OffloadPolicy::Auto &&
                                            host_needs(plan, config).pinned() <= settings.host_budget));
  if (plan.optimizer_overlap) return;
  for (RankPrediction& p : plan.predicted) {
    p.optimizer_host_bytes -= p.optimizer_shadow_bytes;
    p.optimizer_shadow_bytes = 0;
  }
}

// The four passes for one loss head chunk (0: unchunked; RankPlan::loss_chunk_tokens) and one unit
// tiling (1: untiled; RankPlan::unit_tiles).
MemoryPlan plan_with_loss_chunk(const Config& config, const ModelLayout& shape, bool exact_minimum,
                                std::int64_t loss_chunk, int tiles) {
  Measured measured = measure(config, shape);
  DryRunCostModel model(config, shape, measured, loss_chunk, tiles);
  MemoryPlan plan = choose_and_verify(measured, model, shape, exact_minimum);
  plan.optimizer_offload = false;
  for (RankPlan& rp : plan.ranks) {
    rp.loss_chunk_tokens = loss_chunk;
    rp.unit_tiles = tiles;
    for (std::size_t ch = 0; ch < rp.units.size(); ++ch)
      plan.optimizer_offload =
          plan.optimizer_offload || rp.optimizer_placement(static_cast<int>(ch)) == OptimizerPlacement::Host;
  }
  decide_overlap(plan, config);
  report(plan, measured);
  if (loss_chunk > 0) plan.summary += str("loss head: chunks of ", loss_chunk, " tokens\n");
  if (tiles > 1) plan.summary += str("unit backward: ", tiles, " sequence groups (full-recompute units)\n");
  return plan;
}

// The minimum feasible budget of one loss head chunk and unit tiling without a search for a budget:
// the strongest plan's, placed by the real allocator when `exact` (what choose_and_verify's first
// choice finds with exact_minimum, whatever the budget), else its live-byte peak. A budget of 0 makes
// plan_memory evaluate the strongest plan and stop there: one dry run (and the placements' when
// exact) where a search would run its rounds only for this number.
std::size_t strongest_minimum(const Config& config, const ModelLayout& shape, bool exact, std::int64_t loss_chunk,
                              int tiles) {
  Measured measured = measure(config, shape);
  DryRunCostModel model(config, shape, measured, loss_chunk, tiles);
  PlannerInput& in = measured.input;
  in.device_budget = 0;
  in.evaluate = [&model](std::vector<RankPlan>& plans) { return model.evaluate(plans); };
  in.placeable_budget = nullptr;
  if (exact)
    in.placeable_budget = [&model](const std::vector<RankPlan>& plans, std::size_t live_peak) {
      return model.placeable(plans, live_peak);
    };
  return plan_memory(in).min_device_budget;
}

// model.loss_chunk_tokens resolved for one unit tiling.
MemoryPlan plan_with_loss_chunks(const Config& config, const ModelLayout& shape, bool exact_minimum, int tiles) {
  const LossChunkSetting setting = loss_chunk_setting(config);
  MemoryPlan plan = plan_with_loss_chunk(config, shape, exact_minimum, setting.tokens, tiles);
  const std::int64_t tokens = static_cast<std::int64_t>(config.train.micro_batch_size) * config.model.seq_len;
  const std::vector<std::int64_t> chunks = setting.automatic ? auto_loss_chunks(tokens) : std::vector<std::int64_t>{};
  if (chunks.empty()) return plan;
  if (plan.feasible) {  // auto is none while the unchunked plan fits ...
    if (exact_minimum)  // ... and the minimum is the smallest chunk's, the budget below which auto fails
      plan.min_device_budget =
          std::min(plan.min_device_budget, strongest_minimum(config, shape, true, chunks.back(), tiles));
    return plan;
  }
  // auto, over budget: the largest chunk whose plan fits; if none does, the smallest (the strongest
  // plan, whose minimum budget the error names).
  for (std::int64_t chunk : chunks) {
    plan = plan_with_loss_chunk(config, shape, exact_minimum, chunk, tiles);
    if (plan.feasible) break;
  }
  return plan;
}

// The minimum of `tiles` (the most auto tries) for make_memory_plan while the untiled plan fits: the
// strongest plan's at the loss chunk setting and, with an exact minimum under its auto, at the
// smallest chunk (as plan_with_loss_chunks reports it when the tiled plan fits too).
std::size_t most_tiles_minimum(const Config& config, const ModelLayout& shape, bool exact_minimum, int tiles) {
  const LossChunkSetting setting = loss_chunk_setting(config);
  std::size_t min = strongest_minimum(config, shape, exact_minimum, setting.tokens, tiles);
  const std::int64_t tokens = static_cast<std::int64_t>(config.train.micro_batch_size) * config.model.seq_len;
  const std::vector<std::int64_t> chunks = setting.automatic ? auto_loss_chunks(tokens) : std::vector<std::int64_t>{};
  if (exact_minimum && !chunks.empty())
    min = std::min(min, strongest_minimum(config, shape, true, chunks.back(), tiles));
  return min;
}

}  // namespace

// ---- The four passes ----------------------------------------------------------------------------
// Optimizer placement (memory.optimizer_offload) is decided with the activation levers in pass 2:
// none / all as set, auto per (rank, chunk) (memory/planner.h). The byte accounting is the dry
// run's (account_model_states): a chunk whose state is on the host keeps only its weights and
// gradients on the device, and the pinned host memory holds its moments plus the staging of its
// parameters and gradients (HostUpdate).
MemoryPlan make_memory_plan(const Config& config, bool exact_minimum) {
  const ModelLayout shape = build_shape(config);
  const UnitTilesSetting setting = unit_tiles_setting(config);
  MemoryPlan plan = plan_with_loss_chunks(config, shape, exact_minimum, setting.tiles);
  const std::vector<int> tilings =
      setting.automatic ? auto_unit_tiles(config.train.micro_batch_size) : std::vector<int>{};
  if (tilings.empty()) return plan;
  if (plan.feasible) {  // auto is untiled while the untiled plan fits, after the loss chunk, and the
    // minimum is the most tiles' (exact, or its live-byte bound), the budget below which auto fails:
    // under model.loss_chunk_tokens: auto, exact, the smallest chunk's too
    plan.min_device_budget =
        std::min(plan.min_device_budget, most_tiles_minimum(config, shape, exact_minimum, tilings.back()));
    return plan;
  }
  // auto, over budget: the fewest tiles whose plan fits (smaller GEMMs cost time); if none does, the
  // most (the strongest plan, whose minimum budget the error names).
  for (int tiles : tilings) {
    plan = plan_with_loss_chunks(config, shape, exact_minimum, tiles);
    if (plan.feasible) break;
  }
  return plan;
}

void check_plan(const MemoryPlan& plan, const Config& config, ByteStyle style) {
  check_plan(plan, config, memory_settings(config), style);
}

void check_plan(const MemoryPlan& plan, const Config& config, const MemorySettings& settings, ByteStyle style) {
  auto bytes = [style](std::size_t b) { return format_bytes(b, style); };
  if (!plan.feasible)
    throw Error(str("memory.device_budget = ", bytes(plan.device_budget), " is too small (memory.offload: ",
                    to_string(settings.offload), ", memory.recompute: ", to_string(settings.recompute),
                    "): ", describe_infeasible(plan, style), "; raise memory.device_budget to at least that",
                    settings.offload == OffloadPolicy::None || settings.recompute == RecomputePolicy::None
                        ? ", or set memory.offload / memory.recompute to auto"
                        : "",
                    config.model.loss_chunk_tokens == "none" ? ", or set model.loss_chunk_tokens to auto" : "",
                    ", or lower train.micro_batch_size."));
  // What the plan pins: the activation pools, and the model states it places on the host (every
  // lever that pins reports them in RankPrediction::host_states: train/host_needs.h), the
  // speculation's shadows and the streamed weights and gradients among them.
  const HostNeeds needs = host_needs(plan, config);
  const std::size_t pinned = needs.pinned(), activations = needs.pinned_activations, states = needs.pinned_states;
  std::size_t shadows = 0, streamed = 0;
  for (const RankPrediction& p : plan.predicted)
    shadows += p.optimizer_shadow_bytes, streamed += p.streamed_weight_bytes + p.streamed_grad_bytes;
  if (streamed > 0 && pinned > settings.host_budget)
    throw Error(str(host_budget_text(settings, style),
                    " is too small for the streamed weights and gradients (memory.param_offload): they need ",
                    bytes(streamed), ", plus ", bytes(states - streamed), " of offloaded optimizer state",
                    activations ? str(" and ", bytes(activations), " of offloaded activations") : std::string(), " (",
                    format_bytes(pinned, style, Rounding::Up),
                    " in all); raise memory.host_budget to at least that, or set memory.param_offload: none"));
  if (states > 0 && pinned > settings.host_budget)
    throw Error(str(
        host_budget_text(settings, style), " is too small for the model states in pinned host memory: the plan needs ",
        bytes(states), " (AdamW moments, parameter / gradient staging, f32 masters under bf16",
        shadows ? str(", ", bytes(shadows), " of speculation shadows (memory.optimizer_overlap: all)") : std::string(),
        activations ? str(", plus ", bytes(activations), " of offloaded activations") : std::string(), ", ",
        format_bytes(pinned, style, Rounding::Up),
        " in all); raise memory.host_budget to at least that, or set memory.optimizer_offload: none",
        shadows ? " or memory.optimizer_overlap: auto" : ""));
  if (pinned > settings.host_budget)
    throw Error(str("the plan offloads ", bytes(pinned), " of activations to pinned host memory but ",
                    host_budget_text(settings, style),
                    "; raise memory.host_budget, or set memory.offload: none to recompute instead"));
}

void check_host_machine(const MemoryPlan& plan, const Config& config, const MemorySettings& settings, ByteStyle style) {
  const std::uint64_t has = settings.machine.share();
  if (has == 0) return;  // unknown: nothing to hold the run against
  auto bytes = [style](std::size_t b) { return format_bytes(b, style); };
  if (!settings.host_budget_auto && settings.host_budget != kNoBudget && settings.host_budget > has)
    throw Error(str("memory.host_budget = ", bytes(settings.host_budget), " but this machine has ",
                    settings.machine.describe(style), "; lower memory.host_budget to at most that, or set it to auto (",
                    bytes(auto_host_budget(settings.machine)), " here: what it has less the ",
                    bytes(host_reserve_bytes(has)), " reserve)"));
  const HostNeeds needs = host_needs(plan, config);
  if (needs.total() > has)
    throw Error(str("the run needs ", format_bytes(needs.total(), style, Rounding::Up),
                    " of host memory: ", bytes(needs.pinned()), " pinned (offloaded activations and model states), ",
                    bytes(needs.pageable.peak()), " pageable (the checkpoint save, model.init_from or train.resume)",
                    needs.devices ? str(" and ", bytes(needs.devices), " of the CPU backend's devices") : std::string(),
                    ", but this machine has ", settings.machine.describe(style),
                    "; move less to the host (memory.offload, memory.optimizer_offload: none), lower the device "
                    "memory, or run where more memory is available"));
}

}  // namespace stp
