#include "memory/planner.h"

#include <algorithm>
#include <limits>

#include "base/error.h"

namespace stp {
namespace {

// Every unit kept, every chunk's optimizer on the device.
std::vector<RankPlan> empty_plans(const PlannerInput& in) {
  std::vector<RankPlan> plans(static_cast<std::size_t>(in.pp));
  for (int r = 0; r < in.pp; ++r) {
    RankPlan& p = plans[static_cast<std::size_t>(r)];
    for (int n : in.units[static_cast<std::size_t>(r)]) p.units.emplace_back(static_cast<std::size_t>(n));
    p.optimizer.assign(p.units.size(), OptimizerPlacement::Device);
  }
  return plans;
}

UnitPlan& at(std::vector<RankPlan>& plans, const PlanCandidate& c) {
  return plans[static_cast<std::size_t>(c.pp_rank)]
      .units[static_cast<std::size_t>(c.chunk)][static_cast<std::size_t>(c.unit)];
}

// The strongest recompute level a mode allows for a candidate.
Recompute strongest(RecomputePolicy mode, const PlanCandidate& c) {
  if (mode == RecomputePolicy::None) return Recompute::None;
  if (mode == RecomputePolicy::Selective) return c.selective_saving ? Recompute::Selective : Recompute::None;
  if (c.full_saving) return Recompute::Full;
  return c.selective_saving ? Recompute::Selective : Recompute::None;
}

std::size_t peak_of_pp_rank(const PlannerInput& in, const std::vector<RankPrediction>& pred, int pp_rank) {
  std::size_t peak = 0;
  for (int t = 0; t < in.tp; ++t)
    peak = std::max(peak, pred[static_cast<std::size_t>(pp_rank * in.tp + t)].peak_device_bytes);
  return peak;
}

struct Move {
  const PlanCandidate* c = nullptr;
  bool offload = false;
  Recompute level = Recompute::None;
  double cost_per_byte = 0;
  int optimizer_chunk = -1;  // >= 0: move this chunk's optimizer state to the host (c is null)
  int stream_chunk = -1;     // >= 0: stream this chunk, its optimizer on the host (c is null)
  bool any() const { return c || optimizer_chunk >= 0 || stream_chunk >= 0; }
};

// Which kinds of model-state move the greedy rounds may take (the auto policies).
struct StateMoves {
  bool optimizer = false, stream = false;
};

void place_every_optimizer(std::vector<RankPlan>& plans, OptimizerPlacement where) {
  for (RankPlan& p : plans) p.optimizer.assign(p.units.size(), where);
}

// Streams chunk `ch` of a rank (or, with `on` false, stops); a streamed chunk's optimizer is on the
// host (the CPU AdamW updates the streamed host copies in place).
void set_stream(RankPlan& p, std::size_t ch, bool on) {
  if (p.param_stream.size() < p.units.size()) p.param_stream.resize(p.units.size(), false);
  if (p.optimizer.size() < p.units.size()) p.optimizer.resize(p.units.size(), OptimizerPlacement::Device);
  p.param_stream[ch] = on;
  if (on) p.optimizer[ch] = OptimizerPlacement::Host;
}

void stream_every_chunk(std::vector<RankPlan>& plans) {
  for (RankPlan& p : plans)
    for (std::size_t ch = 0; ch < p.units.size(); ++ch) set_stream(p, ch, true);
}

// The compute a chunk's prefetched weight copies hide under: its fraction of the rank's units.
double compute_share(const RankPlan& plan, std::size_t ch, double compute_s) {
  double units = 0;
  for (const auto& chunk : plan.units) units += static_cast<double>(chunk.size());
  return units > 0 ? compute_s * static_cast<double>(plan.units[ch].size()) / units : 0;
}

// A pp rank's streamed chunks, priced by param_stream_seconds.
double param_stream_seconds_of_rank(const PlannerInput& in, const RankPlan& plan, int pp_rank, double compute_s) {
  if (static_cast<std::size_t>(pp_rank) >= in.chunk_states.size()) return 0;
  const auto& chunks = in.chunk_states[static_cast<std::size_t>(pp_rank)];
  double s = 0;
  for (std::size_t ch = 0; ch < chunks.size() && ch < plan.units.size(); ++ch)
    if (plan.streams_params(static_cast<int>(ch)))
      s += param_stream_seconds(in, chunks[ch], compute_share(plan, ch, compute_s), plan.late_params);
  return s;
}

// ---- Streaming one chunk: a move of the greedy search (param_offload: auto) ----
// The device bytes it frees: the chunk's weights and gradients, and its optimizer state when that
// is still on the device (the move takes it to the host; a host master left with it already).
std::size_t stream_move_bytes(const ModelStateBytes& chunk, OptimizerPlacement optimizer) {
  if (optimizer == OptimizerPlacement::Device) return chunk.weights + chunk.gradients + chunk.optimizer;
  return chunk.weights - chunk.host_masters + chunk.gradients;
}

// The seconds per step it adds: the chunk's streaming price, and its optimizer on the host updated
// in place (already on the host: less the parameter and gradient copies that update no longer makes).
double stream_move_seconds(const PlannerInput& in, const RankPlan& plan, std::size_t ch, const ModelStateBytes& chunk,
                           double compute_s) {
  double s = param_stream_seconds(in, chunk, compute_share(plan, ch, compute_s), plan.late_params) +
             optimizer_offload_seconds(in, chunk, /*streamed=*/true);
  if (plan.optimizer_placement(static_cast<int>(ch)) == OptimizerPlacement::Host)
    s -= optimizer_offload_seconds(in, chunk);
  return s;
}

// The evaluator's predictions with the planner's price of each rank's host optimizer chunks.
std::vector<RankPrediction> evaluate(const PlannerInput& in, std::vector<RankPlan>& plans) {
  std::vector<RankPrediction> pred = in.evaluate(plans);
  for (std::size_t g = 0; g < pred.size(); ++g) {
    const auto r = g / static_cast<std::size_t>(in.tp);
    double after = 0, early = 0;  // the updates after the backward; the dearest early one
    for (std::size_t ch = 0; r < in.chunk_states.size() && ch < in.chunk_states[r].size(); ++ch) {
      if (plans[r].optimizer_placement(static_cast<int>(ch)) != OptimizerPlacement::Host) continue;
      const double c =
          optimizer_offload_seconds(in, in.chunk_states[r][ch], plans[r].streams_params(static_cast<int>(ch)));
      if (in.optimizer_overlap && !in.chunk_states[r][ch].tied) early = std::max(early, c);
      else after += c;
    }
    pred[g].optimizer_offload_s = after + early;
    // The copies the evaluator counted where it did (a dry run), else the model's estimate.
    const RankPrediction& p = pred[g];
    const bool counted = p.stream_weights_up_bytes + p.stream_grads_down_bytes > 0;
    pred[g].param_stream_s = counted ? streaming_exposed_seconds(p, in.link_bytes_per_s, plans[r].late_params)
                                     : param_stream_seconds_of_rank(in, plans[r], static_cast<int>(r), p.compute_s);
  }
  return pred;
}

// The cheapest move left for one pp rank, given its current decisions and prediction; `deficit`:
// the bytes its peak is over the budget.
Move cheapest_move(const PlannerInput& in, std::vector<RankPlan>& plans, const RankPrediction& pred, int pp_rank,
                   std::size_t deficit, StateMoves state_moves) {
  Move best;
  double best_key = std::numeric_limits<double>::infinity();
  if (state_moves.stream && static_cast<std::size_t>(pp_rank) < in.chunk_states.size()) {
    const RankPlan& plan = plans[static_cast<std::size_t>(pp_rank)];
    const auto& chunks = in.chunk_states[static_cast<std::size_t>(pp_rank)];
    for (std::size_t ch = 0; ch < chunks.size() && ch < plan.units.size(); ++ch) {
      if (plan.streams_params(static_cast<int>(ch))) continue;
      const std::size_t freed = stream_move_bytes(chunks[ch], plan.optimizer_placement(static_cast<int>(ch)));
      if (freed == 0) continue;
      // As for the optimizer moves below: only the bytes of the deficit count.
      const double cost = stream_move_seconds(in, plan, ch, chunks[ch], pred.compute_s);
      const double key = cost / static_cast<double>(std::min(freed, std::max<std::size_t>(deficit, 1)));
      if (key < best_key) {
        best_key = key;
        best = Move{};
        best.stream_chunk = static_cast<int>(ch);
        best.cost_per_byte = cost / static_cast<double>(freed);
      }
    }
  }
  if (state_moves.optimizer && static_cast<std::size_t>(pp_rank) < in.chunk_states.size()) {
    const auto& chunks = in.chunk_states[static_cast<std::size_t>(pp_rank)];
    for (std::size_t ch = 0; ch < chunks.size(); ++ch) {
      if (chunks[ch].optimizer == 0 || plans[static_cast<std::size_t>(pp_rank)].optimizer_placement(
                                           static_cast<int>(ch)) == OptimizerPlacement::Host)
        continue;
      // Only the bytes of the deficit count: of two chunks that both cover it, the smaller wins.
      const double cost = optimizer_offload_seconds(in, chunks[ch]);
      const std::size_t freed = chunks[ch].optimizer + chunks[ch].host_masters;
      const double key = cost / static_cast<double>(std::min(freed, std::max<std::size_t>(deficit, 1)));
      if (key < best_key) {
        best_key = key;
        best = Move{};
        best.optimizer_chunk = static_cast<int>(ch);
        best.cost_per_byte = cost / static_cast<double>(freed);
      }
    }
  }
  const double m = in.microbatches;
  const double copy_s = static_cast<double>(pred.offload_bytes_per_step) / in.link_bytes_per_s;
  for (const PlanCandidate& c : in.candidates) {
    if (c.pp_rank != pp_rank) continue;
    UnitPlan& u = at(plans, c);
    auto consider = [&](Move mv, double cost, std::size_t bytes) {
      if (bytes == 0) return;
      // Ties (e.g. offloads that all hide under compute) go to the longest-lived sets first:
      // lower chunks, then earlier units, whose backward comes last.
      double key = cost / static_cast<double>(bytes) + 1e-15 * (c.chunk * 1000 + c.unit);
      if (key < best_key) {
        best_key = key;
        mv.cost_per_byte = cost / static_cast<double>(bytes);
        best = mv;
      }
    };
    if (in.offload == OffloadPolicy::Auto && !u.offload && c.offload_bytes) {
      double more = copy_s + m * static_cast<double>(c.offload_bytes) / in.link_bytes_per_s;
      double exposed_now = std::max(0.0, copy_s - pred.compute_s);
      double exposed_next = std::max(0.0, more - pred.compute_s);
      consider(Move{&c, true, u.recompute, 0}, exposed_next - exposed_now, c.offload_bytes);
    }
    if (in.recompute != RecomputePolicy::None) {
      if (in.recompute == RecomputePolicy::Auto || in.recompute == RecomputePolicy::Full) {
        if (u.recompute == Recompute::None && c.selective_saving)
          consider(Move{&c, u.offload, Recompute::Selective, 0}, m * c.forward_s * c.selective_cost,
                   c.selective_saving);
        if (u.recompute != Recompute::Full && c.full_saving) {
          double have = u.recompute == Recompute::Selective ? c.selective_cost : 0;
          std::size_t saved = u.recompute == Recompute::Selective ? c.selective_saving : 0;
          if (c.full_saving > saved)
            consider(Move{&c, u.offload, Recompute::Full, 0}, m * c.forward_s * (c.full_cost - have),
                     c.full_saving - saved);
        }
      }
    }
  }
  return best;
}

std::string summarize(const PlannerInput& in, const std::vector<RankPlan>& plans) {
  std::string out;
  for (const PlanCandidate& c : in.candidates) {
    const UnitPlan& u = plans[static_cast<std::size_t>(c.pp_rank)]
                            .units[static_cast<std::size_t>(c.chunk)][static_cast<std::size_t>(c.unit)];
    if (!u.offload && u.recompute == Recompute::None) continue;
    out += str("rank ", c.pp_rank, " chunk ", c.chunk, " ", c.name, ": ", u.offload ? "offload" : "keep",
               u.recompute != Recompute::None ? str(" + recompute ", to_string(u.recompute)) : std::string(), "\n");
  }
  for (std::size_t r = 0; r < plans.size(); ++r)
    if (plans[r].late_reloads)
      out += str("rank ", r, ": late reloads (each unit's records come back at the B that reads them)\n");
  for (std::size_t r = 0; r < plans.size(); ++r)
    if (plans[r].late_params)
      out += str("rank ", r, ": late parameters (each streamed unit's weights come at the pass that reads them)\n");
  return out.empty() ? "keep every activation\n" : out;
}

// Every unit kept except where a policy forces a lever; every optimizer on the host under `all`.
std::vector<RankPlan> forced_plans(const PlannerInput& in) {
  std::vector<RankPlan> plans = empty_plans(in);
  if (in.optimizer_offload == OffloadPolicy::All) place_every_optimizer(plans, OptimizerPlacement::Host);
  if (in.param_offload == OffloadPolicy::All) stream_every_chunk(plans);
  for (const PlanCandidate& c : in.candidates) {
    UnitPlan& u = at(plans, c);
    if (in.offload == OffloadPolicy::All) u.offload = c.offload_bytes > 0;
    if (in.recompute == RecomputePolicy::Selective || in.recompute == RecomputePolicy::Full)
      u.recompute = strongest(in.recompute, c);
  }
  return plans;
}

bool fits(const PlannerInput& in, const std::vector<RankPrediction>& pred) {
  for (int r = 0; r < in.pp; ++r)
    if (peak_of_pp_rank(in, pred, r) > in.device_budget) return false;
  return true;
}

bool any_on_host(const std::vector<RankPlan>& plans) {
  for (const RankPlan& p : plans)
    for (std::size_t ch = 0; ch < p.units.size(); ++ch)
      if (p.optimizer_placement(static_cast<int>(ch)) == OptimizerPlacement::Host) return true;
  return false;
}

double total_cost(const std::vector<RankPrediction>& pred) {
  double s = 0;
  for (const RankPrediction& p : pred) s += p.step_cost_s();
  return s;
}

// Greedy rounds from `plans` (pred: its predictions): each rank over budget takes its cheapest move
// (optimizer chunks and streamed chunks among them as `state_moves` allows), until every rank fits
// (true) or an over-budget round has no move left (false).
bool add_moves(const PlannerInput& in, std::vector<RankPlan>& plans, std::vector<RankPrediction>& pred,
               StateMoves state_moves) {
  for (;;) {
    bool over = false, moved = false;
    for (int r = 0; r < in.pp; ++r) {
      const std::size_t peak = peak_of_pp_rank(in, pred, r);
      if (peak <= in.device_budget) continue;
      over = true;
      Move mv =
          cheapest_move(in, plans, pred[static_cast<std::size_t>(r * in.tp)], r, peak - in.device_budget, state_moves);
      if (!mv.any()) continue;
      if (mv.stream_chunk >= 0) {
        set_stream(plans[static_cast<std::size_t>(r)], static_cast<std::size_t>(mv.stream_chunk), true);
      } else if (mv.optimizer_chunk >= 0) {
        plans[static_cast<std::size_t>(r)].optimizer[static_cast<std::size_t>(mv.optimizer_chunk)] =
            OptimizerPlacement::Host;
      } else {
        UnitPlan& u = at(plans, *mv.c);
        u.offload = mv.offload;
        u.recompute = mv.level;
      }
      moved = true;
    }
    if (!over) return true;
    if (!moved) return false;
    pred = evaluate(in, plans);
  }
}

// Sets `flag` on every rank still over budget whose plan `uses` the lever the flag tightens and
// that does not have it yet. False when there is no such rank.
template <class Uses>
bool set_where_over(const PlannerInput& in, std::vector<RankPlan>& plans, const std::vector<RankPrediction>& pred,
                    bool RankPlan::*flag, Uses uses) {
  bool changed = false;
  for (int r = 0; r < in.pp; ++r) {
    RankPlan& p = plans[static_cast<std::size_t>(r)];
    if (peak_of_pp_rank(in, pred, r) <= in.device_budget || p.*flag || !uses(p)) continue;
    p.*flag = true;
    changed = true;
  }
  return changed;
}

// The last lever: late reloads on every rank still over budget that offloads and does not reload
// late yet. False when there is no such rank.
bool late_reloads_where_over(const PlannerInput& in, std::vector<RankPlan>& plans,
                             const std::vector<RankPrediction>& pred) {
  return set_where_over(in, plans, pred, &RankPlan::late_reloads, [](const RankPlan& p) { return p.offloads(); });
}

// The reverse of the stream moves (param_offload: auto): once every rank fits, each streamed chunk,
// dearest first, stops streaming when every rank still fits without it (its optimizer stays on the
// host; optimizer_offload: auto may bring it back after).
void unstream_what_fits(const PlannerInput& in, std::vector<RankPlan>& plans, std::vector<RankPrediction>& pred) {
  std::vector<std::pair<double, std::pair<std::size_t, std::size_t>>> streamed;  // (cost, (rank, chunk))
  for (std::size_t r = 0; r < plans.size() && r < in.chunk_states.size(); ++r)
    for (std::size_t ch = 0; ch < in.chunk_states[r].size(); ++ch)
      if (plans[r].streams_params(static_cast<int>(ch)))
        streamed.push_back(
            {param_stream_seconds(in, in.chunk_states[r][ch], compute_share(plans[r], ch, pred[r * in.tp].compute_s),
                                  plans[r].late_params),
             {r, ch}});
  std::stable_sort(streamed.begin(), streamed.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [cost, where] : streamed) {
    std::vector<RankPlan> trial = plans;
    set_stream(trial[where.first], where.second, false);
    std::vector<RankPrediction> trial_pred = evaluate(in, trial);
    if (!fits(in, trial_pred)) continue;
    plans = std::move(trial);
    pred = std::move(trial_pred);
  }
}

// The last lever of all: late parameters on every rank still over budget that streams and does
// not take them yet. False when there is no such rank.
bool late_params_where_over(const PlannerInput& in, std::vector<RankPlan>& plans,
                            const std::vector<RankPrediction>& pred) {
  return set_where_over(in, plans, pred, &RankPlan::late_params, [](const RankPlan& p) { return p.streams_any(); });
}

}  // namespace

double param_stream_seconds(const PlannerInput& in, const ModelStateBytes& chunk, double compute_share_s, bool late) {
  const double m = in.microbatches;
  // Each slice down once per microbatch, and up once per microbatch but the step's first.
  const double grads_s = (2 * m - 1) * static_cast<double>(chunk.gradients) / in.link_bytes_per_s;
  // Up for F and B only: W reads no weight.
  const double weights_s = 2 * m * static_cast<double>(chunk.weights) / in.link_bytes_per_s;
  return grads_s + (late ? weights_s : std::max(0.0, weights_s - compute_share_s));
}

double optimizer_offload_seconds(const PlannerInput& in, const ModelStateBytes& chunk, bool streamed) {
  const double param_bytes = static_cast<double>(chunk.optimizer) / 2;  // m and v: two f32 per parameter
  // A host master: its gradient down and its bf16 copy up (6 B instead of 12 B over the link), and
  // the CPU rounds it to bf16 (6 B more streamed).
  const double masters = 1.5 * static_cast<double>(chunk.host_masters);
  const double link = streamed ? 0 : (3 * param_bytes - masters) / in.link_bytes_per_s;
  return link + (7 * param_bytes + masters) / in.cpu_adamw_bytes_per_s;
}

double streaming_exposed_seconds(const RankPrediction& p, double link_bytes_per_s, bool late) {
  STP_ASSERT(link_bytes_per_s > 0, "streaming_exposed_seconds: link rate must be positive");
  const double grads = static_cast<double>(p.stream_grads_up_bytes + p.stream_grads_down_bytes) / link_bytes_per_s;
  const double weights = static_cast<double>(p.stream_weights_up_bytes) / link_bytes_per_s;
  return grads + (late ? weights : std::max(0.0, weights - p.compute_s));
}

std::string describe_infeasible(const MemoryPlan& plan, ByteStyle style) {
  const std::string minimum = format_bytes(plan.min_device_budget, style, Rounding::Up);
  std::size_t worst = 0;
  for (std::size_t g = 0; g < plan.predicted.size(); ++g)
    if (plan.predicted[g].peak_device_bytes > plan.predicted[worst].peak_device_bytes) worst = g;
  if (plan.predicted.empty()) return str("the minimum feasible budget is ", minimum);
  const RankPrediction& p = plan.predicted[worst];
  auto cat = [&](MemoryCategory c) { return format_bytes(p.peak_by_category[static_cast<std::size_t>(c)], style); };
  return str("with every enabled lever device ", worst, " still needs ", format_bytes(p.peak_device_bytes, style),
             " at its peak: weights ", cat(MemoryCategory::Weights), ", gradients ", cat(MemoryCategory::Gradients),
             ", optimizer state ", cat(MemoryCategory::OptimizerState), ", activations ",
             cat(MemoryCategory::Activations),
             " that no enabled lever moves (unit inputs, the sets in flight or reloaded, the head and embedding), "
             "buffers and workspace ",
             cat(MemoryCategory::Buffers), ". The minimum feasible budget is ", minimum);
}

MemoryPlan plan_memory(const PlannerInput& in) {
  STP_ASSERT(in.evaluate && static_cast<int>(in.units.size()) == in.pp && in.link_bytes_per_s > 0, "bad planner input");
  MemoryPlan out;
  out.device_budget = in.device_budget;

  // The most the enabled levers can do: the minimum feasible budget.
  std::vector<RankPlan> most = empty_plans(in);
  if (in.optimizer_offload != OffloadPolicy::None) place_every_optimizer(most, OptimizerPlacement::Host);
  if (in.param_offload != OffloadPolicy::None) stream_every_chunk(most);
  for (const PlanCandidate& c : in.candidates) {
    UnitPlan& u = at(most, c);
    u.recompute = strongest(in.recompute, c);
    u.offload = in.offload != OffloadPolicy::None && c.offload_bytes > 0;
  }
  for (RankPlan& p : most) {
    p.late_reloads = p.offloads();
    p.late_params = p.streams_any();
  }
  std::vector<RankPrediction> most_pred = evaluate(in, most);
  std::size_t live_min = 0;  // the strongest plan's live bytes: below them no plan fits
  for (const RankPrediction& p : most_pred) live_min = std::max(live_min, p.peak_device_bytes);
  out.min_device_budget = in.placeable_budget ? in.placeable_budget(most, live_min) : live_min;
  // Feasibility is judged on live bytes: a weaker plan may place in a budget the strongest plan's
  // placement (fragmentation) does not fit; the caller's placement check decides.
  if (live_min > in.device_budget) {
    out.feasible = false;
    out.ranks = std::move(most);
    out.predicted = std::move(most_pred);
    out.summary = summarize(in, out.ranks);
    out.optimizer_offload = in.optimizer_offload != OffloadPolicy::None;
    return out;
  }

  // Forced levers, then greedy moves (activation levers and, under auto, optimizer chunks) for
  // ranks over budget.
  std::vector<RankPlan> plans = forced_plans(in);
  std::vector<RankPrediction> pred = evaluate(in, plans);
  const StateMoves state_moves{in.optimizer_offload == OffloadPolicy::Auto, in.param_offload == OffloadPolicy::Auto};
  bool fit = add_moves(in, plans, pred, state_moves);
  if (!fit && late_reloads_where_over(in, plans, pred)) {
    pred = evaluate(in, plans);
    fit = add_moves(in, plans, pred, state_moves);
  }
  if (!fit && late_params_where_over(in, plans, pred)) {
    pred = evaluate(in, plans);
    fit = add_moves(in, plans, pred, state_moves);
  }
  if (!fit) {
    plans = most;  // every lever used and still over: the levers' most is the answer
    pred = most_pred;
  } else if (in.param_offload == OffloadPolicy::Auto) {
    unstream_what_fits(in, plans, pred);
  }
  if (fit && in.optimizer_offload == OffloadPolicy::Auto && any_on_host(plans)) {
    // The reverse: a host chunk that later moves made unnecessary goes back to the device
    // (dearest first) when every rank still fits ...
    std::vector<std::pair<double, std::pair<int, int>>> host;  // (cost, (rank, chunk))
    for (int r = 0; r < in.pp && static_cast<std::size_t>(r) < in.chunk_states.size(); ++r)
      for (std::size_t ch = 0; ch < in.chunk_states[static_cast<std::size_t>(r)].size(); ++ch)
        if (plans[static_cast<std::size_t>(r)].optimizer_placement(static_cast<int>(ch)) == OptimizerPlacement::Host &&
            !plans[static_cast<std::size_t>(r)].streams_params(static_cast<int>(ch)))  // a streamed chunk's stays
          host.push_back({optimizer_offload_seconds(in, in.chunk_states[static_cast<std::size_t>(r)][ch]),
                          {r, static_cast<int>(ch)}});
    std::stable_sort(host.begin(), host.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (const auto& [cost, where] : host) {
      std::vector<RankPlan> trial = plans;
      trial[static_cast<std::size_t>(where.first)].optimizer[static_cast<std::size_t>(where.second)] =
          OptimizerPlacement::Device;
      std::vector<RankPrediction> trial_pred = evaluate(in, trial);
      if (!fits(in, trial_pred)) continue;
      plans = std::move(trial);
      pred = std::move(trial_pred);
    }
    // ... and the activation levers are chosen again for the final placement: those taken before
    // a chunk's state left the device may no longer be needed. The cheaper of the two wins.
    std::vector<RankPlan> again = forced_plans(in);
    for (std::size_t r = 0; r < again.size(); ++r) {
      again[r].optimizer = plans[r].optimizer;
      again[r].late_reloads = plans[r].late_reloads;
      again[r].param_stream = plans[r].param_stream;
      again[r].late_params = plans[r].late_params;
    }
    std::vector<RankPrediction> again_pred = evaluate(in, again);
    if (add_moves(in, again, again_pred, StateMoves{}) && total_cost(again_pred) <= total_cost(pred)) {
      plans = std::move(again);
      pred = std::move(again_pred);
    }
  }
  out.optimizer_offload = any_on_host(plans);
  out.ranks = std::move(plans);
  out.predicted = std::move(pred);
  out.summary = summarize(in, out.ranks);
  return out;
}

}  // namespace stp
