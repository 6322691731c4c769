// SVG renderer in the style of the paper's schedule figure: one row per rank, time to the right, colour by
// chunk (blue: chunk 0, orange: chunk 1) and pass (light F, medium B, dark W). A braided block is drawn as
// its interleaved compute units, so F&B shows alternating F/B(/W) stripes inside one outlined box; the TP
// all-reduces run in a thin lane under each row.
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "schedule/render.h"

namespace stp::sched {

namespace {

constexpr double kLeft = 64, kTop = 46, kWidth = 1400, kRow = 34, kLane = 7, kGap = 10;
const char* const kFill[2][3] = {{"#9ecae1", "#3182bd", "#08519c"}, {"#fdd0a2", "#fd8d3c", "#c44100"}};
const char* const kInk[3] = {"#1a1a1a", "#ffffff", "#ffffff"};

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

std::string rect(double x, double y, double w, double h, const char* fill, const char* extra = "") {
  return str("<rect x=\"", num(x), "\" y=\"", num(y), "\" width=\"", num(std::max(w, 0.0)), "\" height=\"", num(h),
             "\" fill=\"", fill, "\"", extra, "/>\n");
}

// The label the paper's figure uses: microbatch numbers, "5&4" for F&B, "9&w" for F&W, "7+8" for F+F; a
// trailing * marks a deferred W.
std::string label(const Op& op) {
  std::string l;
  switch (op.kind) {
    case OpKind::FB: l = str(op.a.mb, "&amp;", op.b.mb, op.b.defer_w ? "*" : ""); break;
    case OpKind::FW: l = str(op.a.mb, "&amp;w"); break;
    case OpKind::FF: l = str(op.a.mb, "+", op.b.mb); break;
    default: l = str(op.a.mb, op.a.defer_w ? "*" : "");
  }
  return l;
}

std::string draw_op(const Op& op, const OpTime& t, const Costs& c, double y, double scale) {
  std::string out;
  for (const Segment& seg : op_segments(op, c, t.start)) {
    const Part& p = op.part(seg.part);
    double x = kLeft + seg.start * scale, w = (seg.end - seg.start) * scale;
    int pass = static_cast<int>(seg.pass);
    // A thin white edge between units keeps the braid visible even where both parts share a colour (F+F).
    if (seg.stream == 0) out += rect(x, y, w, kRow, kFill[p.chunk % 2][pass], " stroke=\"#fff\" stroke-width=\"0.4\"");
    else out += rect(x, y + kRow + 1, w, kLane, kFill[p.chunk % 2][pass], " opacity=\"0.8\"");
  }
  double x = kLeft + t.start * scale, w = (t.end - t.start) * scale;
  out += rect(x, y, w, kRow, "none", " stroke=\"#222\" stroke-width=\"0.8\"");
  std::string l = label(op);
  double visible = static_cast<double>(l.size()) - (op.kind == OpKind::FB || op.kind == OpKind::FW ? 4 : 0);
  double font = std::min(11.0, w / (0.62 * visible + 0.2));
  if (font >= 5) {
    const char* ink = op.braided() ? "#000" : kInk[static_cast<int>(op.a.pass)];
    std::string halo = op.braided() ? " stroke=\"#fff\" stroke-width=\"2.2\" paint-order=\"stroke\"" : "";
    out += str("<text x=\"", num(x + w / 2), "\" y=\"", num(y + kRow / 2 + font * 0.35), "\" font-size=\"",
               num(font), "\" text-anchor=\"middle\" fill=\"", ink, "\"", halo, ">", l, "</text>\n");
  }
  return out;
}

std::string axis(double makespan, double scale, double y) {
  double step = std::pow(10.0, std::floor(std::log10(std::max(makespan, 1e-9) / 5)));
  if (makespan / step > 25) step *= 5;
  else if (makespan / step > 12) step *= 2;
  std::string out = str("<line x1=\"", num(kLeft), "\" y1=\"", num(y), "\" x2=\"", num(kLeft + makespan * scale),
                        "\" y2=\"", num(y), "\" stroke=\"#444\"/>\n");
  for (double t = 0; t <= makespan + 1e-9; t += step) {
    double x = kLeft + t * scale;
    out += str("<line x1=\"", num(x), "\" y1=\"", num(y), "\" x2=\"", num(x), "\" y2=\"", num(y + 4),
               "\" stroke=\"#444\"/><text x=\"", num(x), "\" y=\"", num(y + 15),
               "\" font-size=\"10\" text-anchor=\"middle\" fill=\"#444\">", format_number(t), "</text>\n");
  }
  return out + str("<text x=\"", num(kLeft + makespan * scale), "\" y=\"", num(y + 28),
                   "\" font-size=\"10\" text-anchor=\"end\" fill=\"#444\">time</text>\n");
}

std::string legend(double y) {
  static const char* kName[] = {"F", "B", "W"};
  std::string out;
  double x = kLeft;
  for (int c = 0; c < 2; ++c)
    for (int p = 0; p < 3; ++p) {
      out += rect(x, y, 16, 12, kFill[c][p], " stroke=\"#222\" stroke-width=\"0.6\"");
      out += str("<text x=\"", num(x + 21), "\" y=\"", num(y + 10), "\" font-size=\"11\">", kName[p], " chunk ", c,
                 "</text>\n");
      x += 92;
    }
  // A braided-block swatch: alternating F and B stripes of chunk 1 inside one outline.
  for (int i = 0; i < 4; ++i) out += rect(x + i * 6, y, 6, 12, kFill[1][i % 2]);
  out += rect(x, y, 24, 12, "none", " stroke=\"#222\" stroke-width=\"0.6\"");
  out += str("<text x=\"", num(x + 29), "\" y=\"", num(y + 10), "\" font-size=\"11\">braided block: 5&amp;4 = F of ",
             "mb 5 with B of mb 4, 9&amp;w = F with a deferred W, 7+8 = two F; * = W deferred; thin lane = TP ",
             "all-reduce</text>\n");
  return out;
}

}  // namespace

std::string render_svg(const Schedule& s, const SimResult& r, const Costs& c) {
  const double scale = r.makespan > 0 ? kWidth / r.makespan : 1;
  const double row_h = kRow + kLane + kGap;
  const double axis_y = kTop + s.pp * row_h;
  const double height = axis_y + 72;
  std::string out = str("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", num(kLeft + kWidth + 24),
                        "\" height=\"", num(height), "\" font-family=\"Helvetica, Arial, sans-serif\">\n");
  out += rect(0, 0, kLeft + kWidth + 24, height, "#ffffff");
  out += str("<text x=\"", num(kLeft), "\" y=\"26\" font-size=\"15\" font-weight=\"bold\">", s.name, ": p = ", s.pp,
             ", m = ", s.microbatches, "</text><text x=\"", num(kLeft + kWidth), "\" y=\"26\" font-size=\"11\" ",
             "text-anchor=\"end\" fill=\"#444\">T_F ", format_number(c.tf), ", T_B ", format_number(c.tb), ", T_W ",
             format_number(c.tw), ", T_AR ", format_number(c.tar), ", T_P2P ", format_number(c.tp2p),
             "; makespan ", format_number(r.makespan), "</text>\n");
  for (int k = 0; k < s.pp; ++k) {
    double y = kTop + k * row_h;
    out += rect(kLeft, y, r.makespan * scale, kRow, "#f2f2f2");
    out += str("<text x=\"", num(kLeft - 8), "\" y=\"", num(y + kRow / 2 + 4), "\" font-size=\"12\" ",
               "text-anchor=\"end\">rank ", k, "</text>\n");
    for (std::size_t i = 0; i < s.ranks[k].size(); ++i) out += draw_op(s.ranks[k][i], r.times[k][i], c, y, scale);
  }
  out += axis(r.makespan, scale, axis_y);
  out += legend(axis_y + 40);
  return out + "</svg>\n";
}

}  // namespace stp::sched
