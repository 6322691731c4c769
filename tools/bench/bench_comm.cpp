// Communication volume per step and rank, by kind (TP, PP, DP, other), measured on the CPU backend
// next to the analytic formula of train/comm_volume.h, for a few dp × pp × tp layouts of a small
// GPT-2 (or CONFIG.yaml with --set overrides). Weak-scaling time is meaningless on a 2-core CPU,
// the bytes are exact: a row whose measurement differs from the formula is marked "MISMATCH" and
// the exit status is 1.
//
//   build/bench_comm                          # the built-in layouts
//   build/bench_comm CONFIG.yaml [--set K=V]  # one config
//   build/bench_comm --help
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "config/config.h"
#include "base/error.h"
#include "tools/cli/cli.h"
#include "tools/cli/config_args.h"
#include "train/comm_volume.h"
#include "train/trainer.h"

namespace {

const char* kBase = R"(
model: {arch: gpt2, n_layer: 8, n_head: 4, n_embd: 64, vocab_size: 256, seq_len: 32}
data: {path: /usr/share/games/fortunes, format: text, sampling: sequential}
train: {steps: 2, micro_batch_size: 2, microbatches: 8, lr_schedule: constant, warmup_steps: 0, grad_clip: 1.0}
parallel: {backend: cpu, schedule: stp, cpu_threads: 2}
memory: {offload: none, recompute: none, device_budget: null}
)";

// Runs two steps and prints the second (the first includes nothing extra, but steady state is the point).
bool report(const stp::Config& cfg) {
  stp::Trainer trainer(cfg);
  trainer.step();
  auto before = trainer.comm_bytes();
  trainer.step();
  auto after = trainer.comm_bytes();
  std::printf("\n%s dp=%d pp=%d tp=%d m=%d B=%d T=%d C=%d L=%d V=%d dp_bucket=%s\n", cfg.parallel.schedule.c_str(),
              cfg.parallel.dp, cfg.parallel.pp, cfg.parallel.tp, cfg.train.microbatches, cfg.train.micro_batch_size,
              cfg.model.seq_len, cfg.model.n_embd, cfg.model.n_layer, cfg.model.vocab_size,
              cfg.parallel.dp_bucket ? stp::format_bytes(*cfg.parallel.dp_bucket).c_str() : "null");
  std::printf("%5s  %12s %12s  %12s %12s  %12s %12s  %10s %10s\n", "rank", "TP", "formula", "PP", "formula", "DP",
              "formula", "other", "formula");
  bool ok = true;
  for (std::size_t i = 0; i < after.size(); ++i) {
    const stp::CommBytes& a = after[i];
    const stp::CommBytes& b = before[i];
    stp::CommVolume f = stp::expected_comm_bytes(cfg, a.global);
    std::uint64_t tp = a.tp - b.tp, pp = a.pp - b.pp, dp = a.dp - b.dp, other = a.other - b.other;
    bool row = tp == f.tp && pp == f.pp && dp == f.dp && other == f.other;
    ok = ok && row;
    std::printf("%5d  %12llu %12llu  %12llu %12llu  %12llu %12llu  %10llu %10llu%s\n", a.global,
                static_cast<unsigned long long>(tp), static_cast<unsigned long long>(f.tp),
                static_cast<unsigned long long>(pp), static_cast<unsigned long long>(f.pp),
                static_cast<unsigned long long>(dp), static_cast<unsigned long long>(f.dp),
                static_cast<unsigned long long>(other), static_cast<unsigned long long>(f.other),
                row ? "" : "  MISMATCH");
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Bytes sent per step per rank by kind (TP, PP, DP, other), measured next to the analytic formula "
      "(exit status 1 on a mismatch), for built-in dp x pp x tp layouts or one CONFIG.yaml.",
      "bench_comm"};
  stp::tools::init_cli(app);
  stp::tools::ConfigArgs args;
  stp::tools::add_config_args(app, args, /*config_required=*/false);
  app.get_option("--set")->needs("CONFIG.yaml");
  if (auto status = stp::tools::parse_cli(app, argc, argv)) return *status;
  return stp::tools::run_main(app, [&] {
    std::vector<stp::Config> configs;
    if (!args.config_path.empty()) {
      configs.push_back(stp::load_config(args.config_path, args.overrides));
    } else {
      for (auto [dp, pp, tp, schedule] : std::vector<std::tuple<int, int, int, const char*>>{{4, 1, 1, "gpipe"},
                                                                                             {2, 2, 1, "1f1b"},
                                                                                             {1, 2, 2, "stp"},
                                                                                             {2, 1, 2, "gpipe"},
                                                                                             {2, 2, 2, "stp"},
                                                                                             {2, 2, 1, "1f1b-i"}}) {
        configs.push_back(stp::load_config_from_string(
            kBase, "bench_comm",
            {"parallel.dp=" + std::to_string(dp), "parallel.pp=" + std::to_string(pp),
             "parallel.tp=" + std::to_string(tp), std::string("parallel.schedule=") + schedule}));
      }
    }
    std::printf("bytes sent per step per rank (Communicator::bytes_sent; an all-reduce counts its buffer once)\n");
    bool ok = true;
    for (const auto& c : configs) ok = report(c) && ok;
    std::printf("\n%s\n", ok ? "every measurement equals its formula" : "MISMATCH between measurement and formula");
    return ok ? 0 : 1;
  });
}
