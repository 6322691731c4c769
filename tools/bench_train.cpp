// Schedule benchmark on the CPU backend: the tiny model (configs/tiny.yaml) with tp 2, pp 2,
// m = 8 under 1f1b-i, zb-v and stp. For each schedule it traces one measured step and prints
//   * measured: step time, pipeline span, and per rank the exposed TP-communication time (all-reduce
//     time during which compute was idle) and the pipeline bubble (span - busy - exposed TP);
//   * predicted: the simulator (schedule/simulator.h) with T_F, T_B, T_W, T_AR, T_P2P calibrated
//     from the same trace, and the prediction error of the span.
// The TP link is emulated (parallel.tp_link_bandwidth) so all-reduces cost time as on a real
// interconnect; shared-memory reductions alone would be nearly free.
// Usage: build/bench_train [--tp-link BYTES_PER_S] [--steps N] [--config PATH]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/json.h"
#include "core/trace.h"
#include "schedule/simulator.h"
#include "schedule/validator.h"
#include "train/trainer.h"

namespace {

struct Interval {
  double a, b;
};

// Total length of the union of intervals.
double union_length(std::vector<Interval> v) {
  std::sort(v.begin(), v.end(), [](auto& x, auto& y) { return x.a < y.a; });
  double total = 0, cur_a = 0, cur_b = -1;
  for (auto& i : v) {
    if (i.a > cur_b) {
      if (cur_b > cur_a) total += cur_b - cur_a;
      cur_a = i.a, cur_b = i.b;
    } else {
      cur_b = std::max(cur_b, i.b);
    }
  }
  if (cur_b > cur_a) total += cur_b - cur_a;
  return total;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Measured {
  double span = 0, busy = 0, tp_exposed = 0, bubble = 0;
};

struct Calibration {
  stp::sched::Costs costs;
  std::vector<Measured> ranks;  // per pp rank (TP rank 0)
  double span = 0;              // longest rank span
};

std::string part_of(const stp::TraceSpan& s) {
  if (s.args_json.empty()) return "";
  auto j = stp::Json::parse(s.args_json);
  return j.contains("part") ? j["part"].as_string() : "";
}

Calibration analyse(const std::vector<stp::TraceSpan>& spans, double since_us, int tp, int pp) {
  Calibration out;
  std::map<std::string, double> f_sum, b_sum, w_sum;  // per (rank, part): summed unit time
  std::vector<double> ar, p2p;
  std::map<std::string, int> ar_per_part;
  for (int g = 0; g < tp * pp; g += tp) {  // TP rank 0 of each pp rank
    std::vector<Interval> compute, comm;
    double first = 1e300, last = 0;
    for (const auto& s : spans) {
      if (s.pid != g || s.ts_us < since_us) continue;
      Interval iv{s.ts_us, s.ts_us + s.dur_us};
      std::string key = std::to_string(g) + ":" + part_of(s);
      if (s.tid == "compute" && (s.category == "F" || s.category == "B" || s.category == "W")) {
        compute.push_back(iv);
        first = std::min(first, iv.a), last = std::max(last, iv.b);
        (s.category == "F" ? f_sum : s.category == "B" ? b_sum : w_sum)[key] += s.dur_us;
      } else if (s.tid == "tp-comm") {
        comm.push_back(iv);
        ar.push_back(s.dur_us);
        ar_per_part[key]++;
      } else if (s.tid == "p2p" && s.name.rfind("send", 0) == 0) {
        p2p.push_back(s.dur_us);
      }
    }
    Measured m;
    m.span = last - first;
    m.busy = union_length(compute);
    std::vector<Interval> both = compute;
    both.insert(both.end(), comm.begin(), comm.end());
    m.tp_exposed = union_length(both) - m.busy;
    m.bubble = m.span - m.busy - m.tp_exposed;
    out.ranks.push_back(m);
    out.span = std::max(out.span, m.span);
  }
  auto mean = [](const std::map<std::string, double>& v) {
    double s = 0;
    for (auto& [k, x] : v) s += x;
    return v.empty() ? 0.0 : s / static_cast<double>(v.size());
  };
  std::vector<double> ars_per_part;
  for (auto& [k, n] : ar_per_part) ars_per_part.push_back(n);
  out.costs.tf = mean(f_sum) / 1e3;  // ms
  out.costs.tb = mean(b_sum) / 1e3;
  out.costs.tw = mean(w_sum) / 1e3;
  out.costs.units = std::max(1, static_cast<int>(median(ars_per_part)));
  out.costs.tar = median(ar) * out.costs.units / 1e3;  // per chunk-pass, like tf
  out.costs.tp2p = median(p2p) / 1e3;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  double tp_link = 64e6;  // bytes/s: ~ T_AR comparable to a unit's compute for this model
  int steps = 3;
  std::string config = "configs/tiny.yaml";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tp-link")) tp_link = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--config")) config = argv[i + 1];
  }
  std::printf("bench_train: %s, tp 2, pp 2, m 8, emulated TP link %.0f MB/s, median of %d measured steps\n",
              config.c_str(), tp_link / 1e6, steps);
  std::printf("%-7s | %8s | %-29s | %-29s | %-29s | calibrated costs per chunk (ms)\n", "", "step", "span ms meas / pred (err)",
              "exposed TP ms/rank meas/pred", "PP bubble ms/rank meas/pred");
  for (const char* name : {"1f1b-i", "zb-v", "stp"}) {
    stp::Config cfg = stp::load_config(config, {std::string("parallel.schedule=") + name, "parallel.tp=2", "parallel.pp=2",
                                                "train.microbatches=8", "output.trace=true", "output.dir=runs/bench-train",
                                                "parallel.tp_link_bandwidth=" + std::to_string(tp_link)});
    stp::Trainer t(cfg);
    t.step();  // warm-up
    std::vector<double> step_ms, span_meas, span_pred, tp_meas, tp_pred, bub_meas, bub_pred;
    stp::sched::Costs costs;
    for (int s = 0; s < steps; ++s) {
      double since = t.trace()->now_us();
      step_ms.push_back(t.step().step_ms);
      Calibration c = analyse(t.trace()->spans(), since, 2, 2);
      auto sched = stp::sched::generate(name, 2, 8);
      auto sim = stp::sched::simulate(sched, c.costs);
      span_meas.push_back(c.span);
      span_pred.push_back(sim.makespan * 1e3);
      double tm = 0, tpd = 0, bm = 0, bp = 0;
      for (int r = 0; r < 2; ++r) {
        tm += c.ranks[static_cast<std::size_t>(r)].tp_exposed / 2;
        bm += c.ranks[static_cast<std::size_t>(r)].bubble / 2;
        tpd += sim.ranks[static_cast<std::size_t>(r)].tp_exposed * 1e3 / 2;
        bp += sim.ranks[static_cast<std::size_t>(r)].pp_bubble * 1e3 / 2;
      }
      tp_meas.push_back(tm), tp_pred.push_back(tpd), bub_meas.push_back(bm), bub_pred.push_back(bp);
      costs = c.costs;
    }
    double sm = median(span_meas) / 1e3, sp = median(span_pred) / 1e3;
    std::printf("%-7s | %6.1fms | %7.1f / %7.1f (%+5.1f%%)     | %7.1f / %7.1f             | %7.1f / %7.1f             | "
                "F %.2f B %.2f W %.2f AR %.2f P2P %.3f (units %d)\n",
                name, median(step_ms), sm, sp, 100.0 * (sp - sm) / sm, median(tp_meas) / 1e3, median(tp_pred) / 1e3,
                median(bub_meas) / 1e3, median(bub_pred) / 1e3, costs.tf, costs.tb, costs.tw, costs.tar, costs.tp2p,
                costs.units);
  }
  std::printf("(step = wall time of a whole step incl. data upload, clipping and AdamW; span = first to last compute "
              "unit of a rank in that step, what the simulator predicts)\n");
  return 0;
}
