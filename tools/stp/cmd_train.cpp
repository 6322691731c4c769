// `stp train CONFIG.yaml [--set KEY=VALUE]...`: trains, printing a live progress line, writing
// output.dir/metrics.jsonl, checkpoints, the resolved config and (output.trace) trace.json.
//
// Output safety: everything that can fail on bad input (config, data, schedule, model, budget)
// is checked before output.dir is touched. output.dir may not be, lie inside or hold what the run
// reads (data.path, data.val_path, their loss masks, data.tokenizer, model.init_from, the config file;
// tools/cli/output_guard.h); a resumed run continues in the output.dir that holds its checkpoint.
// A fresh run in an output.dir that holds an earlier run first moves that run's files into
// output.dir/earlier-run-N/, so nothing is overwritten. A resume with nothing left to train (its checkpoint at or past
// train.steps) is such an error.
// SIGINT (Ctrl-C), SIGTERM and SIGHUP finish the current step, write a checkpoint and exit with
// 128 + the signal's number (130, 143, 129); a second one exits at once (tools/cli/stop_signals.h;
// docs/design.md, Signals and exit statuses).
// Every checkpoint carries the run's tokenizer (Trainer::tokenizer_source), named on stderr.
// Every checkpoint is written only if its state is finite (Trainer::try_save_checkpoint); one that
// is not ends the run at once with status 5, naming the last good state.
//
// Under mpirun (docs/scale-out.md) every process runs this: the config and rank-layout checks fail
// together on every process; process 0 alone prints progress and writes output.dir (metrics,
// config.yaml, trace of its rank, checkpoints); the processes agree before every step on stopping.
#include <unistd.h>

#include <chrono>
#include <cmath>
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
#include "base/file_io.h"
#include "base/fs_error.h"
#include "base/json_number.h"
#include "process/process.h"
#include "formats/checkpoint.h"
#include "tools/stp/command.h"
#include "tools/cli/config_args.h"
#include "tools/cli/output_guard.h"
#include "tools/cli/stop_signals.h"
#include "train/rank_layout.h"
#include "train/model_flops.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace {

// Exit status of a run stopped by the non-finite guard (docs/design.md, Command line).
constexpr int kDivergedStatus = 5;

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
  const std::string text = stp::read_regular_file(metrics.string(), "output.dir's metrics.jsonl");
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
  j["launches"] = r.launches;
  j["late_gemm_choices"] = r.late_gemm_choices;
  if (r.speculation.committed + r.speculation.discarded > 0)
    j["optimizer_overlap"] = {{"committed", r.speculation.committed},
                              {"discarded", r.speculation.discarded},
                              {"hidden_ms", stp::json_fixed(r.speculation.hidden_s * 1e3, 3)}};
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
  if (!r.param_stream.empty()) {
    nlohmann::ordered_json h2d = nlohmann::ordered_json::array(), d2h = h2d, h2d_copies = h2d, d2h_copies = h2d,
                           zeroed = h2d;
    for (const auto& p : r.param_stream) {
      zeroed.push_back(p.zeroed_bytes);
      h2d.push_back(p.h2d_bytes);
      d2h.push_back(p.d2h_bytes);
      h2d_copies.push_back(p.h2d_copies);
      d2h_copies.push_back(p.d2h_copies);
    }
    j["param_stream"] = {{"h2d_bytes", h2d},
                         {"d2h_bytes", d2h},
                         {"h2d_copies", h2d_copies},
                         {"d2h_copies", d2h_copies},
                         {"zeroed_bytes", zeroed}};
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

std::string fixed4(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", x);
  return buf;
}

// Outputs never overwrite inputs: output.dir is none of what the run reads, nor inside it, nor
// holding it, except that a resumed run continues in the output.dir of its checkpoint.
void check_outputs(const stp::Config& cfg, const std::string& config_path) {
  stp::tools::check_output_dir(cfg.output.dir, "output.dir",
                               {{cfg.data.path, "data.path"},
                                {cfg.data.val_path, "data.val_path"},
                                {cfg.data.tokenizer, "data.tokenizer"},
                                {cfg.data.mask_path, "data.mask_path"},
                                {cfg.data.val_mask_path, "data.val_mask_path"},
                                {cfg.model.init_from, "model.init_from"},
                                {cfg.train.resume, "train.resume", true},
                                {config_path, "the config file"}});
}

int run(const stp::tools::ConfigArgs& args) {
  stp::ProcessGroup* procs = stp::tools::processes();
  const int processes = procs ? procs->size() : 1;
  const bool lead = !procs || procs->rank() == 0;  // prints and writes output.dir
  stp::Config cfg;
  auto setup = [&] {
    cfg = stp::load_config(args.config_path, args.overrides);
    stp::check_processes(stp::RankLayout::of(cfg), processes);
    check_outputs(cfg, args.config_path);
    if (!cfg.train.resume.empty()) {
      const std::int64_t at = stp::read_checkpoint_state(cfg.train.resume).step;
      STP_CHECK(at < cfg.train.steps, "train.resume '", cfg.train.resume, "' holds the state after step ", at,
                " and train.steps is ", cfg.train.steps, ": nothing is left to train; set train.steps above ", at,
                " to train on from it (e.g. --set train.steps=", at + cfg.train.steps, ")");
    }
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
    stp::write_file_atomic((dir / "config.yaml").string(), cfg.to_yaml());
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
    if (!trainer.tokenizer_source().empty())
      std::fprintf(stderr, "stp train: checkpoints carry the tokenizer of %s\n", trainer.tokenizer_source().c_str());
    std::vector<stp::Trainer::DeviceMemory> mem = trainer.device_memory();
    for (std::size_t g = 0; g < mem.size(); ++g)
      if (mem[g].communicator_bytes > 0)
        std::fprintf(stderr, "stp train: device %zu: communicators (NCCL) took %.1f MiB outside memory.device_budget\n",
                     g, static_cast<double>(mem[g].communicator_bytes) / (1 << 20));
  }

  // From here on SIGINT, SIGTERM and SIGHUP stop the run after the step in progress. Before (the
  // setup above) they end the process as they normally do: nothing has been trained yet.
  stp::tools::StopSignals signals("stp train");
  const bool tty = isatty(STDERR_FILENO);
  auto t0 = std::chrono::steady_clock::now();
  std::int64_t first = trainer.steps_done();
  stp::StepResult last;
  std::optional<double> first_loss;             // of the first step of this run that updated
  std::optional<stp::StepResult> last_trained;  // the last step of this run that updated
  std::int64_t skipped = 0;                     // steps of this run skipped as non-finite
  // The checkpoint on disk that holds the current state, if any: the run does not write it again.
  std::string saved = resuming ? cfg.train.resume : std::string();
  std::int64_t saved_step = resuming ? first : -1;
  // Every process must stop after the same step: before each step they agree on the stop signal,
  // which may have reached only some of them (the largest number wins: SIGTERM, SIGINT, SIGHUP).
  auto stop_signal = [&] { return procs ? procs->max(signals.received()) : signals.received(); };
  int stop = 0;
  const double flops_per_token = stp::model_flops_per_token(cfg);
  const int devices = cfg.parallel.dp * cfg.parallel.tp * cfg.parallel.pp;
  bool diverged = false;
  std::optional<stp::CheckpointSave> refused;  // a checkpoint whose state was not finite
  while (trainer.steps_done() < cfg.train.steps && !(stop = stop_signal())) {
    last = trainer.step();
    if (last.skipped) ++skipped;
    else {
      if (!first_loss) first_loss = last.loss;
      last_trained = last;
    }
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
    if (cfg.output.checkpoint_every > 0 && last.step % cfg.output.checkpoint_every == 0 &&
        last.step < cfg.train.steps) {
      stp::CheckpointSave s = trainer.try_save_checkpoint();
      if (!s.written) {  // no later step can make the parameters finite again
        refused = s;
        break;
      }
      saved = s.path;
      saved_step = last.step;
    }
  }
  // A signal that came during the last step changes nothing: the run is complete (status 0).
  if (tty && lead) std::fprintf(stderr, "\n");
  // After a stop on non-finite steps the parameters and optimizer state are still those of the
  // last step that updated (skipped steps change nothing); the checkpoint says so.
  const std::string note = diverged
                               ? stp::str("stopped after ", last.consecutive_skips, " consecutive non-finite steps (",
                                          last.step - last.consecutive_skips + 1, "..", last.step,
                                          "); parameters and optimizer state are those after step ",
                                          trainer.last_update_step(), ", the last good step")
                               : std::string();
  // Every process takes the same branch: saved_step, the note and the finiteness check (agreed
  // over the job) are alike on all of them.
  std::string ck;
  if (!refused && !diverged && saved_step == trainer.steps_done()) {
    ck = saved;
  } else if (!refused) {
    stp::CheckpointSave s = trainer.try_save_checkpoint(note);
    if (s.written) ck = s.path;
    else refused = s;
  }
  const int status = diverged || refused ? kDivergedStatus : stop ? stp::tools::stop_status(stop) : 0;
  if (!lead) return status;
  if (cfg.output.trace && trainer.trace()) trainer.trace()->write((dir / "trace.json").string());
  if (refused) {
    const std::string why =
        diverged ? stp::str("training diverged: ", last.consecutive_skips,
                            " consecutive steps had a non-finite loss or gradient norm (train.max_skipped_steps = ",
                            cfg.train.max_skipped_steps, "), and ")
                 : std::string();
    std::fprintf(stderr,
                 "stp train: error: %s%s. Lower train.lr or optim.weight_decay, or raise train.warmup_steps or "
                 "train.grad_clip.\n",
                 why.c_str(), refused->problem.c_str());
    return kDivergedStatus;
  }
  if (diverged) {
    std::fprintf(stderr,
                 "stp train: error: training diverged: %lld consecutive steps had a non-finite loss or gradient norm "
                 "(train.max_skipped_steps = %lld); checkpoint %s holds the last good state (after step %lld). "
                 "Lower train.lr, or raise train.warmup_steps or train.grad_clip.\n",
                 static_cast<long long>(last.consecutive_skips), static_cast<long long>(cfg.train.max_skipped_steps),
                 ck.c_str(), static_cast<long long>(trainer.last_update_step()));
    return status;
  }
  if (stop) {
    std::fprintf(stderr,
                 "stp train: %s: stopped after step %lld; checkpoint %s (continue with --set train.resume=%s); exit "
                 "status %d\n",
                 stp::tools::stop_signal_name(stop), static_cast<long long>(trainer.steps_done()), ck.c_str(),
                 ck.c_str(), status);
    return status;
  }
  const std::int64_t steps = trainer.steps_done();
  std::string losses;
  if (trainer.steps_done() == first) losses = "no step was trained";
  else if (!last_trained) losses = "every step was skipped (loss or gradient not finite)";
  else {
    losses = stp::str("loss ", fixed4(*first_loss), " -> ", fixed4(last_trained->loss));
    if (last_trained->step != steps) losses += stp::str(" (step ", last_trained->step, ")");
    if (skipped > 0) losses += stp::str("; ", skipped, skipped == 1 ? " step" : " steps", " skipped");
  }
  std::fprintf(stderr, "stp train: done, %lld step%s; %s; checkpoint %s; metrics %s\n", static_cast<long long>(steps),
               steps == 1 ? "" : "s", losses.c_str(), ck.c_str(), (dir / "metrics.jsonl").c_str());
  return 0;
}

stp::tools::Run define(CLI::App& app) {
  auto args = std::make_shared<stp::tools::ConfigArgs>();
  stp::tools::add_config_args(app, *args);
  app.footer(
      "Writes output.dir/metrics.jsonl, config.yaml, checkpoints and (output.trace) trace.json. SIGINT "
      "(Ctrl-C), SIGTERM and SIGHUP finish the step, write a checkpoint and exit with status 130, 143 and "
      "129; a second signal exits at once. After train.max_skipped_steps consecutive non-finite steps it "
      "writes the last good state and exits with status 5; a state that is not finite is never written: the "
      "run stops with status 5 and names the last good checkpoint.");
  return [args] { return run(*args); };
}

}  // namespace

static const stp::tools::Command kCmd{"train", "train; writes output.dir/metrics.jsonl", &define};
