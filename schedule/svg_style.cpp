#include "schedule/svg_style.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "base/error.h"
#include "schedule/render.h"

namespace stp::sched::svg {

namespace {
const char* const kFill[2][3] = {{"#9ecae1", "#3182bd", "#08519c"}, {"#fdd0a2", "#fd8d3c", "#c44100"}};
const char* const kInk[3] = {"#1a1a1a", "#ffffff", "#ffffff"};
}  // namespace

const char* fill(int chunk, Pass pass) { return kFill[chunk % 2][static_cast<int>(pass)]; }
const char* ink(Pass pass) { return kInk[static_cast<int>(pass)]; }

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

std::string rect(double x, double y, double w, double h, const char* fill_colour, const char* extra) {
  return str("<rect x=\"", num(x), "\" y=\"", num(y), "\" width=\"", num(std::max(w, 0.0)), "\" height=\"", num(h),
             "\" fill=\"", fill_colour, "\"", extra, "/>\n");
}

std::string text(double x, double y, double size, const std::string& s, const char* extra) {
  return str("<text x=\"", num(x), "\" y=\"", num(y), "\" font-size=\"", num(size), "\"", extra, ">", s, "</text>\n");
}

std::string op_label(const Op& op, double* visible_chars) {
  std::string l;
  switch (op.kind) {
    case OpKind::FB: l = str(op.a.mb, "&amp;", op.b.mb, op.b.defer_w ? "*" : ""); break;
    case OpKind::FW: l = str(op.a.mb, "&amp;w"); break;
    case OpKind::FF: l = str(op.a.mb, "+", op.b.mb); break;
    default: l = str(op.a.mb, op.a.defer_w ? "*" : "");
  }
  if (visible_chars)
    *visible_chars = static_cast<double>(l.size()) - (op.kind == OpKind::FB || op.kind == OpKind::FW ? 4 : 0);
  return l;
}

std::string axis(double x0, double y, double length, double scale, const std::string& unit) {
  double step = std::pow(10.0, std::floor(std::log10(std::max(length, 1e-9) / 5)));
  if (length / step > 25) step *= 5;
  else if (length / step > 12) step *= 2;
  std::string out = str("<line x1=\"", num(x0), "\" y1=\"", num(y), "\" x2=\"", num(x0 + length * scale), "\" y2=\"",
                        num(y), "\" stroke=\"#444\"/>\n");
  for (double t = 0; t <= length + 1e-9; t += step) {
    double x = x0 + t * scale;
    out += str("<line x1=\"", num(x), "\" y1=\"", num(y), "\" x2=\"", num(x), "\" y2=\"", num(y + 4),
               "\" stroke=\"#444\"/><text x=\"", num(x), "\" y=\"", num(y + 15),
               "\" font-size=\"10\" text-anchor=\"middle\" fill=\"#444\">", format_number(t), "</text>\n");
  }
  return out + str("<text x=\"", num(x0 + length * scale), "\" y=\"", num(y + 28),
                   "\" font-size=\"10\" text-anchor=\"end\" fill=\"#444\">", unit, "</text>\n");
}

double pass_legend(std::string& out, double x, double y) {
  static const char* kName[] = {"F", "B", "W"};
  for (int c = 0; c < 2; ++c)
    for (int p = 0; p < 3; ++p) {
      out += rect(x, y, 16, 12, kFill[c][p], " stroke=\"#222\" stroke-width=\"0.6\"");
      out += text(x + 21, y + 10, 11, str(kName[p], " chunk ", c));
      x += 92;
    }
  return x;
}

}  // namespace stp::sched::svg
