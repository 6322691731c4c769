#include "profile/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "base/error.h"
#include "base/trace.h"
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

std::string num(double v) {  // JSON number: integers exactly, others with 6 decimals
  if (!std::isfinite(v)) return "0";
  if (v == std::floor(v) && std::fabs(v) < 9e15) return fmt("%.0f", v);
  return fmt("%.15g", v);
}

std::string steps_text(const std::vector<std::int64_t>& steps) {
  if (steps.empty()) return "none";
  if (steps.size() == 1) return str("step ", steps[0]);
  bool contiguous = steps.back() - steps.front() + 1 == static_cast<std::int64_t>(steps.size());
  if (contiguous) return str("steps ", steps.front(), "-", steps.back());
  std::string s = "steps ";
  for (std::size_t i = 0; i < steps.size(); ++i) s += (i ? "," : "") + std::to_string(steps[i]);
  return s;
}

void times_json(std::string& o, const RankTimes& t) {
  o += "\"steps\":" + std::to_string(t.steps) + ",\"step_ms\":" + num(t.step_ms) + ",\"span_ms\":" + num(t.span_ms) +
       ",\"busy_ms\":" + num(t.busy_ms) + ",\"compute_busy_fraction\":" + num(t.busy_fraction()) +
       ",\"pp_bubble_ms\":" + num(t.bubble_ms) + ",\"p2p_wait_ms\":" + num(t.p2p_wait_ms) +
       ",\"copy_stall_ms\":" + num(t.copy_stall_ms) + ",\"issue_gap_ms\":" + num(t.issue_gap_ms) +
       ",\"tp_comm_ms\":" + num(t.tp_ms) + ",\"tp_exposed_ms\":" + num(t.tp_exposed_ms) + ",\"p2p_ms\":" + num(t.p2p_ms) +
       ",\"p2p_exposed_ms\":" + num(t.p2p_exposed_ms) + ",\"d2h_bytes\":" + num(t.d2h_bytes) +
       ",\"h2d_bytes\":" + num(t.h2d_bytes) + ",\"d2h_gbps\":" + num(t.d2h_gbps()) + ",\"h2d_gbps\":" + num(t.h2d_gbps()) +
       ",\"copy_hidden_fraction\":" + num(t.copy_hidden_fraction()) + ",\"streams\":{";
  for (int l = 0; l < kLanes - 1; ++l)
    o += str(l ? "," : "", "\"", to_string(static_cast<Lane>(l)), "\":", num(t.lane_busy_ms[static_cast<std::size_t>(l)]));
  o += "}";
}

void versus_json(std::string& o, const char* key, const Versus& v) {
  o += str(",\"", key, "\":{\"measured\":", num(v.measured), ",\"predicted\":", num(v.predicted), "}");
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
  o += "rank |   step |   span | busy          | bubble = p2p wait + copy stall + issue gap | TP comm (exposed) | P2P (exposed)\n";
  RankTimes total;
  auto row = [&](const std::string& name, const RankTimes& t) {
    o += str(fmt("%-4s", name), " | ", fmt("%6.1f", t.step_ms), " | ", fmt("%6.1f", t.span_ms), " | ",
             fmt("%6.1f", t.busy_ms), fmt(" (%3.0f%%)", 100 * t.busy_fraction()), " | ", fmt("%6.1f", t.bubble_ms), " = ",
             fmt("%6.1f", t.p2p_wait_ms), " + ", fmt("%6.1f", t.copy_stall_ms), " + ", fmt("%6.1f", t.issue_gap_ms),
             "              | ", fmt("%6.1f", t.tp_ms), fmt(" (%6.1f)", t.tp_exposed_ms), "   | ", fmt("%6.1f", t.p2p_ms),
             fmt(" (%5.1f)", t.p2p_exposed_ms), "\n");
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
      o += str(fmt("%-7s", std::to_string(t.pid)), " | ", fmt("%7.1f", p.d2h_bytes / 1048576.0), fmt(" %7.2f", p.d2h_gbps()), " | ",
               fmt("%7.1f", p.h2d_bytes / 1048576.0), fmt(" %7.2f", p.h2d_gbps()), " | ",
               fmt("%24.0f%%", 100 * p.copy_hidden_fraction()), " | ", fmt("%22.1f ms", p.copy_stall_ms), "\n");
    }
  } else {
    o += "\noffload: no D2H/H2D copies in the trace\n";
  }

  o += "\nmemory | peak device (trace) | metrics.jsonl | peak pinned live | high-water moments (live bytes by category)\n";
  for (std::size_t i = 0; i < r.memory.size(); ++i) {
    const MemoryReport& m = r.memory[i];
    int pid = r.ranks[i].pid;
    std::string metric = "-";
    if (r.has_metrics && pid >= 0 && static_cast<std::size_t>(pid) < r.metrics.peak_device_bytes.size())
      metric = mib(r.metrics.peak_device_bytes[static_cast<std::size_t>(pid)]);
    o += str(fmt("%-6s", std::to_string(pid)), " | ", fmt("%19s", m.has_device ? mib(m.peak_device) : std::string("no counters")), " | ",
             fmt("%13s", metric), " | ", fmt("%16s", m.has_pinned ? mib(m.peak_pinned) : std::string("-")), " |");
    for (std::size_t k = 0; k < m.high_water.size(); ++k) {
      const MemoryMoment& h = m.high_water[k];
      o += str(k ? "\n       |                     |               |                  |" : "", " ", mib(h.total),
               h.step >= 0 ? str(" at ", fmt("%.1f", h.into_step_ms), " ms of step ", h.step) : std::string(" outside steps"),
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
    for (const RankPrediction& rp : p.ranks) {
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
  std::string o = "{\"run\":\"" + json_escape(r.run) + "\",\"steps\":[";
  for (std::size_t i = 0; i < r.steps.size(); ++i) o += (i ? "," : "") + std::to_string(r.steps[i]);
  o += "],\"ranks\":[";
  RankTimes total;
  double peak = 0, pinned = 0;
  for (std::size_t i = 0; i < r.ranks.size(); ++i) {
    RankTimes p = per_step(r.ranks[i]);
    total += p;
    const MemoryReport& m = r.memory[i];
    peak = std::max(peak, m.peak_device);
    pinned += m.peak_pinned;
    o += str(i ? "," : "", "{\"rank\":", r.ranks[i].pid, ",");
    times_json(o, p);
    o += ",\"peak_device_bytes\":" + num(m.peak_device) + ",\"peak_pinned_bytes\":" + num(m.peak_pinned) + ",\"high_water\":[";
    for (std::size_t k = 0; k < m.high_water.size(); ++k) {
      const MemoryMoment& h = m.high_water[k];
      o += str(k ? "," : "", "{\"step\":", h.step, ",\"time_ms\":", num(h.ts_us * 1e-3), ",\"into_step_ms\":", num(h.into_step_ms), ",\"bytes\":", num(h.total),
               ",\"op\":\"", json_escape(h.op), "\",\"by_category\":{");
      for (std::size_t c = 0; c < h.by_category.size(); ++c)
        o += str(c ? "," : "", "\"", json_escape(h.by_category[c].first), "\":", num(h.by_category[c].second));
      o += "}}";
    }
    o += "]}";
  }
  total.steps = r.ranks.empty() ? 0 : per_step(r.ranks[0]).steps;
  o += "],\"total\":{";
  times_json(o, total);
  o += ",\"peak_device_bytes\":" + num(peak) + ",\"peak_pinned_bytes\":" + num(pinned) + "}";
  if (r.has_metrics) {
    o += ",\"metrics\":{\"peak_device_bytes\":[";
    for (std::size_t i = 0; i < r.metrics.peak_device_bytes.size(); ++i) o += (i ? "," : "") + num(r.metrics.peak_device_bytes[i]);
    o += "],\"peak_host_pinned_bytes\":" + num(r.metrics.peak_host_pinned_bytes) + ",\"step_ms\":[";
    for (std::size_t i = 0; i < r.metrics.step_ms.size(); ++i) o += (i ? "," : "") + num(r.metrics.step_ms[i]);
    o += "]}";
  }
  if (r.has_prediction) {
    const Prediction& p = r.prediction;
    const sched::Costs& c = p.calibration.costs;
    o += str(",\"predicted\":{\"schedule\":\"", json_escape(r.schedule), "\",\"pp\":", r.pp, ",\"tp\":", r.tp,
             ",\"microbatches\":", r.microbatches, ",\"costs\":{\"tf\":", num(c.tf), ",\"tb\":", num(c.tb), ",\"tw\":",
             num(c.tw), ",\"tar\":", num(c.tar), ",\"tp2p\":", num(c.tp2p), ",\"units\":", c.units, "},\"sim_flags\":\"",
             sim_flags(c), "\",\"d2h_gbps\":", num(p.calibration.d2h_gbps), ",\"h2d_gbps\":", num(p.calibration.h2d_gbps));
    versus_json(o, "makespan_ms", p.makespan);
    o += ",\"ranks\":[";
    for (std::size_t i = 0; i < p.ranks.size(); ++i) {
      const RankPrediction& rp = p.ranks[i];
      o += str(i ? "," : "", "{\"rank\":", rp.rank);
      versus_json(o, "span_ms", rp.span);
      versus_json(o, "busy_ms", rp.busy);
      versus_json(o, "tp_exposed_ms", rp.tp_exposed);
      versus_json(o, "pp_bubble_ms", rp.bubble);
      o += "}";
    }
    o += "],\"peak_device_bytes\":[";
    for (std::size_t i = 0; i < r.planned_peak_device.size() && i < r.memory.size(); ++i)
      o += str(i ? "," : "", "{\"rank\":", r.ranks[i].pid, ",\"measured\":", num(r.memory[i].peak_device),
               ",\"predicted\":", num(r.planned_peak_device[i]), "}");
    o += "]}";
  }
  o += ",\"notes\":[";
  for (std::size_t i = 0; i < r.notes.size(); ++i) o += str(i ? "," : "", "\"", json_escape(r.notes[i]), "\"");
  return o + "]}\n";
}

}  // namespace stp::profile
