// stp plan CONFIG.yaml [--set KEY=VALUE]... [--json | --bytes]
//
// Prints the memory plan a training run of CONFIG would use, without training: the budget and the
// minimum feasible budget, then one table row per device for the predicted peak by category
// against the budget (exact on the CPU backend: what metrics.jsonl will report) and the bytes of
// the vocabulary tables (embedding + LM head, parallel.vocab_parallel) within the weights; one for
// its pinned host memory (offloaded activations, host-placed model states) and offload traffic;
// one for the predicted step-time cost (recompute, exposed copies, optimizer offload over the
// compute, the CPU optimizer, and parameter streaming's copies when some device streams); then the optimizer placement,
// the host memory of the process (train/host_needs.h: pinned against memory.host_budget; pageable, the CPU backend's
// devices and the total against what this machine has, a note when it does not hold them) and the keep / offload /
// recompute decisions. Every size is printed once: in a human unit (base/error.h, format_bytes), in bytes with --bytes;
// --json has the same numbers as one object, bytes as integers, plus the model FLOPs per token, the tokens per step and
// the cost model's rates (docs/design.md). Exit status 0 when the plan fits memory.device_budget and
// memory.host_budget, 1 otherwise (the plan is printed either way, with the minimum feasible budget).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "base/error.h"
#include "base/json_number.h"
#include "memory/planner.h"
#include "tools/stp/command.h"
#include "tools/cli/config_args.h"
#include "train/host_needs.h"
#include "train/memory_planning.h"
#include "train/memory_settings.h"
#include "train/model_flops.h"
#include "train/planner_rates.h"
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

// Per local chunk: whether its weights and gradients stream from the host (memory.param_offload).
nlohmann::ordered_json param_stream_json(const stp::RankPlan& plan) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (std::size_t c = 0; c < plan.units.size(); ++c) out.push_back(plan.streams_params(static_cast<int>(c)));
  return out;
}

// How the rank's device arena places blocks (RankPlan::block_placement): "best-fit", ...
std::string placement_of(const stp::RankPlan& plan) { return stp::to_string(plan.block_placement); }

nlohmann::ordered_json states_json(const stp::ModelStateBytes& b) {
  return {{"weights", b.weights}, {"gradients", b.gradients}, {"optimizer_state", b.optimizer}};
}

// Rows of cells printed as aligned columns, two spaces apart, each right-aligned (the cells are
// numbers; the header is aligned with them).
class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print() const {
    std::vector<std::size_t> width(rows_.front().size(), 0);
    for (const auto& row : rows_)
      for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    for (const auto& row : rows_) {
      std::string line;
      for (std::size_t c = 0; c < row.size(); ++c)
        line += std::string(c ? 2 : 0, ' ') + std::string(width[c] - row[c].size(), ' ') + row[c];
      std::printf("%s\n", line.c_str());
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

// Milliseconds to one decimal.
std::string ms(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", 1e3 * seconds);
  return buf;
}

// The host memory of this process (train/host_needs.h): pinned against memory.host_budget,
// pinned + pageable (+ the CPU backend's devices) against what the machine has.
void add_host_json(nlohmann::ordered_json& out, const stp::HostNeeds& host, const stp::MemorySettings& settings,
                   const std::string& machine_note) {
  out["host_pinned_total"] = host.pinned();
  out["host_pageable_bytes"] = host.pageable.peak();
  out["host_pageable"] = {{"checkpoint_save", host.pageable.checkpoint_save},
                          {"init_from", host.pageable.init_from},
                          {"resume", host.pageable.resume}};
  out["host_device_bytes"] = host.devices;
  out["host_total_bytes"] = host.total();
  if (settings.host_budget != stp::kNoBudget) out["host_budget"] = settings.host_budget;
  out["host_budget_auto"] = settings.host_budget_auto;
  if (settings.machine.share() > 0) out["host_available"] = settings.machine.share();
  out["host_fits_machine"] = machine_note.empty();
}

// Which phase gives the pageable peak (train/host_needs.h).
const char* pageable_phase(const stp::HostPageable& p) {
  if (p.peak() == p.resume && p.resume) return "reading train.resume's checkpoint: one full f32 tensor at a time";
  if (p.peak() == p.init_from && p.init_from) return "reading model.init_from: one full f32 tensor at a time";
  return "the checkpoint save: one full f32 tensor at a time";
}

void print_host(const stp::HostNeeds& host, const stp::MemorySettings& settings, stp::ByteStyle style) {
  auto size = [style](std::size_t b) { return stp::format_bytes(b, style); };
  const std::string budget = settings.host_budget_auto
                                 ? stp::str(size(settings.host_budget), " (auto: what this machine has less the ",
                                            size(stp::host_reserve_bytes(settings.machine.share())), " reserve)")
                                 : stp::format_budget(settings.host_budget, style);
  std::vector<std::array<std::string, 3>> rows;
  rows.push_back({"pinned", size(host.pinned()), "of memory.host_budget " + budget});
  rows.push_back({"pageable", size(host.pageable.peak()), stp::str("at its peak, ", pageable_phase(host.pageable))});
  if (host.devices) rows.push_back({"devices", size(host.devices), "the CPU backend's emulated devices"});
  rows.push_back({"total", size(host.total()),
                  settings.machine.share() ? "of " + settings.machine.describe(style) + " this machine has"
                                           : "(this machine's memory is unknown: " + settings.machine.problem + ")"});
  std::size_t width = 0;
  for (const auto& r : rows) width = std::max(width, r[1].size());
  std::printf("\nhost memory of this process\n");
  for (const auto& r : rows)
    std::printf("%-8s  %*s  %s\n", r[0].c_str(), static_cast<int>(width), r[1].c_str(), r[2].c_str());
}

struct PlanArgs {
  stp::tools::ConfigArgs config;
  bool json = false;
  bool bytes = false;
};

int run(const PlanArgs& a) {
  const stp::tools::ConfigArgs& args = a.config;
  const bool json = a.json;
  const stp::ByteStyle style = a.bytes ? stp::ByteStyle::Exact : stp::ByteStyle::Human;
  auto size = [style](std::size_t b) { return stp::format_bytes(b, style); };
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
  const stp::HostNeeds host_memory = stp::host_needs(plan, cfg);
  std::size_t chunks = 0, host_chunks = 0;
  for (const stp::RankPlan& rp : plan.ranks)
    for (std::size_t c = 0; c < rp.units.size(); ++c, ++chunks)
      host_chunks += rp.optimizer_placement(static_cast<int>(c)) == stp::OptimizerPlacement::Host;
  std::string error;
  try {
    stp::check_plan(plan, cfg, style);
  } catch (const stp::Error& e) {
    error = e.what();
  }
  std::string machine_note;  // the run against this machine: a note, since a plan may be for another
  try {
    stp::check_host_machine(plan, cfg, settings, style);
  } catch (const stp::Error& e) {
    machine_note = e.what();
  }
  if (json) {
    nlohmann::ordered_json out;
    out["feasible"] = error.empty();
    out["min_device_budget"] = plan.min_device_budget;
    out["optimizer_offload"] = plan.optimizer_offload;
    out["optimizer_overlap"] = plan.optimizer_overlap;
    // The loss head's tokens per chunk (model.loss_chunk_tokens resolved; 0 = unchunked).
    out["loss_chunk_tokens"] = plan.ranks.empty() ? 0 : plan.ranks.back().loss_chunk_tokens;
    // Sequence groups of the full-recompute units' tiled backward (memory.unit_tiles resolved; 1 = untiled).
    out["unit_tiles"] = plan.ranks.empty() ? 1 : plan.ranks.front().unit_tiles;
    // What benchmarks need to compute MFU the way `stp train` does (tools/gpu-bench), and the
    // rates the plan's step cost was computed with (train/planner_rates.h).
    out["model_flops_per_token"] = stp::model_flops_per_token(cfg);
    out["tokens_per_step"] =
        std::int64_t{cfg.train.microbatches} * cfg.train.micro_batch_size * cfg.model.seq_len * cfg.parallel.dp;
    const stp::PlannerRates rates = stp::planner_rates(cfg);
    out["cost_model"] = {
        {"flops_per_s", rates.flops_per_s}, {"link_bytes_per_s", rates.link_bytes_per_s}, {"source", rates.source}};
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
                       {"offload_bytes_per_step", p.offload_bytes_per_step},
                       {"vocab_param_bytes", vocab_bytes(g)},
                       {"model_states_device", states_json(p.device_states)},
                       {"model_states_host", states_json(p.host_states)},
                       {"predicted_step_cost", stp::json_number(p.step_cost_s(), 6)},
                       {"compute_s", stp::json_number(p.compute_s, 6)},
                       {"recompute_s", stp::json_number(p.recompute_s, 6)},
                       {"exposed_copy_s", stp::json_number(p.exposed_copy_s, 6)},
                       {"param_stream_bytes_per_step",
                        {{"weights_up", p.stream_weights_up_bytes},
                         {"grads_up", p.stream_grads_up_bytes},
                         {"grads_down", p.stream_grads_down_bytes}}},
                       {"cpu_optimizer_s", stp::json_number(p.cpu_optimizer_s, 6)},
                       {"optimizer_offload_s", stp::json_number(p.optimizer_offload_s, 6)},
                       {"optimizer_shadow_bytes", p.optimizer_shadow_bytes},
                       {"optimizer", optimizer_json(plan.ranks[g / static_cast<std::size_t>(tp)])},
                       {"param_stream", param_stream_json(plan.ranks[g / static_cast<std::size_t>(tp)])},
                       {"late_reloads", plan.ranks[g / static_cast<std::size_t>(tp)].late_reloads},
                       {"late_params", plan.ranks[g / static_cast<std::size_t>(tp)].late_params},
                       {"block_placement", placement_of(plan.ranks[g / static_cast<std::size_t>(tp)])},
                       {"param_stream_s", stp::json_number(p.param_stream_s, 6)},
                       {"decisions", decisions_json(plan.ranks[g / static_cast<std::size_t>(tp)])}});
    }
    out["ranks"] = std::move(ranks);
    add_host_json(out, host_memory, settings, machine_note);
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("memory plan for %s (schedule %s, tp %d, pp %d, m %d)\n", path.c_str(), cfg.parallel.schedule.c_str(),
                tp, cfg.parallel.pp, cfg.train.microbatches);
    std::printf("device budget %s, minimum feasible %s\n", stp::format_budget(plan.device_budget, style).c_str(),
                stp::format_bytes(plan.min_device_budget, style, stp::Rounding::Up).c_str());
    // The device's model states are the peak's weights, gradients and optimizer state (the report
    // pass copies them), so one row says both.
    std::printf("\ndevice memory at the predicted peak\n");
    Table device({"device", "peak", "of budget", "weights", "gradients", "optimizer state", "activations", "buffers",
                  "embedding + LM head"});
    bool on_host = false;
    for (std::size_t g = 0; g < plan.predicted.size(); ++g) {
      const stp::RankPrediction& p = plan.predicted[g];
      auto cat = [&](stp::MemoryCategory c) { return size(p.peak_by_category[static_cast<std::size_t>(c)]); };
      char share[32] = "-";
      if (plan.device_budget != stp::kNoBudget)
        std::snprintf(share, sizeof share, "%.1f%%",
                      100.0 * static_cast<double>(p.peak_device_bytes) / static_cast<double>(plan.device_budget));
      device.add({std::to_string(g), size(p.peak_device_bytes), share, cat(stp::MemoryCategory::Weights),
                  cat(stp::MemoryCategory::Gradients), cat(stp::MemoryCategory::OptimizerState),
                  cat(stp::MemoryCategory::Activations), cat(stp::MemoryCategory::Buffers),
                  size(static_cast<std::size_t>(vocab_bytes(g)))});
      on_host = on_host || p.host_pinned_bytes + p.host_states.total() + p.offload_bytes_per_step > 0;
    }
    device.print();
    std::printf("(embedding + LM head: part of the weights; %s)\n",
                cfg.parallel.vocab_parallel && tp > 1 ? "vocab-parallel, V padded to a multiple of tp and split over tp"
                                                      : "replicated on every TP rank");
    if (on_host) {
      std::printf("\npinned host memory\n");
      // Parameter streaming's copies per step, both directions, in a column of their own when some
      // device streams.
      auto streamed = [](const stp::RankPrediction& p) {
        return static_cast<std::size_t>(p.stream_weights_up_bytes + p.stream_grads_up_bytes +
                                        p.stream_grads_down_bytes);
      };
      const bool streams = std::any_of(plan.predicted.begin(), plan.predicted.end(),
                                       [&](const stp::RankPrediction& p) { return streamed(p) > 0; });
      std::vector<std::string> head = {"device",    "activations",     "weights",
                                       "gradients", "optimizer state", "offloaded per step"};
      if (streams) head.push_back("streamed per step");
      Table host(head);
      for (std::size_t g = 0; g < plan.predicted.size(); ++g) {
        const stp::RankPrediction& p = plan.predicted[g];
        std::vector<std::string> row = {std::to_string(g),
                                        size(p.host_pinned_bytes),
                                        size(p.host_states.weights),
                                        size(p.host_states.gradients),
                                        size(p.host_states.optimizer),
                                        size(static_cast<std::size_t>(p.offload_bytes_per_step))};
        if (streams) row.push_back(size(streamed(p)));
        host.add(row);
      }
      host.print();
    } else {
      std::printf("\npinned host memory: none (no activation offloaded, every optimizer on the device)\n");
    }
    std::printf("\npredicted time per step in ms: the compute and what the levers add to it\n");
    // Parameter streaming's price in a column of its own when some device streams.
    const bool streaming = std::any_of(plan.predicted.begin(), plan.predicted.end(),
                                       [](const stp::RankPrediction& p) { return p.param_stream_s > 0; });
    std::vector<std::string> time_head = {"device",         "compute time",      "added",        "recompute",
                                          "exposed copies", "optimizer offload", "CPU optimizer"};
    if (streaming) time_head.push_back("streaming");
    Table time(time_head);
    for (std::size_t g = 0; g < plan.predicted.size(); ++g) {
      const stp::RankPrediction& p = plan.predicted[g];
      std::vector<std::string> row = {std::to_string(g),    ms(p.compute_s),      "+" + ms(p.step_cost_s()),
                                      ms(p.recompute_s),    ms(p.exposed_copy_s), ms(p.optimizer_offload_s),
                                      ms(p.cpu_optimizer_s)};
      if (streaming) row.push_back(ms(p.param_stream_s));
      time.add(row);
    }
    time.print();
    std::printf("\n");
    const std::string where = host_chunks == 0 ? std::string("device")
                              : host_chunks == chunks
                                  ? std::string("pinned host memory, every chunk (memory.optimizer_offload)")
                                  : stp::str("pinned host memory for ", host_chunks, " of ", chunks,
                                             " chunks, the device for the rest (memory.optimizer_offload)");
    std::printf("optimizer state: %s\n", where.c_str());
    print_host(host_memory, settings, style);
    if (!machine_note.empty()) std::printf("on this machine: %s\n", machine_note.c_str());
    std::printf("decisions:\n%s", plan.summary.c_str());
    if (!error.empty()) std::printf("not feasible: %s\n", error.c_str());
  }
  return error.empty() ? 0 : 1;
}

stp::tools::Run define(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  stp::tools::add_config_args(app, args->config);
  CLI::Option* json = app.add_flag("--json", args->json, "print the plan as one JSON object (sizes in bytes)");
  app.add_flag("--bytes", args->bytes, "print every size in bytes instead of KiB / MiB / GiB")->excludes(json);
  app.footer("Exit status 0 when the plan fits memory.device_budget and memory.host_budget, 1 otherwise.");
  return [args] { return run(*args); };
}

}  // namespace

static const stp::tools::Command kCmd{"plan", "per-device memory plan, no training", &define};
