// The visual language of stp's timeline pictures, shared by `stp sim --svg` (render_svg.cpp) and
// `stp profile --svg` (profile/render_svg.h), so a measured timeline reads like the paper-style
// schedule figure: colour by chunk (blue: chunk 0, orange: chunk 1) and pass (light F, medium B,
// dark W), braided blocks as an outlined box over their interleaved units, labels in the
// paper's notation ("5", "5&4", "9&w", "7+8", "4*"), black/white ink chosen per fill.
#pragma once

#include <string>

#include "schedule/op.h"

namespace stp::sched::svg {

const char* fill(int chunk, Pass pass);  // the unit colour of `pass` of local chunk `chunk`
const char* ink(Pass pass);              // text colour readable on fill(·, pass)

std::string num(double v);  // coordinates: 2 decimals
// <rect> with a fill (or "none") and extra attributes (e.g. " stroke=\"#222\"").
std::string rect(double x, double y, double w, double h, const char* fill, const char* extra = "");
std::string text(double x, double y, double size, const std::string& s, const char* extra = "");
// The paper's label of an op: microbatch numbers, "5&amp;4" for F&B, "9&amp;w" for F&W, "7+8"
// for F+F; a trailing * marks a deferred W. `visible_chars` receives its length on screen.
std::string op_label(const Op& op, double* visible_chars = nullptr);
// A time axis from x0 (time 0) over `length` time units at `scale` px per unit, at height y,
// with ticks at 1/2/5 × 10^k and `unit` written at its end.
std::string axis(double x0, double y, double length, double scale, const std::string& unit);
// Legend swatches F/B/W × chunk 0/1 from (x, y); returns the x after them.
double pass_legend(std::string& out, double x, double y);

}  // namespace stp::sched::svg
