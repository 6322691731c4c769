#include "profile/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "base/error.h"
#include "base/json_number.h"
#include "profile/calibrate.h"

namespace stp::profile {

namespace {

// Times and bytes per step; fractions and rates are ratios and stay as they are.
RankTimes per_step(RankTimes m) {
  if (m.steps <= 1) return m;
  double n = m.steps;
  for (double* v : {&m.step_ms, &m.span_ms, &m.busy_ms, &m.tp_ms, &m.tp_exposed_ms, &m.p2p_ms, &m.p2p_exposed_ms,
                    &m.bubble_ms, &m.p2p_wait_ms, &m.copy_stall_ms, &m.issue_gap_ms, &m.d2h_bytes, &m.h2d_bytes,
                    &m.d2h_ms, &m.h2d_ms, &m.copy_ms, &m.copy_hidden_ms})
    *v /= n;
  for (double& v : m.lane_busy_ms) v /= n;
  return m;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string fmt(const char* f, const std::string& v) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, v.c_str());
  return buf;
}

std::string mib(double bytes) { return fmt("%.1f MiB", bytes / (1024.0 * 1024.0)); }

// A JSON number: integers exactly, others with 15 significant digits.
nlohmann::ordered_json num(double v) { return json_number(v, 15); }

std::string steps_text(const std::vector<std::int64_t>& steps) {
  if (steps.empty()) return "none";
  if (steps.size() == 1) return str("step ", steps[0]);
  bool contiguous = steps.back() - steps.front() + 1 == static_cast<std::int64_t>(steps.size());
  if (contiguous) return str("steps ", steps.front(), "-", steps.back());
  std::string s = "steps ";
  for (std::size_t i = 0; i < steps.size(); ++i) s += (i ? "," : "") + std::to_string(steps[i]);
  return s;
}

// The per-step times of a rank (or the total), keys in the documented order.
void times_json(nlohmann::ordered_json& o, const RankTimes& t) {
  o["steps"] = t.steps;
  o["step_ms"] = num(t.step_ms);
  o["span_ms"] = num(t.span_ms);
  o["busy_ms"] = num(t.busy_ms);
  o["compute_busy_fraction"] = num(t.busy_fraction());
  o["pp_bubble_ms"] = num(t.bubble_ms);
  o["p2p_wait_ms"] = num(t.p2p_wait_ms);
  o["copy_stall_ms"] = num(t.copy_stall_ms);
  o["issue_gap_ms"] = num(t.issue_gap_ms);
  o["tp_comm_ms"] = num(t.tp_ms);
  o["tp_exposed_ms"] = num(t.tp_exposed_ms);
  o["p2p_ms"] = num(t.p2p_ms);
  o["p2p_exposed_ms"] = num(t.p2p_exposed_ms);
  o["d2h_bytes"] = num(t.d2h_bytes);
  o["h2d_bytes"] = num(t.h2d_bytes);
  o["d2h_gbps"] = num(t.d2h_gbps());
  o["h2d_gbps"] = num(t.h2d_gbps());
  o["copy_hidden_fraction"] = num(t.copy_hidden_fraction());
  nlohmann::ordered_json streams = nlohmann::ordered_json::object();
  for (int l = 0; l < kLanes - 1; ++l)
    streams[to_string(static_cast<Lane>(l))] = num(t.lane_busy_ms[static_cast<std::size_t>(l)]);
  o["streams"] = std::move(streams);
}

nlohmann::ordered_json versus_json(const Versus& v) {
  return {{"measured", num(v.measured)}, {"predicted", num(v.predicted)}};
}

}  // namespace

Report measure_run(const Trace& trace, const std::vector<RankTimeline>& ranks, const StepFilter& filter) {
  Report r;
  std::set<std::int64_t> all, analysed;
  for (const RankTimeline& rank : ranks)
    for (const StepWindow& w : rank.steps) {
      all.insert(w.step);
      if (filter.covers(w.step)) analysed.insert(w.step);
    }
  r.steps.assign(analysed.begin(), analysed.end());
  r.steps_in_trace = static_cast<std::int64_t>(all.size());
  for (const RankTimeline& rank : ranks) {
    r.ranks.push_back(measure(rank, filter));
    r.memory.push_back(memory_report(trace, rank, filter));
  }
  return r;
}

std::string render_text(const Report& r) {
  std::string o = str("stp profile ", r.run, ": ", r.ranks.size(), " rank(s), ", steps_text(r.steps), " of ",
                      r.steps_in_trace, " traced; per step, in ms\n\n");
  o += "rank |   step |   span | busy          | bubble = p2p wait + copy stall + issue gap | TP comm (exposed) | P2P "
       "(exposed)\n";
  RankTimes total;
  auto row = [&](const std::string& name, const RankTimes& t) {
    o += str(fmt("%-4s", name), " | ", fmt("%6.1f", t.step_ms), " | ", fmt("%6.1f", t.span_ms), " | ",
             fmt("%6.1f", t.busy_ms), fmt(" (%3.0f%%)", 100 * t.busy_fraction()), " | ", fmt("%6.1f", t.bubble_ms),
             " = ", fmt("%6.1f", t.p2p_wait_ms), " + ", fmt("%6.1f", t.copy_stall_ms), " + ",
             fmt("%6.1f", t.issue_gap_ms), "              | ", fmt("%6.1f", t.tp_ms), fmt(" (%6.1f)", t.tp_exposed_ms),
             "   | ", fmt("%6.1f", t.p2p_ms), fmt(" (%5.1f)", t.p2p_exposed_ms), "\n");
  };
  for (const RankTimes& t : r.ranks) {
    RankTimes p = per_step(t);
    row(std::to_string(t.pid), p);
    total += p;
  }
  total.steps = 1;
  if (r.ranks.size() > 1) row("all", total);
  o += "(busy %: of the span, first op start to last op end; issue gap: compute idle with nothing in flight — the host "
       "had not enqueued the next work)\n";

  bool copies = total.d2h_bytes > 0 || total.h2d_bytes > 0;
  if (copies) {
    o += "\noffload | D2H MiB    GB/s | H2D MiB    GB/s | copy hidden under compute | compute stalled on copies\n";
    for (const RankTimes& t : r.ranks) {
      RankTimes p = per_step(t);
      o += str(fmt("%-7s", std::to_string(t.pid)), " | ", fmt("%7.1f", p.d2h_bytes / 1048576.0),
               fmt(" %7.2f", p.d2h_gbps()), " | ", fmt("%7.1f", p.h2d_bytes / 1048576.0), fmt(" %7.2f", p.h2d_gbps()),
               " | ", fmt("%24.0f%%", 100 * p.copy_hidden_fraction()), " | ", fmt("%22.1f ms", p.copy_stall_ms), "\n");
    }
  } else {
    o += "\noffload: no D2H/H2D copies in the trace\n";
  }

  o += "\nmemory | peak device (trace) | metrics.jsonl | peak pinned live | high-water moments (live bytes by "
       "category)\n";
  for (std::size_t i = 0; i < r.memory.size(); ++i) {
    const MemoryReport& m = r.memory[i];
    int pid = r.ranks[i].pid;
    std::string metric = "-";
    if (r.has_metrics && pid >= 0 && static_cast<std::size_t>(pid) < r.metrics.peak_device_bytes.size())
      metric = mib(r.metrics.peak_device_bytes[static_cast<std::size_t>(pid)]);
    o += str(fmt("%-6s", std::to_string(pid)), " | ",
             fmt("%19s", m.has_device ? mib(m.peak_device) : std::string("no counters")), " | ", fmt("%13s", metric),
             " | ", fmt("%16s", m.has_pinned ? mib(m.peak_pinned) : std::string("-")), " |");
    for (std::size_t k = 0; k < m.high_water.size(); ++k) {
      const MemoryMoment& h = m.high_water[k];
      o += str(k ? "\n       |                     |               |                  |" : "", " ", mib(h.total),
               h.step >= 0 ? str(" at ", fmt("%.1f", h.into_step_ms), " ms of step ", h.step)
                           : std::string(" outside steps"),
               h.op.empty() ? std::string() : str(" during ", h.op), ":");
      for (const auto& [cat, bytes] : h.by_category)
        if (bytes > 0) o += str(" ", cat, " ", mib(bytes));
    }
    o += "\n";
  }
  if (r.has_metrics)
    o += str("pinned host pool (metrics.jsonl, all devices): ", mib(r.metrics.peak_host_pinned_bytes), "\n");

  if (r.has_prediction) {
    const Prediction& p = r.prediction;
    const sched::Costs& c = p.calibration.costs;
    o += str("\nprediction: the simulator with costs calibrated from this trace (", p.calibration.steps, " step(s), ",
             p.calibration.parts, " parts, ", p.calibration.all_reduces, " all-reduces, ", p.calibration.messages,
             " waited-for messages); ask what another schedule gives with\n  stp sim --schedule ", r.schedule, " --pp ",
             r.pp, " --microbatches ", r.microbatches, " ", sim_flags(c), "\n");
    if (p.calibration.d2h_gbps > 0 || p.calibration.h2d_gbps > 0)
      o += str("  copy bandwidth: D2H ", fmt("%.2f", p.calibration.d2h_gbps), " GB/s, H2D ",
               fmt("%.2f", p.calibration.h2d_gbps), " GB/s (memory.link_bandwidth on the CPU backend)\n");
    o += "                      measured  predicted   error\n";
    auto line = [&](const std::string& what, const Versus& v) {
      o += str(fmt("  %-18s", what), fmt(" %9.1f", v.measured), fmt("  %9.1f", v.predicted),
               fmt("  %+5.1f%%", 100 * v.error()), "\n");
    };
    line("makespan ms", p.makespan);
    for (const RankVersus& rp : p.ranks) {
      line(str("pp rank ", rp.rank, " span"), rp.span);
      line("  busy + issue", rp.busy);
      line("  TP exposed", rp.tp_exposed);
      line("  bubble", rp.bubble);
    }
    if (!r.planned_peak_device.empty()) {
      o += "  peak device memory: measured (trace) vs the memory planner's dry run (stp plan)\n";
      for (std::size_t i = 0; i < r.memory.size() && i < r.planned_peak_device.size(); ++i) {
        Versus v{r.memory[i].peak_device, r.planned_peak_device[i]};
        o += str(fmt("  rank %-13s", std::to_string(r.ranks[i].pid)), " ", fmt("%9s", mib(v.measured)), "  ",
                 fmt("%9s", mib(v.predicted)), fmt("  %+5.1f%%", 100 * v.error()), "\n");
      }
    }
  }
  for (const std::string& n : r.notes) o += "note: " + n + "\n";
  return o;
}

std::string render_json(const Report& r) {
  using nlohmann::ordered_json;
  ordered_json o;
  o["run"] = r.run;
  o["steps"] = r.steps;
  ordered_json ranks = ordered_json::array();
  RankTimes total;
  double peak = 0, pinned = 0;
  for (std::size_t i = 0; i < r.ranks.size(); ++i) {
    RankTimes p = per_step(r.ranks[i]);
    total += p;
    const MemoryReport& m = r.memory[i];
    peak = std::max(peak, m.peak_device);
    pinned += m.peak_pinned;
    ordered_json rank;
    rank["rank"] = r.ranks[i].pid;
    times_json(rank, p);
    rank["peak_device_bytes"] = num(m.peak_device);
    rank["peak_pinned_bytes"] = num(m.peak_pinned);
    ordered_json high_water = ordered_json::array();
    for (const MemoryMoment& h : m.high_water) {
      ordered_json by_category = ordered_json::object();
      for (const auto& [category, bytes] : h.by_category) by_category[category] = num(bytes);
      high_water.push_back({{"step", h.step},
                            {"time_ms", num(h.ts_us * 1e-3)},
                            {"into_step_ms", num(h.into_step_ms)},
                            {"bytes", num(h.total)},
                            {"op", h.op},
                            {"by_category", std::move(by_category)}});
    }
    rank["high_water"] = std::move(high_water);
    ranks.push_back(std::move(rank));
  }
  o["ranks"] = std::move(ranks);
  total.steps = r.ranks.empty() ? 0 : per_step(r.ranks[0]).steps;
  ordered_json t;
  times_json(t, total);
  t["peak_device_bytes"] = num(peak);
  t["peak_pinned_bytes"] = num(pinned);
  o["total"] = std::move(t);
  if (r.has_metrics) {
    ordered_json peaks = ordered_json::array(), step_ms = ordered_json::array();
    for (double b : r.metrics.peak_device_bytes) peaks.push_back(num(b));
    for (double ms : r.metrics.step_ms) step_ms.push_back(num(ms));
    o["metrics"] = {{"peak_device_bytes", std::move(peaks)},
                    {"peak_host_pinned_bytes", num(r.metrics.peak_host_pinned_bytes)},
                    {"step_ms", std::move(step_ms)}};
  }
  if (r.has_prediction) {
    const Prediction& p = r.prediction;
    const sched::Costs& c = p.calibration.costs;
    ordered_json pr;
    pr["schedule"] = r.schedule;
    pr["pp"] = r.pp;
    pr["tp"] = r.tp;
    pr["microbatches"] = r.microbatches;
    pr["costs"] = {{"tf", num(c.tf)},   {"tb", num(c.tb)},     {"tw", num(c.tw)},
                   {"tar", num(c.tar)}, {"tp2p", num(c.tp2p)}, {"units", c.units}};
    pr["sim_flags"] = sim_flags(c);
    pr["d2h_gbps"] = num(p.calibration.d2h_gbps);
    pr["h2d_gbps"] = num(p.calibration.h2d_gbps);
    pr["makespan_ms"] = versus_json(p.makespan);
    ordered_json pranks = ordered_json::array();
    for (const RankVersus& rp : p.ranks)
      pranks.push_back({{"rank", rp.rank},
                        {"span_ms", versus_json(rp.span)},
                        {"busy_ms", versus_json(rp.busy)},
                        {"tp_exposed_ms", versus_json(rp.tp_exposed)},
                        {"pp_bubble_ms", versus_json(rp.bubble)}});
    pr["ranks"] = std::move(pranks);
    ordered_json peaks = ordered_json::array();
    for (std::size_t i = 0; i < r.planned_peak_device.size() && i < r.memory.size(); ++i)
      peaks.push_back({{"rank", r.ranks[i].pid},
                       {"measured", num(r.memory[i].peak_device)},
                       {"predicted", num(r.planned_peak_device[i])}});
    pr["peak_device_bytes"] = std::move(peaks);
    o["predicted"] = std::move(pr);
  }
  o["notes"] = r.notes;
  return o.dump() + "\n";
}

}  // namespace stp::profile
