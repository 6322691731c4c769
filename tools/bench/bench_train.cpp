// Schedule benchmark on the CPU backend: the tiny model (configs/tiny.yaml) with tp 2, pp 2,
// m = 8 under 1f1b-i, zb-v and stp. For each schedule and repetition it runs one warm-up step and
// N traced steps, then prints, per step (means over the measured steps, docs/profile.md):
//   * measured: wall step time, makespan (first op start to last op end over all ranks), exposed
//     TP-communication time and pipeline bubble per rank, and the issue gaps (compute idle with
//     nothing in flight: host launch overhead, large when 4 emulated devices share 2 cores);
//   * predicted: the simulator (schedule/simulator.h) with costs calibrated from the same trace by
//     profile/calibrate.h — the calibration `stp profile` prints — and the makespan error.
// With --repeat R each schedule runs R times (a fresh trainer each) and the last block prints the
// medians over the repetitions, since the machine's noise moves single runs by several percent.
// The TP link is emulated (parallel.tp_link_bandwidth) so all-reduces cost time as on a real
// interconnect; shared-memory reductions alone would be nearly free.
// Usage: build/bench_train [--tp-link BYTES_PER_S] [--steps N] [--repeat R] [--config PATH]   (or --help)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "profile/calibrate.h"
#include "profile/overlap.h"
#include "profile/predict.h"
#include "profile/trace_reader.h"
#include "schedule/schedule.h"
#include "tools/cli/cli.h"
#include "train/trainer.h"

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct Run {
  double step_ms = 0, makespan_meas = 0, makespan_pred = 0, tp_meas = 0, tp_pred = 0, bub_meas = 0, bub_pred = 0,
         issue = 0;
  stp::sched::Costs costs;
  double error() const { return (makespan_pred - makespan_meas) / makespan_meas; }
};

Run run_once(const std::string& config, const char* name, double tp_link, int steps) {
  stp::Config cfg =
      stp::load_config(config, {std::string("parallel.schedule=") + name, "parallel.tp=2", "parallel.pp=2",
                                "train.microbatches=8", "output.trace=true", "output.dir=runs/bench-train",
                                "parallel.tp_link_bandwidth=" + std::to_string(tp_link)});
  stp::Trainer t(cfg);
  t.step();  // warm-up: step 1 is not measured
  std::vector<double> step_ms;
  for (int s = 0; s < steps; ++s) step_ms.push_back(t.step().step_ms);
  stp::profile::Trace trace = stp::profile::from_recorder(*t.trace());
  auto ranks = stp::profile::timelines(trace);
  stp::profile::StepFilter measured;
  measured.first = 2;
  auto sched = stp::sched::generate(name, 2, 8);
  stp::profile::Prediction p = stp::profile::predict(trace, ranks, sched, 2, measured);
  Run r;
  r.step_ms = median(step_ms);
  r.makespan_meas = p.makespan.measured;
  r.makespan_pred = p.makespan.predicted;
  for (const auto& rp : p.ranks) {
    r.tp_meas += rp.tp_exposed.measured / 2, r.tp_pred += rp.tp_exposed.predicted / 2;
    r.bub_meas += rp.bubble.measured / 2, r.bub_pred += rp.bubble.predicted / 2;
  }
  double issue = 0;
  int n = 0;
  for (const auto& rank : ranks) {
    auto m = stp::profile::measure(rank, measured);
    if (m.steps) issue += m.issue_gap_ms / m.steps, ++n;
  }
  r.issue = n ? issue / n : 0;
  r.costs = p.calibration.costs;
  return r;
}

void print(const char* name, const Run& r) {
  std::printf(
      "%-7s | %6.1f | %6.1f / %6.1f (%+5.1f%%) | %6.1f / %6.1f | %6.1f / %6.1f | %6.1f | F %.2f B %.2f W %.2f "
      "AR %.2f P2P %.2f (units %d)\n",
      name, r.step_ms, r.makespan_meas, r.makespan_pred, 100 * r.error(), r.tp_meas, r.tp_pred, r.bub_meas, r.bub_pred,
      r.issue, r.costs.tf, r.costs.tb, r.costs.tw, r.costs.tar, r.costs.tp2p, r.costs.units);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  double tp_link = 64e6;  // bytes/s: ~ T_AR comparable to a unit's compute for this model
  int steps = 3, repeat = 1;
  std::string config = "configs/tiny.yaml";
  CLI::App app{
      "Schedule benchmark on the CPU backend: 1f1b-i, zb-v and stp on the tiny job (tp 2, pp 2, m 8); "
      "measured step time, makespan, exposed TP time and bubble next to the simulator calibrated from "
      "the same trace.",
      "bench_train"};
  stp::tools::init_cli(app);
  app.add_option("--tp-link", tp_link, "emulated TP link (parallel.tp_link_bandwidth)")
      ->type_name("BYTES_PER_S")
      ->capture_default_str();
  app.add_option("--steps", steps, "measured steps per run, after one warm-up step")
      ->type_name("N")
      ->capture_default_str();
  app.add_option("--repeat", repeat, "runs per schedule (a fresh trainer each); more than 1 adds medians")
      ->type_name("R")
      ->capture_default_str();
  app.add_option("--config", config, "the job")->type_name("PATH")->capture_default_str();
  if (auto status = stp::tools::parse_cli(app, argc, argv)) return *status;
  return stp::tools::run_main(app, [&] {
    steps = std::max(steps, 1);
    repeat = std::max(repeat, 1);
    std::printf(
        "bench_train: %s, tp 2, pp 2, m 8, emulated TP link %.0f MB/s, %d measured steps after 1 warm-up, "
        "%d run(s) per schedule; ms per step\n",
        config.c_str(), tp_link / 1e6, steps, repeat);
    const char* header = "%-7s | %6s | %-25s | %-15s | %-15s | %6s | calibrated costs per chunk-pass (ms)\n";
    std::printf(header, "", "step", "makespan meas / pred (err)", "TP exp meas/pred", "bubble meas/pred", "issue");
    std::map<std::string, std::vector<Run>> runs;
    for (int k = 0; k < repeat; ++k)
      for (const char* name : {"1f1b-i", "zb-v", "stp"}) {
        runs[name].push_back(run_once(config, name, tp_link, steps));
        print(name, runs[name].back());
      }
    if (repeat > 1) {
      std::printf("medians over %d runs:\n", repeat);
      for (const char* name : {"1f1b-i", "zb-v", "stp"}) {
        const auto& v = runs[name];
        auto med = [&](auto field) {
          std::vector<double> x;
          for (const Run& r : v) x.push_back(field(r));
          return median(x);
        };
        Run m;
        m.step_ms = med([](const Run& r) { return r.step_ms; });
        m.makespan_meas = med([](const Run& r) { return r.makespan_meas; });
        m.makespan_pred = med([](const Run& r) { return r.makespan_pred; });
        m.tp_meas = med([](const Run& r) { return r.tp_meas; });
        m.tp_pred = med([](const Run& r) { return r.tp_pred; });
        m.bub_meas = med([](const Run& r) { return r.bub_meas; });
        m.bub_pred = med([](const Run& r) { return r.bub_pred; });
        m.issue = med([](const Run& r) { return r.issue; });
        m.costs = v.back().costs;
        double err = med([](const Run& r) { return r.error(); });
        print(name, m);
        std::printf("        median prediction error of the makespan: %+.1f%%\n", 100 * err);
      }
    }
    std::printf(
        "(step = wall time of a whole step incl. data upload, clipping and AdamW; makespan = first op start to "
        "last op end over all ranks, what the simulator predicts; TP exp and bubble per rank; the bubble excludes "
        "the issue gaps, which the calibration turns into per-op issue overheads, profile/calibrate.h)\n");
    return 0;
  });
}
