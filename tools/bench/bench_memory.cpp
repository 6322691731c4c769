// Memory-budget benchmark on the CPU backend. Two parts, numbers and ratios from one run:
//
//  1. Capacity. At a fixed width and a fixed memory.device_budget, the largest GPT-2 depth
//     (n_layer, in steps of one layer per pipeline stage) whose memory plan fits the budget, and
//     its parameter count, for each lever set:
//       - no levers (memory.offload: none, memory.recompute: none);
//       - the activation levers (auto, auto);
//       - the activation levers and memory.optimizer_offload: auto ("optimizer too");
//       - all levers (also memory.param_offload: auto, parameter streaming, and memory.unit_tiles:
//         auto, the tiled unit backward; "n/a" where the build lacks a row's key).
//     Plans are exact dry runs (docs/memory.md), so the search is by planning. The planner's search
//     of a deep model is a dry run per greedy round, so each row searches cheaply first: it starts
//     from the previous row's depth (each row's levers include the row before's) and bounds the
//     depth with the strongest plan of its levers (every auto lever forced on: a few dry runs), from
//     above where its live bytes exceed the budget (no plan of the row fits) and from below where it
//     places in the budget (the planner's plan then fits); the planner bisects only between the two.
//     Every probe prints its depth, its verdict and its seconds. The largest depth of each set is then
//     trained for one real step with the plan its probe made (the strongest plan's where that places
//     and the planner was not probed), whose measured peak must equal the prediction and be within
//     the budget. Ratios are in parameters against no levers; target: all
//     levers >= 30x. Last, what bounds the all-levers depth: the strongest plan's live peak at half
//     the depth and at the depth, what a layer adds to it by category, and its placeable minimum.
//  2. Cost. The unconstrained peak P of the config (no offload, no recompute), then step time with
//     the planner at a budget of 60% of P divided by the unconstrained step time, with the D2H/H2D
//     copies rate-limited to memory.link_bandwidth (--link). Runs alternate (plain, planned, plain,
//     ...) so machine noise hits both alike; the ratio is the median of per-pair ratios. Target:
//     <= 1.10x when the plan predicts its copies fit under compute (predicted exposed copy time 0).
//
//     Both runs of a pair reserve --copy-cpus CPUs (default 1) for the D2H/H2D streams
//     (memory.copy_engine_cpus): on the CPU backend a copy is a memcpy that would otherwise take
//     CPU from compute, which a GPU's DMA engines do not; 0 measures the shared case.
//  3. Optimizer cost. Step time at a budget where the optimizer state must leave the device —
//     the unconstrained peak less half of the largest device's optimizer bytes (at least the exact
//     minimum with every optimizer on the host, and below the one with them on the device), with the activation
//     levers off so that nothing else can make the room; memory.optimizer_offload: auto picks the
//     chunks — divided by the unconstrained step time, alternating runs as in part 2 (same copy-
//     engine CPUs; the optimizer's D2H/H2D streams run on them, the CPU AdamW on the host thread).
//     Median and spread (min..max) of the per-pair ratios. Target: <= 1.15x.
//     Then the optimizer overlap (memory.optimizer_overlap, docs/memory.md): every chunk's
//     optimizer on the host (memory.optimizer_offload: all, activation levers off), runs alternating
//     overlap none and all; median step time of each, the median and spread of the per-pair ratios,
//     and how many speculations committed and were discarded (a clip coefficient below 1 discards:
//     --set train.grad_clip=... moves it).
//  4. Streaming cost. The budgets where the plan needs parameter streaming (memory.param_offload):
//     with the activation levers off and every optimizer on the host, the exact minimum feasible
//     budget without streaming (param_offload none) and with it (all); below the first only
//     streaming fits. The budget is halfway between them. Runs alternate unconstrained (levers off,
//     no budget) and streaming (param_offload auto at that budget, optimizer_offload all), same
//     --link and --copy-cpus; median step time of each run, the ratio per pair, the median and
//     spread of the ratios, next to the plan's predicted step cost (compute plus exposed copies,
//     the streaming traffic among them, and the CPU optimizer), and the median ratio of the
//     process's CPU time per step (the work, which other jobs on a shared machine do not move as
//     they move the wall time; the link's waits are not in it). Each streaming run's measured
//     device peaks must equal the plan's, and its streamed bytes per step the plan's. The config's
//     depth is --stream-layers (default 16: the tiny config's 4 layers leave the streaming minimum
//     close to the resident one, since the streamer's working set is most of a rank's units).
//
// Usage: build/bench_memory [--config PATH] [--budget BYTES] [--link BYTES_PER_S] [--steps N]
//                           [--pairs N] [--max-layers N] [--copy-cpus N] [--stream-layers N]
//                           [--set KEY=VALUE]...
//                           [--capacity-only | --cost-only | --optimizer-only | --overlap-only |
//                            --stream-only]
// Sizes and rates take the config's units (e.g. 48MiB, 4GB/s); --help lists the defaults.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <sys/resource.h>

#include "config/config.h"
#include "memory/block_arena.h"
#include "base/error.h"
#include "tools/cli/cli.h"
#include "models/registry.h"
#include "schedule/schedule.h"
#include "train/memory_planning.h"
#include "train/stage_layout.h"
#include "train/trainer.h"

namespace {

struct Options {
  std::string config = "configs/tiny.yaml";
  std::string budget = "40MiB";
  std::string link = "4GB/s";
  int copy_cpus = 1;  // memory.copy_engine_cpus for the cost runs (both of each pair)
  int steps = 3;      // measured steps per run (after one warm-up step)
  int pairs = 3;      // plain/planned run pairs
  int max_layers = 256;
  int stream_layers = 16;  // model.n_layer of the streaming cost part (0: the config's)
  std::vector<std::string> overrides;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double mib(std::size_t b) { return static_cast<double>(b) / (1 << 20); }

std::size_t max_peak(const stp::MemoryPlan& plan) {
  std::size_t p = 0;
  for (const auto& r : plan.predicted) p = std::max(p, r.peak_device_bytes);
  return p;
}

stp::Config config_with(const Options& o, std::vector<std::string> extra) {
  std::vector<std::string> all = o.overrides;
  all.insert(all.end(), {"output.trace=false", "output.dir=runs/bench-memory", "memory.link_bandwidth=" + o.link});
  all.insert(all.end(), extra.begin(), extra.end());
  return stp::load_config(o.config, all);
}

bool fits(const stp::Config& c, stp::MemoryPlan* out = nullptr) {
  stp::MemoryPlan plan = stp::make_memory_plan(c);
  if (out) *out = plan;
  try {
    stp::check_plan(plan, c);
    return true;
  } catch (const stp::Error&) {
    return false;
  }
}

// The strongest form of a lever set: each `auto` lever forced on (offload, optimizer_offload and
// param_offload: all; recompute: full). Its plan is the planner's most (memory/planner.h: the
// feasibility test of every search under these levers), so where it does not fit neither does the
// set; it costs a few dry runs, where the planner's search of a deep model costs one per greedy
// round. Empty when the set has no auto lever: then nothing is cheaper than the set itself.
std::vector<std::string> strongest_levers(const std::vector<std::string>& levers) {
  static const std::set<std::string> kForceable = {"memory.offload", "memory.recompute", "memory.optimizer_offload",
                                                   "memory.param_offload"};
  std::vector<std::string> out;
  bool forced = false;
  for (const std::string& l : levers) {
    const std::string key = l.substr(0, l.find('='));
    if (kForceable.count(key) && l.substr(key.size()) == "=auto") {
      out.push_back(key + (key == "memory.recompute" ? "=full" : "=all"));
      forced = true;
    } else {
      out.push_back(l);
    }
  }
  return forced ? out : std::vector<std::string>{};
}

struct Probe {
  bool fits = false;
  bool places = false;  // the strongest plan's placeable minimum is within the budget
  stp::MemoryPlan plan;
};

// One probe of the capacity search, printed when it ends (the search of a deep model takes minutes,
// and the lines show it progressing). The planner's probe fits as `stp train` requires (check_plan:
// the device and the host budget). The strongest plan's is an upper bound: it "fits" when its live
// bytes do, the planner's own feasibility test (a weaker plan may place in a budget where the
// strongest one's placement does not), on the device budget alone (it pins the most host memory).
Probe probe(const Options& o, const std::vector<std::string>& levers, int layers, bool strongest) {
  std::vector<std::string> x = levers;
  x.push_back("model.n_layer=" + std::to_string(layers));
  const auto t0 = std::chrono::steady_clock::now();
  Probe p;
  const stp::Config c = config_with(o, x);
  if (strongest) {
    p.plan = stp::make_memory_plan(c, /*exact_minimum=*/true);
    const std::size_t budget = static_cast<std::size_t>(*c.memory.device_budget);
    p.fits = p.plan.feasible || max_peak(p.plan) <= budget;
    p.places = p.plan.min_device_budget <= budget;
  } else {
    p.fits = fits(c, &p.plan);
  }
  const char* verdict = strongest ? (p.fits ? (p.places ? "places," : "live fits,") : "live over,")
                                  : (p.fits ? "fits," : "does not fit,");
  std::printf("  probe %-9s n_layer %4d: %-13s peak %6.2f MiB, minimum budget %6.2f MiB (%.1f s)\n",
              strongest ? "strongest" : "planner", layers, verdict, mib(max_peak(p.plan)),
              mib(p.plan.min_device_budget),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::fflush(stdout);
  return p;
}

struct Depth {
  int layers = 0;  // 0: not even one step of layers fits
  // The planner's plan at `layers`, or the strongest plan's where it places in the budget and the
  // planner was not probed there (its search of a deep model takes tens of minutes).
  stp::MemoryPlan plan;
};

// Largest n_layer (a multiple of `step`, at most --max-layers) whose plan under `levers` fits.
// `known`: a depth known to fit (the previous row's: each row's levers include the row before's, so
// it fits at least as deep), or 0. The strongest plan bounds the depth from both sides at a few dry
// runs a probe: above, where its live bytes exceed the budget no plan fits (doubling from `known`,
// then bisection); below, where it places in the budget the planner's plan fits (every budget at or
// above the strongest plan's placeable minimum ends feasible: train/memory_planning.cpp, pass 3).
// Only between the two does the planner search, by bisection. Without a strongest form (no auto
// lever) the planner's own probes are the bounds.
Depth largest_depth(const Options& o, const std::vector<std::string>& levers, int step, int known) {
  const int cap = std::max(step, o.max_layers / step * step);
  const std::vector<std::string> strongest = strongest_levers(levers);
  std::map<int, Probe> planner, strong;  // probes by depth
  auto plan = [&](int layers) -> const Probe& {
    auto it = planner.find(layers);
    if (it == planner.end()) it = planner.emplace(layers, probe(o, levers, layers, false)).first;
    return it->second;
  };
  auto bound = [&](int layers) -> const Probe& {
    if (strongest.empty()) return plan(layers);
    auto it = strong.find(layers);
    if (it == strong.end()) it = strong.emplace(layers, probe(o, strongest, layers, true)).first;
    return it->second;
  };
  // The largest depth in (lo, hi) where `ok` holds, lo holding (or 0) and hi not: bisection.
  auto bisect = [&](int lo, int hi, auto ok) {
    while (hi - lo > step) {
      const int mid = (lo + hi) / 2 / step * step;
      (ok(mid) ? lo : hi) = mid;
    }
    return lo;
  };
  int top = known;
  if (top == 0) {
    if (!bound(step).fits) return {};
    top = step;
  }
  int over = cap + step;  // the smallest depth over the upper bound (cap + step: beyond the search)
  for (int d = 2 * top; d <= cap; d *= 2) {
    if (!bound(d).fits) {
      over = d;
      break;
    }
    top = d;
  }
  top = bisect(top, over, [&](int d) { return bound(d).fits; });
  int sure = known;         // the planner fits here (the lower bound) ...
  int unsure = top + step;  // ... and may not from here on
  if (strongest.empty()) sure = top;
  for (const auto& [d, p] : strong)
    if (d <= top && p.places) sure = std::max(sure, d);
  for (const auto& [d, p] : strong)
    if (d > sure && !p.places) unsure = std::min(unsure, d);
  sure = bisect(sure, unsure, [&](int d) { return bound(d).places; });
  int lo = bisect(sure, top + step, [&](int d) { return plan(d).fits; });
  if (lo > 0 && lo == sure && !planner.count(lo)) {  // no planner probe here: the strongest plan places
    const auto it = strong.find(lo);
    if (it != strong.end() && it->second.places && it->second.plan.feasible) {
      std::printf(
          "  n_layer %d: the strongest plan places in the budget (so the planner's fits too); the step "
          "trains the strongest plan\n",
          lo);
      return {lo, it->second.plan};
    }
  }
  if (lo > 0 && !plan(lo).fits) {  // a bound's depth, unprobed until now, does not fit the planner
    std::printf("  the planner does not fit n_layer %d: searching below it\n", lo);
    lo = bisect(0, lo, [&](int d) { return plan(d).fits; });
  }
  if (lo == 0) return {};
  return {lo, plan(lo).plan};
}

// Parameters of the whole model of `c` (every stage, tied tensors once), from the parameter tables.
long long model_parameters(const stp::Config& c) {
  const stp::sched::Schedule sched = stp::sched::generate(c.parallel.schedule, c.parallel.pp, c.train.microbatches);
  std::set<std::string> seen;
  long long n = 0;
  for (int r = 0; r < c.parallel.pp; ++r)
    for (int ch = 0; ch < sched.chunks; ++ch)
      for (const stp::ParamInfo& p :
           stp::model_param_table(stp::model_spec_of(c), stp::stage_spec_of(c, sched, r, ch, 0)))
        if (seen.insert(p.name).second) n += stp::numel(p.full_shape);
  return n;
}

// What bounds a row's depth: the strongest plan (planned for 1 MiB, so that its predictions are the
// strongest plan's and its minimum the placeable one) at half the depth and at the depth: its
// largest device's live peak and what each layer adds to it by category, and its placeable minimum.
void print_depth_bound(const Options& o, const std::vector<std::string>& levers, int step, int depth,
                       std::size_t budget) {
  std::vector<std::string> strongest = strongest_levers(levers);
  const int half = std::max(step, depth / 2 / step * step);
  if (strongest.empty() || half == depth) return;
  strongest.push_back("memory.device_budget=1MiB");
  auto worst = [](const stp::MemoryPlan& plan) {
    std::size_t g = 0;
    for (std::size_t i = 0; i < plan.predicted.size(); ++i)
      if (plan.predicted[i].peak_device_bytes > plan.predicted[g].peak_device_bytes) g = i;
    return plan.predicted.at(g);
  };
  const stp::MemoryPlan pa = probe(o, strongest, half, true).plan, pb = probe(o, strongest, depth, true).plan;
  const stp::RankPrediction a = worst(pa), b = worst(pb);
  const double layers = depth - half;
  auto per_layer = [&](std::size_t x, std::size_t y) {
    return (static_cast<double>(y) - static_cast<double>(x)) / layers / 1024;
  };
  std::string by_category;
  for (std::size_t k = 0; k < stp::kMemoryCategories; ++k) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s%s %+.1f", k ? ", " : "", stp::to_string(static_cast<stp::MemoryCategory>(k)),
                  per_layer(a.peak_by_category[k], b.peak_by_category[k]));
    by_category += buf;
  }
  std::printf(
      "what bounds it (the strongest plan, largest device): live peak %.2f MiB at n_layer %d, %.2f MiB at %d: %.1f "
      "KiB per layer (%s); placeable minimum %.2f MiB and %.2f MiB: %.1f KiB per layer; budget %.2f MiB\n",
      mib(a.peak_device_bytes), half, mib(b.peak_device_bytes), depth,
      per_layer(a.peak_device_bytes, b.peak_device_bytes), by_category.c_str(), mib(pa.min_device_budget),
      mib(pb.min_device_budget), per_layer(pa.min_device_budget, pb.min_device_budget), mib(budget));
}

// One row of the capacity table: a set of levers. A set that needs a config key this build does
// not have (`needs`) is reported as n/a.
struct LeverSet {
  const char* name;
  std::vector<std::string> levers;
  const char* needs = nullptr;
  int depth = 0;
  long long params = 0;
};

bool has_key(const Options& o, const std::string& assignment) {
  try {
    config_with(o, {assignment});
    return true;
  } catch (const stp::Error&) {
    return false;
  }
}

void capacity(const Options& o) {
  stp::Config base = config_with(o, {"memory.device_budget=" + o.budget});
  const std::size_t budget = static_cast<std::size_t>(*base.memory.device_budget);
  const int stages =
      base.parallel.pp *
      (base.parallel.schedule == "stp" || base.parallel.schedule == "zb-v" || base.parallel.schedule == "1f1b-i" ? 2
                                                                                                                 : 1);
  std::printf("\n== capacity: n_embd %lld, %s tp %d pp %d, m %d, micro batch %d, device budget %.1f MiB ==\n",
              static_cast<long long>(base.model.n_embd), base.parallel.schedule.c_str(), base.parallel.tp,
              base.parallel.pp, base.train.microbatches, base.train.micro_batch_size, mib(budget));
  // The optimizer-offload lever: off in the first two rows where this build has it.
  const bool optimizer_lever = has_key(o, "memory.optimizer_offload=none");
  std::vector<std::string> no_optimizer_offload;
  if (optimizer_lever) no_optimizer_offload.push_back("memory.optimizer_offload=none");
  std::vector<LeverSet> sets = {{"no levers", {"memory.offload=none", "memory.recompute=none"}},
                                {"activation levers", {"memory.offload=auto", "memory.recompute=auto"}},
                                {"optimizer too",
                                 {"memory.offload=auto", "memory.recompute=auto", "memory.optimizer_offload=auto"},
                                 "memory.optimizer_offload"},
                                {"all levers",
                                 {"memory.offload=auto", "memory.recompute=auto", "memory.optimizer_offload=auto",
                                  "memory.param_offload=auto", "memory.unit_tiles=auto"},
                                 "memory.param_offload"}};
  for (std::size_t i = 0; i < 2; ++i)
    sets[i].levers.insert(sets[i].levers.end(), no_optimizer_offload.begin(), no_optimizer_offload.end());
  int known = 0;  // the deepest a previous row fits: the rows are monotone
  for (LeverSet& m : sets) {
    if (m.needs && !has_key(o, std::string(m.needs) + "=none")) {
      std::printf("%-18s: n/a (needs %s)\n", m.name, m.needs);
      continue;
    }
    m.levers.push_back("memory.device_budget=" + o.budget);
    std::printf("%s:\n", m.name);
    std::fflush(stdout);
    auto t0 = std::chrono::steady_clock::now();
    const Depth d = largest_depth(o, m.levers, stages, known);
    m.depth = d.layers;
    double search_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (m.depth == 0) {
      std::printf("%-18s: not even %d layers fit\n", m.name, stages);
      continue;
    }
    known = m.depth;
    // Train the largest depth for one real step with the plan its probe made (the planner's, the one
    // the trainer would make: planning is deterministic; or the strongest plan where it places):
    // the measured peak must equal the prediction and stay within the budget.
    std::vector<std::string> x = m.levers;
    x.push_back("model.n_layer=" + std::to_string(m.depth));
    const stp::Config c = config_with(o, x);
    m.params = model_parameters(c);
    stp::TrainerOptions with_plan;
    with_plan.plan = &d.plan;
    stp::Trainer t(c, with_plan);
    stp::StepResult r = t.step();
    std::size_t measured = *std::max_element(r.peak_device_bytes.begin(), r.peak_device_bytes.end());
    std::size_t predicted = max_peak(t.memory_plan());
    std::printf(
        "%-18s: largest n_layer %3d = %.2fM parameters (search %.1f s); one step: peak %.2f MiB (%s predicted, "
        "%s budget), pinned host %.1f MiB, step %.0f ms\n",
        m.name, m.depth, static_cast<double>(m.params) / 1e6, search_s, mib(measured),
        measured == predicted ? "=" : "!=", measured <= budget ? "within" : "OVER", mib(r.peak_host_pinned_bytes),
        r.step_ms);
  }
  if (sets.back().depth > 0) print_depth_bound(o, sets.back().levers, stages, sets.back().depth, budget);
  if (sets[0].params == 0) return;
  for (std::size_t i = 1; i < sets.size(); ++i)
    if (sets[i].params)
      std::printf("capacity ratio, %s / no levers: %.2fx in parameters (%.2fM / %.2fM; %d / %d layers)%s\n",
                  sets[i].name, static_cast<double>(sets[i].params) / static_cast<double>(sets[0].params),
                  static_cast<double>(sets[i].params) / 1e6, static_cast<double>(sets[0].params) / 1e6, sets[i].depth,
                  sets[0].depth, i + 1 == sets.size() ? "; target >= 30x" : "");
}

struct StepTimes {
  double step_ms = 0;   // median step time
  double stall_ms = 0;  // median over steps of the largest per-device compute stall on reloads
  double copy_ms = 0;   // median over steps of the largest per-device D2H + H2D busy time
  // Every device's measured peak equals the run's plan (checked after the last step).
  bool peaks_equal = false;
  // Parameter streaming of the last step: every device's bytes each way equal the plan's per step.
  bool stream_bytes_equal = false;
  std::uint64_t stream_bytes = 0;   // of the last step, both directions, the largest device
  std::uint64_t stream_copies = 0;  // of the last step, both directions, the largest device
  // The process's CPU time (user + system) per measured step: the work, apart from waits and from
  // the share of a machine other jobs also load.
  double cpu_ms = 0;
};

double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

// Whether the last step's streamed bytes of every device equal its plan's per-step bytes.
bool stream_bytes_match(const stp::StepResult& r, const stp::MemoryPlan& plan, StepTimes& out) {
  bool equal = r.param_stream.size() == plan.predicted.size();
  for (std::size_t g = 0; equal && g < r.param_stream.size(); ++g) {
    const stp::RankPrediction& p = plan.predicted[g];
    const stp::ParamStreamCounters& s = r.param_stream[g];
    equal =
        s.h2d_bytes == p.stream_weights_up_bytes + p.stream_grads_up_bytes && s.d2h_bytes == p.stream_grads_down_bytes;
    out.stream_bytes = std::max<std::uint64_t>(out.stream_bytes, s.h2d_bytes + s.d2h_bytes);
    out.stream_copies = std::max<std::uint64_t>(out.stream_copies, s.h2d_copies + s.d2h_copies);
  }
  return equal;
}

StepTimes run_steps(const stp::Config& c, int steps, stp::StepResult::Speculation* speculation = nullptr) {
  stp::Trainer t(c);
  t.step();  // warm-up: first-touch of memory, caches
  std::vector<double> ms, stall, copy;
  StepTimes out;
  const double cpu_before = process_cpu_s();
  for (int i = 0; i < steps; ++i) {
    stp::StepResult r = t.step();
    if (i + 1 == steps) {
      const stp::MemoryPlan& plan = t.memory_plan();
      out.peaks_equal = r.peak_device_bytes.size() == plan.predicted.size();
      for (std::size_t g = 0; out.peaks_equal && g < plan.predicted.size(); ++g)
        out.peaks_equal = r.peak_device_bytes[g] == plan.predicted[g].peak_device_bytes;
      out.stream_bytes_equal = stream_bytes_match(r, plan, out);
    }
    if (speculation) {
      speculation->committed += r.speculation.committed;
      speculation->discarded += r.speculation.discarded;
      speculation->hidden_s += r.speculation.hidden_s;
    }
    ms.push_back(r.step_ms);
    double s = 0, cp = 0;
    for (const auto& o : r.offload) s = std::max(s, o.stall_s), cp = std::max(cp, o.d2h_busy_s + o.h2d_busy_s);
    stall.push_back(s * 1e3), copy.push_back(cp * 1e3);
  }
  out.step_ms = median(ms), out.stall_ms = median(stall), out.copy_ms = median(copy);
  out.cpu_ms = (process_cpu_s() - cpu_before) * 1e3 / std::max(1, steps);
  return out;
}

void cost(const Options& o) {
  stp::MemoryPlan free_plan;
  // Both runs of a pair get the same compute CPUs: with an emulated copy engine (the last
  // copy_cpus CPUs run only D2H/H2D) copies contend with compute as little as a GPU's DMA engines.
  const std::string engine = "memory.copy_engine_cpus=" + std::to_string(o.copy_cpus);
  stp::Config plain = config_with(o, {"memory.offload=none", "memory.recompute=none", engine});
  fits(plain, &free_plan);
  const std::size_t peak = max_peak(free_plan);
  const std::size_t budget = peak * 6 / 10;
  stp::Config planned = config_with(
      o, {"memory.offload=auto", "memory.recompute=auto", engine, "memory.device_budget=" + std::to_string(budget)});
  std::printf(
      "\n== cost: n_layer %lld, %s tp %d pp %d, link %.2f GB/s, copy-engine CPUs %d, unconstrained peak %.2f MiB, "
      "budget 60%% = %.2f MiB ==\n",
      static_cast<long long>(plain.model.n_layer), plain.parallel.schedule.c_str(), plain.parallel.tp,
      plain.parallel.pp, planned.memory.link_bandwidth / 1e9, o.copy_cpus, mib(peak), mib(budget));
  stp::MemoryPlan plan;
  if (!fits(planned, &plan)) {
    std::printf("the planner finds no plan for 60%% (minimum feasible %.2f MiB): no cost to measure\n",
                mib(plan.min_device_budget));
    return;
  }
  double exposed = 0, recompute = 0, compute = 0;
  std::uint64_t offload = 0;
  for (const auto& p : plan.predicted) {
    exposed = std::max(exposed, p.exposed_copy_s);
    recompute = std::max(recompute, p.recompute_s);
    compute = std::max(compute, p.compute_s);
    offload = std::max(offload, p.offload_bytes_per_step);
  }
  std::printf(
      "plan: predicted peak %.2f MiB; per device at most %.1f MiB offloaded/step, predicted exposed copy %.1f ms, "
      "recompute %.1f ms over %.1f ms compute -> copies %s\n%s",
      mib(max_peak(plan)), mib(offload), exposed * 1e3, recompute * 1e3, compute * 1e3,
      exposed == 0 ? "fit under compute" : "do NOT fit under compute", plan.summary.c_str());
  std::vector<double> ratios, plain_ms, planned_ms;
  for (int i = 0; i < o.pairs; ++i) {
    StepTimes a = run_steps(plain, o.steps), b = run_steps(planned, o.steps);
    plain_ms.push_back(a.step_ms), planned_ms.push_back(b.step_ms), ratios.push_back(b.step_ms / a.step_ms);
    std::printf(
        "pair %d: unconstrained %.1f ms/step, planned %.1f ms/step (copy streams busy %.1f ms, compute "
        "stalled on reloads %.2f ms), ratio %.3f\n",
        i + 1, a.step_ms, b.step_ms, b.copy_ms, b.stall_ms, b.step_ms / a.step_ms);
  }
  std::printf("cost ratio: %.3fx (median of %d pairs; unconstrained %.1f ms, planned %.1f ms; target <= 1.10x %s)\n",
              median(ratios), o.pairs, median(plain_ms), median(planned_ms),
              exposed == 0 ? "applies: copies predicted to fit" : "does not apply: copies predicted exposed");
}

// Part 3 (see the header): the optimizer leaves the device, activation levers off.
void optimizer_cost(const Options& o) {
  const std::string engine = "memory.copy_engine_cpus=" + std::to_string(o.copy_cpus);
  const std::vector<std::string> levers_off = {"memory.offload=none", "memory.recompute=none", engine};
  std::vector<std::string> x = levers_off;
  x.push_back("memory.optimizer_offload=none");
  const stp::Config plain = config_with(o, x);
  stp::MemoryPlan free_plan;
  fits(plain, &free_plan);
  const std::size_t peak = max_peak(free_plan);
  std::size_t optimizer = 0;
  for (const auto& p : free_plan.predicted)
    if (p.peak_device_bytes == peak) optimizer = std::max(optimizer, p.optimizer_device_bytes);
  // The exact minimum with every chunk's optimizer on the host and on the device (the allocator
  // needs a little more than the live peak): a budget between them forces state off the device.
  auto minimum = [&](const char* placement) {
    std::vector<std::string> y = levers_off;
    y.insert(y.end(), {std::string("memory.optimizer_offload=") + placement, "memory.device_budget=1MiB"});
    return stp::make_memory_plan(config_with(o, y), /*exact_minimum=*/true).min_device_budget;
  };
  const std::size_t on_host = minimum("all"), on_device = minimum("none");
  const std::size_t budget = std::max(peak - optimizer / 2, on_host);
  if (budget >= on_device) {
    std::printf(
        "\n== optimizer cost: every budget that fits the optimizer on the host (%.2f MiB) fits it on the "
        "device (%.2f MiB): no cost to measure ==\n",
        mib(on_host), mib(on_device));
    return;
  }
  x = levers_off;
  x.insert(x.end(), {"memory.optimizer_offload=auto", "memory.device_budget=" + std::to_string(budget)});
  const stp::Config offloaded = config_with(o, x);
  std::printf(
      "\n== optimizer cost: n_layer %lld, %s tp %d pp %d, copy-engine CPUs %d, unconstrained peak %.2f MiB, "
      "optimizer state %.2f MiB on the largest device, budget %.2f MiB ==\n",
      static_cast<long long>(plain.model.n_layer), plain.parallel.schedule.c_str(), plain.parallel.tp,
      plain.parallel.pp, o.copy_cpus, mib(peak), mib(optimizer), mib(budget));
  stp::MemoryPlan plan;
  if (!fits(offloaded, &plan)) {
    std::printf("the planner finds no plan (minimum feasible %.2f MiB): no cost to measure\n",
                mib(plan.min_device_budget));
    return;
  }
  std::size_t host = 0, chunks = 0;
  for (const auto& rp : plan.ranks)
    for (std::size_t ch = 0; ch < rp.units.size(); ++ch, ++chunks)
      host += rp.optimizer_placement(static_cast<int>(ch)) == stp::OptimizerPlacement::Host;
  double predicted = 0, compute = 0;
  for (const auto& p : plan.predicted)
    predicted = std::max(predicted, p.optimizer_offload_s), compute = std::max(compute, p.compute_s);
  std::printf(
      "plan: peak %.2f MiB; optimizer of %zu of %zu chunks on the host; predicted optimizer offload %.1f ms "
      "(copies + CPU AdamW, counted exposed) over %.1f ms compute\n",
      mib(max_peak(plan)), host, chunks, predicted * 1e3, compute * 1e3);
  std::vector<double> ratios, plain_ms, offloaded_ms;
  for (int i = 0; i < o.pairs; ++i) {
    StepTimes a = run_steps(plain, o.steps), b = run_steps(offloaded, o.steps);
    plain_ms.push_back(a.step_ms), offloaded_ms.push_back(b.step_ms), ratios.push_back(b.step_ms / a.step_ms);
    std::printf("pair %d: unconstrained %.1f ms/step, optimizer offloaded %.1f ms/step, ratio %.3f\n", i + 1, a.step_ms,
                b.step_ms, b.step_ms / a.step_ms);
  }
  const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
  const double r = median(ratios);
  std::printf(
      "optimizer cost ratio: %.3fx (median of %d pairs, spread %.3f..%.3f; unconstrained %.1f ms, offloaded %.1f "
      "ms); target <= 1.15x: %s\n",
      r, o.pairs, *lo, *hi, median(plain_ms), median(offloaded_ms), r <= 1.15 ? "met" : "MISSED");
}

// Part 3b (see the header): every optimizer on the host, overlap none against all.
void overlap_cost(const Options& o) {
  auto with = [&](const char* overlap) {
    return config_with(o, {"memory.offload=none", "memory.recompute=none", "memory.optimizer_offload=all",
                           "memory.copy_engine_cpus=" + std::to_string(o.copy_cpus),
                           std::string("memory.optimizer_overlap=") + overlap});
  };
  const stp::Config none = with("none"), all = with("all");
  stp::MemoryPlan none_plan, all_plan;
  if (!fits(none, &none_plan) || !fits(all, &all_plan)) {
    std::printf("\n== optimizer overlap: the job does not fit with every optimizer on the host ==\n");
    return;
  }
  // Per device: the tied embedding's chunks do not speculate, so the devices holding them keep
  // their exposed time.
  std::string exposed;
  std::size_t shadows = 0;
  for (std::size_t g = 0; g < all_plan.predicted.size(); ++g) {
    const stp::RankPrediction& p = all_plan.predicted[g];
    shadows += p.optimizer_shadow_bytes;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%.1f -> %.1f", g ? ", " : "", none_plan.predicted[g].optimizer_offload_s * 1e3,
                  p.optimizer_offload_s * 1e3);
    exposed += buf;
  }
  std::printf(
      "\n== optimizer overlap: n_layer %lld, %s tp %d pp %d, every optimizer on the host, copy-engine CPUs %d, "
      "grad_clip %g; shadows %.2f MiB pinned in all; predicted exposed optimizer time per device, none -> all: "
      "%s ms ==\n",
      static_cast<long long>(none.model.n_layer), none.parallel.schedule.c_str(), none.parallel.tp, none.parallel.pp,
      o.copy_cpus, none.train.grad_clip, mib(shadows), exposed.c_str());
  std::vector<double> ratios, none_ms, all_ms;
  stp::StepResult::Speculation spec;
  for (int i = 0; i < o.pairs; ++i) {
    StepTimes a = run_steps(none, o.steps), b = run_steps(all, o.steps, &spec);
    none_ms.push_back(a.step_ms), all_ms.push_back(b.step_ms), ratios.push_back(b.step_ms / a.step_ms);
    std::printf("pair %d: overlap none %.1f ms/step, overlap all %.1f ms/step, ratio %.3f\n", i + 1, a.step_ms,
                b.step_ms, b.step_ms / a.step_ms);
  }
  const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
  std::printf(
      "overlap ratio (all / none): %.3fx (median of %d pairs, spread %.3f..%.3f; none %.1f ms, all %.1f ms); "
      "speculations: %llu committed, %llu discarded, %.1f ms of CPU update hidden per measured step\n",
      median(ratios), o.pairs, *lo, *hi, median(none_ms), median(all_ms),
      static_cast<unsigned long long>(spec.committed), static_cast<unsigned long long>(spec.discarded),
      spec.hidden_s * 1e3 / std::max(1, o.pairs * o.steps));
}

// Part 4 (see the header): a budget that only parameter streaming fits, against no levers.
struct StreamBudgets {
  std::size_t streaming = 0, resident = 0;  // exact minimum feasible budgets, param_offload all / none
};

StreamBudgets stream_budgets(const Options& o, const std::vector<std::string>& levers_off) {
  auto minimum = [&](const char* stream) {
    std::vector<std::string> y = levers_off;
    y.insert(y.end(), {"memory.optimizer_offload=all", std::string("memory.param_offload=") + stream,
                       "memory.device_budget=1MiB"});
    return stp::make_memory_plan(config_with(o, y), /*exact_minimum=*/true).min_device_budget;
  };
  return {minimum("all"), minimum("none")};
}

// The plan's step time: the slowest device's compute plus what the levers add to it.
double predicted_step_s(const stp::MemoryPlan& plan) {
  double s = 0;
  for (const auto& p : plan.predicted) s = std::max(s, p.compute_s + p.step_cost_s());
  return s;
}

void print_stream_plan(const stp::MemoryPlan& plan, const stp::MemoryPlan& free_plan) {
  std::size_t streamed = 0, chunks = 0;
  for (const auto& rp : plan.ranks)
    for (std::size_t ch = 0; ch < rp.units.size(); ++ch, ++chunks) streamed += rp.streams_params(static_cast<int>(ch));
  std::printf("plan: peak %.2f MiB; weights and gradients of %zu of %zu chunks streamed; per device, ms per step:\n",
              mib(max_peak(plan)), streamed, chunks);
  for (std::size_t g = 0; g < plan.predicted.size(); ++g) {
    const stp::RankPrediction& p = plan.predicted[g];
    std::printf(
        "  device %zu: streamed %.2f MiB weights up, %.2f MiB gradients up, %.2f MiB down; compute %.1f, exposed "
        "copies %.1f, optimizer offload %.1f (CPU AdamW %.1f) -> step %.1f\n",
        g, mib(p.stream_weights_up_bytes), mib(p.stream_grads_up_bytes), mib(p.stream_grads_down_bytes),
        p.compute_s * 1e3, p.exposed_copy_s * 1e3, p.optimizer_offload_s * 1e3, p.cpu_optimizer_s * 1e3,
        (p.compute_s + p.step_cost_s()) * 1e3);
  }
  std::printf("predicted step: unconstrained %.1f ms, streaming %.1f ms, ratio %.3f (nominal rates: %s)\n",
              predicted_step_s(free_plan) * 1e3, predicted_step_s(plan) * 1e3,
              predicted_step_s(plan) / predicted_step_s(free_plan),
              "train/planner_rates.h; on the CPU backend the compute is slower than nominal");
}

void stream_cost(const Options& o) {
  std::vector<std::string> levers_off = {"memory.offload=none", "memory.recompute=none",
                                         "memory.copy_engine_cpus=" + std::to_string(o.copy_cpus)};
  if (o.stream_layers > 0) levers_off.push_back("model.n_layer=" + std::to_string(o.stream_layers));
  const StreamBudgets b = stream_budgets(o, levers_off);
  std::vector<std::string> x = levers_off;
  x.insert(x.end(), {"memory.optimizer_offload=none", "memory.param_offload=none"});
  const stp::Config plain = config_with(o, x);
  std::printf(
      "\n== streaming cost: n_layer %lld, %s tp %d pp %d, link %.2f GB/s, copy-engine CPUs %d; activation levers off, "
      "every optimizer on the host: minimum feasible budget without streaming %.2f MiB, with it %.2f MiB ==\n",
      static_cast<long long>(plain.model.n_layer), plain.parallel.schedule.c_str(), plain.parallel.tp,
      plain.parallel.pp, plain.memory.link_bandwidth / 1e9, o.copy_cpus, mib(b.resident), mib(b.streaming));
  if (b.streaming >= b.resident) {
    std::printf("no budget needs streaming: every budget that fits with it fits without (raise --stream-layers)\n");
    return;
  }
  const std::size_t budget = b.streaming + (b.resident - b.streaming) / 2;
  x = levers_off;
  x.insert(x.end(), {"memory.optimizer_offload=all", "memory.param_offload=auto",
                     "memory.device_budget=" + std::to_string(budget)});
  const stp::Config streaming = config_with(o, x);
  stp::MemoryPlan plan, free_plan;
  fits(plain, &free_plan);
  if (!fits(streaming, &plan) || !plan.ranks.front().streams_any()) {
    std::printf("the plan at %.2f MiB does not stream (feasible %d): nothing to measure\n", mib(budget), plan.feasible);
    return;
  }
  std::printf("budget %.2f MiB: halfway between them (streaming needed below %.2f MiB); unconstrained peak %.2f MiB\n",
              mib(budget), mib(b.resident), mib(max_peak(free_plan)));
  print_stream_plan(plan, free_plan);
  std::vector<double> ratios, plain_ms, stream_ms, cpu_ratios;
  bool peaks = true, bytes = true;
  for (int i = 0; i < o.pairs; ++i) {
    StepTimes a = run_steps(plain, o.steps), s = run_steps(streaming, o.steps);
    plain_ms.push_back(a.step_ms), stream_ms.push_back(s.step_ms), ratios.push_back(s.step_ms / a.step_ms);
    peaks = peaks && s.peaks_equal, bytes = bytes && s.stream_bytes_equal;
    cpu_ratios.push_back(s.cpu_ms / a.cpu_ms);
    std::printf(
        "pair %d: unconstrained %.1f ms/step (CPU %.0f ms), streaming %.1f ms/step (CPU %.0f ms; %.2f MiB in %llu "
        "copies streamed on the busiest device, %s the plan; peaks %s the plan), ratio %.3f\n",
        i + 1, a.step_ms, a.cpu_ms, s.step_ms, s.cpu_ms, mib(s.stream_bytes),
        static_cast<unsigned long long>(s.stream_copies),
        s.stream_bytes_equal ? "=" : "!=", s.peaks_equal ? "=" : "!=", s.step_ms / a.step_ms);
  }
  const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
  std::printf(
      "streaming cost ratio: %.3fx (median of %d pairs, spread %.3f..%.3f; unconstrained %.1f ms, streaming %.1f ms, "
      "%+.1f ms measured against %+.1f ms predicted); CPU time per step ratio %.3fx (median); measured peaks %s, "
      "streamed bytes %s\n",
      median(ratios), o.pairs, *lo, *hi, median(plain_ms), median(stream_ms), median(stream_ms) - median(plain_ms),
      (predicted_step_s(plan) - predicted_step_s(free_plan)) * 1e3, median(cpu_ratios), peaks ? "= plan" : "!= PLAN",
      bytes ? "= plan" : "!= PLAN");
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bool capacity_only = false, cost_only = false;
  CLI::App app{
      "Memory-budget benchmark on the CPU backend: (1) capacity, the largest depth whose plan fits the "
      "budget with the planner vs without; (2) cost, step time at 60% of the unconstrained peak vs "
      "unconstrained, with rate-limited copies; (3) the optimizer offload's and overlap's cost; (4) the step "
      "cost at a budget that forces parameter streaming. Sizes and rates take the config's units (48MiB, 4GB/s).",
      "bench_memory"};
  stp::tools::init_cli(app);
  app.add_option("--config", o.config, "the job to scale")->type_name("PATH")->capture_default_str();
  app.add_option("--budget", o.budget, "memory.device_budget of the capacity search")
      ->type_name("BYTES")
      ->capture_default_str();
  app.add_option("--link", o.link, "memory.link_bandwidth: D2H/H2D copy rate of the cost runs")
      ->type_name("BYTES_PER_S")
      ->capture_default_str();
  app.add_option("--steps", o.steps, "measured steps per run, after one warm-up step")
      ->type_name("N")
      ->capture_default_str();
  app.add_option("--pairs", o.pairs, "plain/planned run pairs of the cost part")->type_name("N")->capture_default_str();
  app.add_option("--max-layers", o.max_layers,
                 "deepest model the capacity search tries (the strongest-plan bound keeps a deep cap cheap)")
      ->type_name("N")
      ->capture_default_str();
  app.add_option("--copy-cpus", o.copy_cpus,
                 "memory.copy_engine_cpus of the cost runs (0: copies share the compute CPUs)")
      ->type_name("N")
      ->capture_default_str();
  app.add_option("--set", o.overrides, "override one config key (repeatable)")
      ->type_name("KEY=VALUE")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->allow_extra_args(false);
  app.add_option("--stream-layers", o.stream_layers, "model.n_layer of the streaming cost part (0: the config's)")
      ->type_name("N")
      ->capture_default_str();
  bool optimizer_only = false, overlap_only = false, stream_only = false;
  auto* capacity_flag = app.add_flag("--capacity-only", capacity_only, "run only part 1, capacity");
  auto* cost_flag = app.add_flag("--cost-only", cost_only, "run only part 2, cost")->excludes(capacity_flag);
  auto* optimizer_flag = app.add_flag("--optimizer-only", optimizer_only,
                                      "run only part 3, the optimizer-offload cost and the optimizer overlap")
                             ->excludes(capacity_flag)
                             ->excludes(cost_flag);
  auto* overlap_flag =
      app.add_flag("--overlap-only", overlap_only, "run only the optimizer overlap of part 3 (none against all)")
          ->excludes(capacity_flag)
          ->excludes(cost_flag)
          ->excludes(optimizer_flag);
  app.add_flag("--stream-only", stream_only,
               "run only part 4, the step cost at a budget that forces parameter streaming")
      ->excludes(capacity_flag)
      ->excludes(cost_flag)
      ->excludes(optimizer_flag)
      ->excludes(overlap_flag);
  if (auto status = stp::tools::parse_cli(app, argc, argv)) return *status;
  return stp::tools::run_main(app, [&] {
    const bool all_parts = !capacity_only && !cost_only && !optimizer_only && !overlap_only && !stream_only;
    if (all_parts || capacity_only) capacity(o);
    if (all_parts || cost_only) cost(o);
    if (all_parts || optimizer_only) optimizer_cost(o);
    if (all_parts || optimizer_only || overlap_only) overlap_cost(o);
    if (all_parts || stream_only) stream_cost(o);
    return 0;
  });
}
