// `stp train CONFIG.yaml [--set KEY=VALUE]...`: trains, printing a live progress line, writing
// output.dir/metrics.jsonl, checkpoints, the resolved config and (output.trace) trace.json.
//
// Output safety: everything that can fail on bad input (config, data, schedule, model, budget)
// is checked before output.dir is touched. A fresh run in an output.dir that holds an earlier
// run first moves that run's files into output.dir/earlier-run-N/, so nothing is overwritten. An
// output.dir that cannot be made or used is an error naming the key.
// Ctrl-C (SIGINT) finishes the current step, writes a checkpoint and exits with status 130.
//
// Under mpirun (docs/scale-out.md) every process runs this: the config and rank-layout checks fail
// together on every process; process 0 alone prints progress and writes output.dir (metrics,
// config.yaml, trace of its rank, checkpoints); the processes agree after every step on stopping.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/config.h"
#include "base/error.h"
#include "base/fs_error.h"
#include "base/json_number.h"
#include "process/process.h"
#include "formats/checkpoint.h"
#include "tools/stp/command.h"
#include "tools/cli/config_args.h"
#include "train/rank_layout.h"
#include "train/model_flops.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace {

// Exit status of a run stopped by the non-finite guard (docs/design.md, Command line).
constexpr int kDivergedStatus = 5;

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted = true; }

// Moves the files of an earlier run out of the way (into earlier-run-N/) before a fresh run.
void archive_earlier_run(const fs::path& dir) {
  std::vector<fs::path> items;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n == "metrics.jsonl" || n == "trace.json" || n == "config.yaml" || n.rfind("checkpoint-", 0) == 0)
      items.push_back(e.path());
  }
  if (items.empty()) return;
  int k = 1;
  while (fs::exists(dir / ("earlier-run-" + std::to_string(k)))) ++k;
  fs::path dest = dir / ("earlier-run-" + std::to_string(k));
  fs::create_directory(dest);
  for (const auto& p : items) fs::rename(p, dest / p.filename());
  std::fprintf(stderr, "stp train: %s held an earlier run; moved its files to %s\n", dir.c_str(), dest.c_str());
}

// A run killed while it wrote metrics.jsonl leaves the last line cut (no newline). The resumed run
// logs that step again, so the cut text is dropped before it appends: it would otherwise join the
// first new line into one that no reader can parse.
void drop_cut_line(const fs::path& metrics) {
  std::error_code ec;
  if (!fs::is_regular_file(metrics, ec)) return;
  std::ifstream in(metrics, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.empty() || text.back() == '\n') return;
  const std::size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  fs::resize_file(metrics, keep);
  std::fprintf(stderr, "stp train: %s ended in a cut line (the run stopped while writing it); dropped it\n",
               metrics.c_str());
}

// A number for metrics.jsonl: JSON has no NaN or infinity, so a non-finite value is null.
nlohmann::ordered_json finite_or_null(nlohmann::ordered_json v, double x) {
  return std::isfinite(x) ? v : nlohmann::ordered_json(nullptr);
}

// One metrics.jsonl line; keys in this order, numbers rounded as the progress line shows them.
// val_loss only on the steps that evaluated; mfu only with train.peak_flops > 0.
std::string metrics_line(const stp::StepResult& r, const std::optional<double>& val_loss, double mfu) {
  nlohmann::ordered_json j;
  j["step"] = r.step;
  j["loss"] = finite_or_null(stp::json_fixed(r.loss, 6), r.loss);
  if (val_loss) j["val_loss"] = finite_or_null(stp::json_fixed(*val_loss, 6), *val_loss);
  j["lr"] = stp::json_number(r.lr, 6);
  j["grad_norm"] = finite_or_null(stp::json_number(r.grad_norm, 6), r.grad_norm);
  j["clip_coef"] = stp::json_number(r.clip_coef, 6);
  j["skipped"] = r.skipped;
  j["skipped_steps"] = r.skipped_steps;
  j["tokens_seen"] = r.tokens_seen;
  j["step_ms"] = stp::json_fixed(r.step_ms, 3);
  j["tokens_per_s"] = stp::json_fixed(r.tokens_per_s, 1);
  if (mfu >= 0) j["mfu"] = stp::json_number(mfu, 4);
  j["peak_device_bytes"] = r.peak_device_bytes;
  j["peak_host_pinned_bytes"] = r.peak_host_pinned_bytes;
  if (!r.offload.empty()) {
    auto rate = [](std::uint64_t bytes, double s) {
      return stp::json_fixed(s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0, 3);
    };
    nlohmann::ordered_json d2h = nlohmann::ordered_json::array(), h2d = d2h, d2h_rate = d2h, h2d_rate = d2h,
                           stall = d2h;
    for (const auto& o : r.offload) {
      d2h.push_back(o.d2h_bytes);
      h2d.push_back(o.h2d_bytes);
      d2h_rate.push_back(rate(o.d2h_bytes, o.d2h_busy_s));
      h2d_rate.push_back(rate(o.h2d_bytes, o.h2d_busy_s));
      stall.push_back(stp::json_fixed(o.stall_s * 1e3, 3));
    }
    j["offload"] = {
        {"d2h_bytes", d2h}, {"h2d_bytes", h2d}, {"d2h_GBps", d2h_rate}, {"h2d_GBps", h2d_rate}, {"stall_ms", stall}};
  }
  return j.dump() + "\n";
}

std::string format_duration(double seconds) {
  long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

// " | from FOLDER/config.json: model.n_layer, ..." when model.init_from's config.json gave model
// keys, so that the values printed before it are not mistaken for the YAML's.
std::string init_from_sources(const stp::Config& cfg) {
  if (cfg.model.init_from_keys.empty()) return "";
  std::string keys;
  for (const std::string& k : cfg.model.init_from_keys) keys += (keys.empty() ? "" : ", ") + k;
  return stp::str(" | from ", (fs::path(cfg.model.init_from) / "config.json").string(), ": ", keys);
}

void print_progress(const stp::StepResult& r, std::int64_t total, double elapsed_s, std::int64_t done_this_run,
                    bool tty, const std::optional<double>& val_loss) {
  std::uint64_t peak = 0;
  for (auto b : r.peak_device_bytes) peak = std::max<std::uint64_t>(peak, b);
  double eta =
      done_this_run > 0 ? elapsed_s / static_cast<double>(done_this_run) * static_cast<double>(total - r.step) : 0;
  char val[48] = "";
  if (val_loss) std::snprintf(val, sizeof val, " | val_loss %.4f", *val_loss);
  std::fprintf(
      stderr, "%sstep %lld/%lld | loss %.4f%s | lr %.2e | %.0f tok/s | %.0f ms/step | peak device %.1f MiB | ETA %s%s",
      tty ? "\r" : "", static_cast<long long>(r.step), static_cast<long long>(total), r.loss, val, r.lr, r.tokens_per_s,
      r.step_ms, static_cast<double>(peak) / (1024.0 * 1024.0), format_duration(eta).c_str(), tty ? "   " : "\n");
  std::fflush(stderr);
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  STP_CHECK(f.good(), "cannot write '", path.string(), "'");
}

int run(const stp::tools::ConfigArgs& args) {
  stp::ProcessGroup* procs = stp::tools::processes();
  const int processes = procs ? procs->size() : 1;
  const bool lead = !procs || procs->rank() == 0;  // prints and writes output.dir
  stp::Config cfg;
  auto setup = [&] {
    cfg = stp::load_config(args.config_path, args.overrides);
    stp::check_processes(stp::RankLayout::of(cfg), processes);
  };
  if (procs) procs->check_together(setup);
  else setup();
  const bool resuming = !cfg.train.resume.empty();

  // Everything that can fail on bad input happens here, before output.dir is touched.
  stp::TrainerOptions options;
  options.processes = procs;
  stp::Trainer trainer(cfg, options);
  if (lead)
    for (const std::string& w : trainer.warnings()) std::fprintf(stderr, "stp train: warning: %s\n", w.c_str());

  fs::path dir = cfg.output.dir;
  std::ofstream metrics;
  if (lead) {
    try {
      fs::create_directories(dir);
      if (!resuming) archive_earlier_run(dir);
      if (resuming) drop_cut_line(dir / "metrics.jsonl");
    } catch (const fs::filesystem_error& e) {
      throw stp::Error(stp::str("output.dir '", cfg.output.dir, "': ", stp::filesystem_reason(e, dir),
                                "; choose another output.dir, or make this one a folder you may write"));
    }
    write_text(dir / "config.yaml", cfg.to_yaml());
    metrics.open(dir / "metrics.jsonl", resuming ? std::ios::app : std::ios::trunc);
    STP_CHECK(metrics.good(), "cannot write '", (dir / "metrics.jsonl").string(), "'");
    std::fprintf(stderr,
                 "stp train: %s | %s %d layers, %d heads, %d embd, vocab %d, T %d | %s dp=%d tp=%d pp=%d m=%d B=%d | "
                 "%s backend, %d ranks in %d process%s%s%s\n",
                 args.config_path.c_str(), cfg.model.arch.c_str(), cfg.model.n_layer, cfg.model.n_head,
                 cfg.model.n_embd, cfg.model.vocab_size, cfg.model.seq_len, cfg.parallel.schedule.c_str(),
                 cfg.parallel.dp, cfg.parallel.tp, cfg.parallel.pp, cfg.train.microbatches, cfg.train.micro_batch_size,
                 cfg.parallel.backend.c_str(), trainer.world_size(), processes, processes == 1 ? "" : "es",
                 resuming ? stp::str(" | resuming after step ", trainer.steps_done()).c_str() : "",
                 init_from_sources(cfg).c_str());
    std::vector<stp::Trainer::DeviceMemory> mem = trainer.device_memory();
    for (std::size_t g = 0; g < mem.size(); ++g)
      if (mem[g].communicator_bytes > 0)
        std::fprintf(stderr, "stp train: device %zu: communicators (NCCL) took %.1f MiB outside memory.device_budget\n",
                     g, static_cast<double>(mem[g].communicator_bytes) / (1 << 20));
  }

  std::signal(SIGINT, on_sigint);
  const bool tty = isatty(STDERR_FILENO);
  auto t0 = std::chrono::steady_clock::now();
  std::int64_t first = trainer.steps_done();
  stp::StepResult last;
  double first_loss = -1;
  // Every process must stop after the same step: they agree on SIGINT, which may reach only some.
  auto interrupted = [&] { return procs ? procs->any(g_interrupted) : g_interrupted.load(); };
  bool stop = false;
  const double flops_per_token = stp::model_flops_per_token(cfg);
  const int devices = cfg.parallel.dp * cfg.parallel.tp * cfg.parallel.pp;
  bool diverged = false;
  while (trainer.steps_done() < cfg.train.steps && !(stop = interrupted())) {
    last = trainer.step();
    if (first_loss < 0 && !last.skipped) first_loss = last.loss;
    if (last.skipped && lead)
      std::fprintf(stderr,
                   "%sstp train: warning: step %lld skipped: loss %g, gradient norm %g (not finite); no update "
                   "(%lld in a row, the run stops at %lld)\n",
                   tty ? "\n" : "", static_cast<long long>(last.step), last.loss, last.grad_norm,
                   static_cast<long long>(last.consecutive_skips), static_cast<long long>(cfg.train.max_skipped_steps));
    diverged = last.consecutive_skips >= cfg.train.max_skipped_steps;
    std::optional<double> val_loss;
    if (cfg.train.eval_every > 0 && !diverged &&
        (last.step % cfg.train.eval_every == 0 || last.step == cfg.train.steps))
      val_loss = trainer.evaluate();
    bool log = lead && (last.step % cfg.output.log_every == 0 || last.step == cfg.train.steps || val_loss || diverged);
    double mfu = cfg.train.peak_flops > 0 ? flops_per_token * last.tokens_per_s / (cfg.train.peak_flops * devices) : -1;
    if (log) {
      metrics << metrics_line(last, val_loss, mfu);
      metrics.flush();
    }
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (log) print_progress(last, cfg.train.steps, elapsed, last.step - first, tty, val_loss);
    if (diverged) break;
    if (cfg.output.checkpoint_every > 0 && last.step % cfg.output.checkpoint_every == 0 && last.step < cfg.train.steps)
      trainer.save_checkpoint();
  }
  if (!stop && !diverged) stop = interrupted();  // Ctrl-C during the last step
  if (tty && lead) std::fprintf(stderr, "\n");
  std::signal(SIGINT, SIG_DFL);
  // After a stop on non-finite steps the parameters and optimizer state are still those of the
  // last step that updated (skipped steps change nothing); the checkpoint says so.
  const std::string note = diverged
                               ? stp::str("stopped after ", last.consecutive_skips, " consecutive non-finite steps (",
                                          last.step - last.consecutive_skips + 1, "..", last.step,
                                          "); parameters and optimizer state are those after step ",
                                          trainer.last_update_step(), ", the last good step")
                               : std::string();
  std::string ck = trainer.save_checkpoint(note);
  if (!lead) return diverged ? kDivergedStatus : stop ? 130 : 0;
  if (cfg.output.trace && trainer.trace()) trainer.trace()->write((dir / "trace.json").string());
  if (diverged) {
    std::fprintf(stderr,
                 "stp train: error: training diverged: %lld consecutive steps had a non-finite loss or gradient norm "
                 "(train.max_skipped_steps = %lld); checkpoint %s holds the last good state (after step %lld). "
                 "Lower train.lr, or raise train.warmup_steps or train.grad_clip.\n",
                 static_cast<long long>(last.consecutive_skips), static_cast<long long>(cfg.train.max_skipped_steps),
                 ck.c_str(), static_cast<long long>(trainer.last_update_step()));
    return kDivergedStatus;
  }
  if (stop) {
    std::fprintf(stderr,
                 "stp train: interrupted after step %lld; checkpoint %s (continue with --set train.resume=%s)\n",
                 static_cast<long long>(trainer.steps_done()), ck.c_str(), ck.c_str());
    return 130;
  }
  std::fprintf(stderr, "stp train: done, %lld steps; loss %.4f -> %.4f; checkpoint %s; metrics %s\n",
               static_cast<long long>(trainer.steps_done()), first_loss, last.loss, ck.c_str(),
               (dir / "metrics.jsonl").c_str());
  return 0;
}

stp::tools::Run define(CLI::App& app) {
  auto args = std::make_shared<stp::tools::ConfigArgs>();
  stp::tools::add_config_args(app, *args);
  app.footer(
      "Writes output.dir/metrics.jsonl, config.yaml, checkpoints and (output.trace) trace.json. Ctrl-C "
      "finishes the step, writes a checkpoint and exits with status 130. After train.max_skipped_steps "
      "consecutive non-finite steps it writes the last good state and exits with status 5.");
  return [args] { return run(*args); };
}

}  // namespace

static const stp::tools::Command kCmd{"train", "train; writes output.dir/metrics.jsonl", &define};
