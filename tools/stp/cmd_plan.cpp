// stp plan CONFIG.yaml [--set KEY=VALUE]... [--json]
//
// Prints the memory plan a training run of CONFIG would use, without training: per device the
// predicted peak by category (exact on the CPU backend: what metrics.jsonl will report), pinned
// host bytes, the model states (weights, gradients, optimizer state) on the device and on the host,
// the pinned host total against memory.host_budget, the keep / offload / recompute decisions, the
// optimizer placement and the predicted step-time cost (recompute, exposed copies, CPU optimizer),
// and the bytes of the vocabulary tables (embedding + LM head) each device holds
// (parallel.vocab_parallel).
// Exit status 0 when the plan fits memory.device_budget and memory.host_budget, 1 otherwise (the
// plan is printed either way, with the minimum feasible budget).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "config/config.h"
#include "base/error.h"
#include "base/json_number.h"
#include "memory/planner.h"
#include "tools/stp/command.h"
#include "tools/cli/config_args.h"
#include "train/memory_planning.h"
#include "train/memory_settings.h"
#include "train/stage_layout.h"

namespace {

// The units that offload or recompute, in (chunk, unit) order.
nlohmann::ordered_json decisions_json(const stp::RankPlan& plan) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (std::size_t c = 0; c < plan.units.size(); ++c) {
    for (std::size_t u = 0; u < plan.units[c].size(); ++u) {
      const stp::UnitPlan& d = plan.units[c][u];
      if (!d.offload && d.recompute == stp::Recompute::None) continue;
      out.push_back({{"chunk", c}, {"unit", u}, {"offload", d.offload}, {"recompute", stp::to_string(d.recompute)}});
    }
  }
  return out;
}

// Where each local chunk's optimizer state lives: ["device", "host", ...].
nlohmann::ordered_json optimizer_json(const stp::RankPlan& plan) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (std::size_t c = 0; c < plan.units.size(); ++c)
    out.push_back(stp::to_string(plan.optimizer_placement(static_cast<int>(c))));
  return out;
}

nlohmann::ordered_json states_json(const stp::ModelStateBytes& b) {
  return {{"weights", b.weights}, {"gradients", b.gradients}, {"optimizer_state", b.optimizer}};
}

std::string states_text(const stp::ModelStateBytes& b) {
  return stp::str("weights ", stp::format_bytes(b.weights), ", gradients ", stp::format_bytes(b.gradients),
                  ", optimizer state ", stp::format_bytes(b.optimizer));
}

struct PlanArgs {
  stp::tools::ConfigArgs config;
  bool json = false;
};

int run(const PlanArgs& a) {
  const stp::tools::ConfigArgs& args = a.config;
  const bool json = a.json;
  const std::string& path = args.config_path;
  stp::Config cfg = stp::load_config(path, args.overrides);
  stp::MemoryPlan plan = stp::make_memory_plan(cfg, /*exact_minimum=*/true);
  const int tp = cfg.parallel.tp;
  const stp::sched::Schedule schedule =
      stp::sched::generate(cfg.parallel.schedule, cfg.parallel.pp, cfg.train.microbatches);
  // Device g is pipeline rank g / tp (memory plans list the devices of one replica, TP ranks innermost).
  auto vocab_bytes = [&](std::size_t g) {
    return stp::vocab_param_bytes(cfg, schedule, static_cast<int>(g / static_cast<std::size_t>(tp)));
  };
  const stp::MemorySettings settings = stp::memory_settings(cfg);
  std::size_t pinned = 0;  // activation pools plus host-placed optimizer state, all devices
  double exposed_s = 0, cpu_optimizer_s = 0;
  for (const stp::RankPrediction& p : plan.predicted) {
    pinned += p.host_pinned_bytes + p.host_states.total();
    exposed_s = std::max(exposed_s, p.exposed_copy_s);
    cpu_optimizer_s = std::max(cpu_optimizer_s, p.cpu_optimizer_s);
  }
  std::size_t chunks = 0, host_chunks = 0;
  for (const stp::RankPlan& rp : plan.ranks)
    for (std::size_t c = 0; c < rp.units.size(); ++c, ++chunks)
      host_chunks += rp.optimizer_placement(static_cast<int>(c)) == stp::OptimizerPlacement::Host;
  std::string error;
  try {
    stp::check_plan(plan, cfg);
  } catch (const stp::Error& e) {
    error = e.what();
  }
  if (json) {
    nlohmann::ordered_json out;
    out["feasible"] = error.empty();
    out["min_device_budget"] = plan.min_device_budget;
    out["optimizer_offload"] = plan.optimizer_offload;
    nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
    for (std::size_t g = 0; g < plan.predicted.size(); ++g) {
      const stp::RankPrediction& p = plan.predicted[g];
      nlohmann::ordered_json cats = nlohmann::ordered_json::object();
      for (std::size_t c = 0; c < stp::kMemoryCategories; ++c)
        cats[stp::to_string(static_cast<stp::MemoryCategory>(c))] = p.peak_by_category[c];
      ranks.push_back({{"rank", g},
                       {"peak_device_bytes", p.peak_device_bytes},
                       {"peak_by_category", std::move(cats)},
                       {"host_pinned_bytes", p.host_pinned_bytes},
                       {"vocab_param_bytes", vocab_bytes(g)},
                       {"model_states_device", states_json(p.device_states)},
                       {"model_states_host", states_json(p.host_states)},
                       {"predicted_step_cost", stp::json_number(p.step_cost_s(), 6)},
                       {"exposed_copy_s", stp::json_number(p.exposed_copy_s, 6)},
                       {"cpu_optimizer_s", stp::json_number(p.cpu_optimizer_s, 6)},
                       {"optimizer_offload_s", stp::json_number(p.optimizer_offload_s, 6)},
                       {"optimizer", optimizer_json(plan.ranks[g / static_cast<std::size_t>(tp)])},
                       {"late_reloads", plan.ranks[g / static_cast<std::size_t>(tp)].late_reloads},
                       {"decisions", decisions_json(plan.ranks[g / static_cast<std::size_t>(tp)])}});
    }
    out["ranks"] = std::move(ranks);
    out["host_pinned_total"] = pinned;
    if (settings.host_budget != stp::kNoBudget) out["host_budget"] = settings.host_budget;
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("memory plan for %s (schedule %s, tp %d, pp %d, m %d)\n", path.c_str(), cfg.parallel.schedule.c_str(),
                tp, cfg.parallel.pp, cfg.train.microbatches);
    std::printf("device budget %s, minimum feasible %s\n", stp::format_budget(plan.device_budget).c_str(),
                stp::format_bytes(plan.min_device_budget).c_str());
    for (std::size_t g = 0; g < plan.predicted.size(); ++g) {
      const stp::RankPrediction& p = plan.predicted[g];
      std::printf(
          "device %zu: peak %s (%s); pinned host %s; offload %s/step; cost +%.1f ms/step (recompute %.1f, exposed "
          "copies %.1f, optimizer offload %.1f) over %.1f ms compute\n",
          g, stp::format_bytes(p.peak_device_bytes).c_str(), stp::describe_categories(p).c_str(),
          stp::format_bytes(p.host_pinned_bytes).c_str(), stp::format_bytes(p.offload_bytes_per_step).c_str(),
          1e3 * p.step_cost_s(), 1e3 * p.recompute_s, 1e3 * p.exposed_copy_s, 1e3 * p.optimizer_offload_s,
          1e3 * p.compute_s);
      std::printf("device %zu: embedding + LM head %s (%s)\n", g,
                  stp::format_bytes(static_cast<std::size_t>(vocab_bytes(g))).c_str(),
                  cfg.parallel.vocab_parallel && tp > 1 ? "vocab-parallel: V padded to a multiple of tp, split over tp"
                                                        : "replicated on every TP rank");
      std::printf("  model states on the device: %s; on the host: %s\n", states_text(p.device_states).c_str(),
                  states_text(p.host_states).c_str());
    }
    const std::string where = host_chunks == 0 ? std::string("device")
                              : host_chunks == chunks
                                  ? std::string("pinned host memory, every chunk (memory.optimizer_offload)")
                                  : stp::str("pinned host memory for ", host_chunks, " of ", chunks,
                                             " chunks, the device for the rest (memory.optimizer_offload)");
    std::printf("optimizer state: %s; pinned host total %s of memory.host_budget %s\n", where.c_str(),
                stp::format_bytes(pinned).c_str(), stp::format_budget(settings.host_budget).c_str());
    std::printf("predicted per step (worst device): exposed copy time %.1f ms, CPU optimizer time %.1f ms\n",
                1e3 * exposed_s, 1e3 * cpu_optimizer_s);
    std::printf("decisions:\n%s", plan.summary.c_str());
    if (!error.empty()) std::printf("not feasible: %s\n", error.c_str());
  }
  return error.empty() ? 0 : 1;
}

stp::tools::Run define(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  stp::tools::add_config_args(app, args->config);
  app.add_flag("--json", args->json, "print the plan as one JSON object");
  app.footer("Exit status 0 when the plan fits memory.device_budget and memory.host_budget, 1 otherwise.");
  return [args] { return run(*args); };
}

}  // namespace

static const stp::tools::Command kCmd{"plan", "per-device memory plan, no training", &define};
