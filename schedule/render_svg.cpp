// SVG renderer in the style of the paper's schedule figure (schedule/svg_style.h): one row per rank, time to
// the right, colour by chunk and pass. A braided block is drawn as its interleaved compute units, so F&B shows
// alternating F/B(/W) stripes inside one outlined box; the TP all-reduces run in a thin lane under each row.
#include <cmath>
#include <cstdio>

#include "base/error.h"
#include "schedule/render.h"
#include "schedule/svg_style.h"

namespace stp::sched {

namespace {

using svg::num;
using svg::rect;

constexpr double kLeft = 64, kTop = 46, kWidth = 1400, kRow = 34, kLane = 7, kGap = 10;

std::string draw_op(const Op& op, const OpTime& t, const Costs& c, double y, double scale) {
  std::string out;
  for (const Segment& seg : op_segments(op, c, t.start)) {
    const Part& p = op.part(seg.part);
    double x = kLeft + seg.start * scale, w = (seg.end - seg.start) * scale;
    // A thin white edge between units keeps the braid visible even where both parts share a colour (F+F).
    if (seg.stream == 0)
      out += rect(x, y, w, kRow, svg::fill(p.chunk, seg.pass), " stroke=\"#fff\" stroke-width=\"0.4\"");
    else out += rect(x, y + kRow + 1, w, kLane, svg::fill(p.chunk, seg.pass), " opacity=\"0.8\"");
  }
  double x = kLeft + t.start * scale, w = (t.end - t.start) * scale;
  out += rect(x, y, w, kRow, "none", " stroke=\"#222\" stroke-width=\"0.8\"");
  double visible = 0;
  std::string l = svg::op_label(op, &visible);
  double font = std::min(11.0, w / (0.62 * visible + 0.2));
  if (font >= 5) {
    const char* ink = op.braided() ? "#000" : svg::ink(op.a.pass);
    std::string halo = op.braided() ? " stroke=\"#fff\" stroke-width=\"2.2\" paint-order=\"stroke\"" : "";
    out += str("<text x=\"", num(x + w / 2), "\" y=\"", num(y + kRow / 2 + font * 0.35), "\" font-size=\"", num(font),
               "\" text-anchor=\"middle\" fill=\"", ink, "\"", halo, ">", l, "</text>\n");
  }
  return out;
}

std::string legend(double y) {
  std::string out;
  double x = svg::pass_legend(out, kLeft, y);
  // A braided-block swatch: alternating F and B stripes of chunk 1 inside one outline.
  for (int i = 0; i < 4; ++i) out += rect(x + i * 6, y, 6, 12, svg::fill(1, i % 2 ? Pass::B : Pass::F));
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
  std::string out = str("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", num(kLeft + kWidth + 24), "\" height=\"",
                        num(height), "\" font-family=\"Helvetica, Arial, sans-serif\">\n");
  out += rect(0, 0, kLeft + kWidth + 24, height, "#ffffff");
  out += str("<text x=\"", num(kLeft), "\" y=\"26\" font-size=\"15\" font-weight=\"bold\">", s.name, ": p = ", s.pp,
             ", m = ", s.microbatches, "</text><text x=\"", num(kLeft + kWidth), "\" y=\"26\" font-size=\"11\" ",
             "text-anchor=\"end\" fill=\"#444\">T_F ", format_number(c.tf), ", T_B ", format_number(c.tb), ", T_W ",
             format_number(c.tw), ", T_AR ", format_number(c.tar), ", T_P2P ", format_number(c.tp2p), "; makespan ",
             format_number(r.makespan), "</text>\n");
  for (int k = 0; k < s.pp; ++k) {
    double y = kTop + k * row_h;
    out += rect(kLeft, y, r.makespan * scale, kRow, "#f2f2f2");
    out += str("<text x=\"", num(kLeft - 8), "\" y=\"", num(y + kRow / 2 + 4), "\" font-size=\"12\" ",
               "text-anchor=\"end\">rank ", k, "</text>\n");
    for (std::size_t i = 0; i < s.ranks[k].size(); ++i) out += draw_op(s.ranks[k][i], r.times[k][i], c, y, scale);
  }
  out += svg::axis(kLeft, axis_y, r.makespan, scale, "time");
  out += legend(axis_y + 40);
  return out + "</svg>\n";
}

}  // namespace stp::sched
