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
//
// This file is the command line; the parts are in tools/bench/bench_memory/, one file each
// (capacity.cpp with the search in capacity_search.cpp, cost.cpp, optimizer_cost.cpp,
// stream_cost.cpp), sharing common.h and the timed runs of step_runs.h.
#include <string>
#include <vector>

#include "tools/bench/bench_memory/parts.h"
#include "tools/cli/cli.h"

int main(int argc, char** argv) {
  namespace bm = stp::bench_memory;
  bm::Options o;
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
    if (all_parts || capacity_only) bm::capacity(o);
    if (all_parts || cost_only) bm::cost(o);
    if (all_parts || optimizer_only) bm::optimizer_cost(o);
    if (all_parts || optimizer_only || overlap_only) bm::overlap_cost(o);
    if (all_parts || stream_only) bm::stream_cost(o);
    return 0;
  });
}
