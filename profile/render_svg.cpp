#include "profile/render_svg.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>

#include "base/error.h"
#include "base/trace_names.h"
#include "profile/overlap.h"
#include "schedule/op.h"
#include "schedule/svg_style.h"

namespace stp::profile {

namespace {

namespace svg = sched::svg;
using svg::num;
using svg::rect;

constexpr double kLeft = 112, kTop = 54, kWidth = 1400, kRight = 24;
constexpr double kCompute = 26, kLane = 7, kLaneGap = 1, kMemory = 34, kRankGap = 16;
constexpr double kBlock = kCompute + 4 * (kLane + kLaneGap) + 3 + kMemory + kRankGap;

const char* const kCategoryFill[] = {"#d9d9d9", "#b3b3b3", "#8c8c8c", "#9e9ac8", "#dadaeb"};
const auto& kCategoryName = trace::kMemorySeries;  // the memory tracks' series, kCategoryFill's order
constexpr const char* kSend = "#525252";
constexpr const char* kRecv = "#cccccc";
constexpr const char* kD2H = "#1b9e77";
constexpr const char* kH2D = "#66c2a5";
constexpr const char* kPeak = "#cb181d";

std::string one(double v) {  // one decimal
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

int category_index(const std::string& name) {
  for (int i = 0; i < 5; ++i)
    if (name == kCategoryName[i]) return i;
  return 4;  // anything unknown draws with buffers
}

// The chunk and pass of a part string ("F0.3", "B1.4*", "W1.2"); false if it is not one.
bool part_of(const std::string& part, int& chunk, sched::Pass& pass) {
  if (part.empty()) return false;
  try {
    sched::Op op = sched::parse_op(part);
    if (op.braided()) return false;
    chunk = op.a.chunk;
    pass = op.a.pass;
    return true;
  } catch (const Error&) {
    return false;
  }
}

struct Frame {
  double t0 = 0, t1 = 1, scale = 1;  // µs window and px per µs
  double x(double t) const { return kLeft + (std::clamp(t, t0, t1) - t0) * scale; }
  double w(double a, double b) const { return x(b) - x(a); }
};

std::string lane_label(double y, double h, const char* name) {
  return svg::text(kLeft - 6, y + h / 2 + 3, 8, name, " text-anchor=\"end\" fill=\"#777\"");
}

std::string compute_row(const Trace& trace, const RankTimeline& r, const Frame& f, double y) {
  std::string out = rect(kLeft, y, kWidth, kCompute, "#f2f2f2");
  out += lane_label(y, kCompute, to_string(Lane::Compute));
  for (const Span* u : r.units()) {
    if (u->end <= f.t0 || u->ts >= f.t1) continue;
    int chunk = 0;
    sched::Pass pass = u->kind == Kind::F ? sched::Pass::F : u->kind == Kind::B ? sched::Pass::B : sched::Pass::W;
    sched::Pass ignored;
    part_of(trace.str(u->part), chunk, ignored);
    out += rect(f.x(u->ts), y, f.w(u->ts, u->end), kCompute, svg::fill(chunk, pass),
                " stroke=\"#fff\" stroke-width=\"0.3\"");
  }
  for (const Span* op : r.ops) {
    if (op->end <= f.t0 || op->ts >= f.t1) continue;
    double x = f.x(op->ts), w = f.w(op->ts, op->end);
    out += rect(x, y, w, kCompute, "none", " stroke=\"#222\" stroke-width=\"0.7\"");
    sched::Op parsed;
    try {
      parsed = sched::parse_op(trace.str(op->name));
    } catch (const Error&) {
      continue;
    }
    double visible = 0;
    std::string label = svg::op_label(parsed, &visible);
    double font = std::min(10.0, w / (0.6 * visible + 0.3));
    if (font < 4.5) continue;
    // Black on a white halo: an op's box is partly idle (waiting on all-reduces), so no single
    // fill colour lies under its label.
    out += svg::text(x + w / 2, y + kCompute / 2 + font * 0.35, font, label,
                     " text-anchor=\"middle\" fill=\"#000\" stroke=\"#fff\" stroke-width=\"2\" paint-order=\"stroke\"");
  }
  return out;
}

std::string thin_row(const Trace& trace, const std::vector<const Span*>& spans, Lane lane, const Frame& f, double y,
                     const char* name) {
  std::string out = rect(kLeft, y, kWidth, kLane, "#f7f7f7");
  out += lane_label(y, kLane, name);
  for (const Span* s : spans) {
    if (s->end <= f.t0 || s->ts >= f.t1) continue;
    const char* colour = "#999";
    if (lane == Lane::TpComm) {
      int chunk = 0;
      sched::Pass pass = sched::Pass::F;
      if (part_of(trace.str(s->part), chunk, pass)) colour = svg::fill(chunk, pass);
    } else if (lane == Lane::P2p) {
      bool send = trace.str(s->name).rfind(trace::span::kSend, 0) == 0;
      colour = send ? kSend : kRecv;
    } else if (lane == Lane::D2h) {
      colour = kD2H;
    } else if (lane == Lane::H2d) {
      colour = kH2D;
    }
    double w = std::max(f.w(s->ts, s->end), 0.6);  // a 20 µs send stays visible
    out += rect(f.x(s->ts), y, w, kLane, colour, " stroke=\"#fff\" stroke-width=\"0.3\"");
  }
  return out;
}

// Stacked live bytes by category, one column per 2 px (the sample with the largest total in it),
// and the peak of the frame marked.
std::string memory_row(const Trace& trace, const RankTimeline& r, const Frame& f, double y, double max_bytes) {
  std::string out = rect(kLeft, y, kWidth, kMemory, "#fbfbfb");
  out += lane_label(y, kMemory, "memory");
  if (r.device_memory.empty() || max_bytes <= 0) return out;
  constexpr int kColumns = static_cast<int>(kWidth / 2);
  std::vector<const Counter*> most(kColumns, nullptr), last(kColumns, nullptr);
  const Counter* before = nullptr;  // the value in force when the frame starts
  const Counter* peak = nullptr;
  auto larger = [&](const Counter* a, const Counter* b) {
    return !a || (b && trace.total(*b) > trace.total(*a)) ? b : a;
  };
  for (const Counter* c : r.device_memory) {
    if (c->ts < f.t0) {
      before = c;
      continue;
    }
    if (c->ts >= f.t1) break;
    int i = std::min(kColumns - 1, static_cast<int>((c->ts - f.t0) * f.scale / 2));
    most[i] = larger(most[i], c);
    last[i] = c;
    peak = larger(peak, c);
  }
  // A column shows the largest value held in it: its own samples' and the one carried into it.
  std::vector<const Counter*> col(kColumns, nullptr);
  const Counter* held = before;
  for (int i = 0; i < kColumns; ++i) {
    col[i] = larger(held, most[i]);
    if (last[i]) held = last[i];
  }
  // Category values per column.
  std::vector<std::array<double, 5>> v(kColumns);
  for (int i = 0; i < kColumns; ++i) {
    v[i].fill(0);
    if (!col[i]) continue;
    for (std::uint32_t k = col[i]->begin; k < col[i]->end; ++k)
      v[i][category_index(trace.str(trace.values[k].first))] += trace.values[k].second;
  }
  double h = kMemory - 2;
  auto yof = [&](double bytes) { return y + kMemory - h * std::min(1.0, bytes / max_bytes); };
  // One polygon per category: its upper edge left to right, then its lower edge back, as step
  // functions; a run of columns at the same height is one segment (constant categories stay small).
  auto edge = [&](const std::vector<double>& heights) {
    std::vector<std::pair<double, double>> pts;  // (x, y) corners
    for (int i = 0; i < kColumns; ++i) {
      double x0 = kLeft + 2 * i;
      if (i == 0 || heights[i] != heights[i - 1]) {
        if (i > 0) pts.push_back({x0, yof(heights[i - 1])});
        pts.push_back({x0, yof(heights[i])});
      }
    }
    pts.push_back({kLeft + kWidth, yof(heights[kColumns - 1])});
    return pts;
  };
  std::vector<double> below(kColumns, 0.0), top(kColumns, 0.0);
  for (int c = 0; c < 5; ++c) {
    bool any = false;
    for (int i = 0; i < kColumns; ++i) {
      top[i] = below[i] + v[i][c];
      any = any || v[i][c] > 0;
    }
    if (any) {
      std::string points;
      for (const auto& [x, yy] : edge(top)) points += one(x) + "," + one(yy) + " ";
      auto lower = edge(below);
      for (auto it = lower.rbegin(); it != lower.rend(); ++it) points += one(it->first) + "," + one(it->second) + " ";
      out += str("<polygon points=\"", points, "\" fill=\"", kCategoryFill[c], "\"/>\n");
    }
    below = top;
  }
  out += svg::text(kLeft + 3, y + 8, 7, one(max_bytes / 1048576.0) + " MiB", " fill=\"#777\"");
  if (peak) {
    double px = f.x(peak->ts), py = yof(trace.total(*peak));
    out += str("<line x1=\"", num(px), "\" y1=\"", num(y), "\" x2=\"", num(px), "\" y2=\"", num(y + kMemory),
               "\" stroke=\"", kPeak, "\" stroke-width=\"0.8\"/>\n");
    out += str("<circle cx=\"", num(px), "\" cy=\"", num(py), "\" r=\"2\" fill=\"", kPeak, "\"/>\n");
    std::string label = str("peak ", one(trace.total(*peak) / 1048576.0), " MiB");
    bool right = px < kLeft + kWidth - 90;
    out += svg::text(right ? px + 4 : px - 4, y + 9, 8.5, label,
                     str(" fill=\"", kPeak, "\"", right ? "" : " text-anchor=\"end\"").c_str());
  }
  return out;
}

std::string legend(double y, double max_bytes) {
  std::string out;
  double x = svg::pass_legend(out, kLeft, y);
  for (int i = 0; i < 4; ++i) out += rect(x + i * 6, y, 6, 12, svg::fill(1, i % 2 ? sched::Pass::B : sched::Pass::F));
  out += rect(x, y, 24, 12, "none", " stroke=\"#222\" stroke-width=\"0.6\"");
  out += svg::text(x + 29, y + 10, 11, "braided block (5&amp;4: F of mb 5 with B of mb 4; * = W deferred)");
  double y2 = y + 20;
  double x2 = kLeft;
  auto swatch = [&](const char* colour, const std::string& name) {
    out += rect(x2, y2, 16, 8, colour, " stroke=\"#222\" stroke-width=\"0.4\"");
    out += svg::text(x2 + 21, y2 + 8, 11, name);
    x2 += 30 + 6.2 * static_cast<double>(name.size());
  };
  swatch(svg::fill(0, sched::Pass::F), "TP all-reduce (colour of its part)");
  swatch(kSend, "P2P send");
  swatch(kRecv, "P2P receive (incl. wait)");
  swatch(kD2H, "D2H offload");
  swatch(kH2D, "H2D reload");
  for (int c = 0; c < 5; ++c) swatch(kCategoryFill[c], kCategoryName[c]);
  out += svg::text(x2, y2 + 8, 11, str("(memory rows: 0 to ", one(max_bytes / 1048576.0), " MiB)"), " fill=\"#444\"");
  return out;
}

}  // namespace

std::string render_timeline_svg(const Trace& trace, const std::vector<RankTimeline>& ranks, std::int64_t step,
                                const std::string& title, int tp) {
  // The frame: the step's first compute unit to its last, over all ranks.
  Frame f;
  f.t0 = 1e300, f.t1 = -1e300;
  std::vector<const StepWindow*> windows;
  for (const RankTimeline& r : ranks) {
    const StepWindow* w = nullptr;
    for (const StepWindow& s : r.steps)
      if (s.step == step) w = &s;
    windows.push_back(w);
    if (!w) continue;
    Interval e = pipeline_extent(r, *w);
    if (e.b > e.a) f.t0 = std::min(f.t0, e.a), f.t1 = std::max(f.t1, e.b);
  }
  STP_CHECK(f.t0 < f.t1, "step ", step, " has no compute spans to draw");
  f.scale = kWidth / (f.t1 - f.t0);
  double max_bytes = 0;
  for (const RankTimeline& r : ranks)
    for (const Counter* c : r.device_memory)
      if (c->ts < f.t1) max_bytes = std::max(max_bytes, trace.total(*c));

  const double axis_y = kTop + static_cast<double>(ranks.size()) * kBlock;
  const double height = axis_y + 84;
  std::string out = str("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", num(kLeft + kWidth + kRight),
                        "\" height=\"", num(height), "\" font-family=\"Helvetica, Arial, sans-serif\">\n");
  out += rect(0, 0, kLeft + kWidth + kRight, height, "#ffffff");
  out += svg::text(kLeft, 24, 15, title, " font-weight=\"bold\"");
  // Summary of the step: busy share and exposed communication per rank (overlap.h).
  StepFilter only;
  only.first = only.last = step;
  double busy = 0, span = 0, tp_exposed = 0, bubble = 0;
  for (const RankTimeline& r : ranks) {
    RankTimes m = measure(r, only);
    busy += m.busy_ms, span += m.span_ms, tp_exposed += m.tp_exposed_ms, bubble += m.bubble_ms;
  }
  double n = std::max<double>(1, static_cast<double>(ranks.size()));
  out += svg::text(kLeft + kWidth, 24, 11,
                   str("makespan ", one((f.t1 - f.t0) * 1e-3), " ms; mean per rank: compute busy ",
                       one(span > 0 ? 100 * busy / span : 0), "% of its span, TP exposed ", one(tp_exposed / n),
                       " ms, bubble ", one(bubble / n), " ms"),
                   " text-anchor=\"end\" fill=\"#444\"");
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const RankTimeline& r = ranks[i];
    double y = kTop + static_cast<double>(i) * kBlock;
    out += svg::text(kLeft - 48, y + kCompute / 2 + 2, 12, str("rank ", r.pid),
                     " font-weight=\"bold\" text-anchor=\"end\"");
    if (tp > 0)
      out += svg::text(kLeft - 48, y + kCompute / 2 + 14, 9, str("pp ", r.pid / tp, " · tp ", r.pid % tp),
                       " text-anchor=\"end\" fill=\"#555\"");
    out += compute_row(trace, r, f, y);
    double yl = y + kCompute + 2;
    const std::pair<Lane, const char*> thin[] = {
        {Lane::TpComm, "TP"}, {Lane::P2p, "P2P"}, {Lane::D2h, "D2H"}, {Lane::H2d, "H2D"}};
    for (const auto& [lane, name] : thin) {
      out += thin_row(trace, r.lane(lane), lane, f, yl, name);
      yl += kLane + kLaneGap;
    }
    out += memory_row(trace, r, f, yl + 1, max_bytes);
  }
  out += svg::axis(kLeft, axis_y, (f.t1 - f.t0) * 1e-3, f.scale * 1e3, "ms");
  out += legend(axis_y + 40, max_bytes);
  return out + "</svg>\n";
}

}  // namespace stp::profile
