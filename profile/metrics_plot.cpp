#include "profile/metrics_plot.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/json_fields.h"
#include "profile/metrics_lines.h"
#include "schedule/svg_style.h"

namespace stp::profile {

using nlohmann::json;

namespace {

const char* const kNames[] = {"loss", "val_loss", "lr", "tokens_per_s", "peak_device_mib"};

// A number, or nothing for null / absent.
bool value_of(const json& j, const char* key, double& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return false;
  STP_CHECK(it->is_number(), "\"", key, "\" must be a number or null, not ", it->dump());
  out = it->get<double>();
  return std::isfinite(out);
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

// A value label: `digits` significant digits, plain or exponent form.
std::string label(double v, int digits) {
  char buf[48];
  const bool exponent = std::fabs(v) != 0 && (std::fabs(v) < 1e-2 || std::fabs(v) >= 1e6);
  std::snprintf(buf, sizeof buf, exponent ? "%.*e" : "%.*g", exponent ? digits - 1 : digits, v);
  return buf;
}

// The labels of an axis's values: 4 significant digits, or as many more as it takes to tell every
// value apart (a loss that moves in its fifth digit), so that no label repeats.
std::vector<std::string> value_labels(const std::vector<double>& values) {
  std::vector<std::string> out;
  for (int digits = 4; digits <= 17; ++digits) {
    out.clear();
    for (double v : values) out.push_back(label(v, digits));
    if (std::set<std::string>(out.begin(), out.end()).size() == out.size()) break;
  }
  return out;
}

// The step ticks of [lo, hi]: whole steps 1, 2 or 5 times a power of ten apart, at most six, so
// that no two ticks round to the same step.
std::vector<double> step_ticks(double lo, double hi) {
  double unit = 1;
  for (double decade = 1; (hi - lo) / unit > 5; decade *= 10)
    for (double m : {1.0, 2.0, 5.0})
      if ((hi - lo) / (unit = m * decade) <= 5) break;
  std::vector<double> out;
  for (double t = std::ceil(lo / unit) * unit; t <= hi; t += unit) out.push_back(t);
  return out;
}

}  // namespace

std::vector<PlotSeries> read_plot_series(const std::string& path, int* cut_line) {
  std::map<std::int64_t, json> by_step;  // the last line of each step
  const int cut = read_metrics_lines(path, [&](json& j) {
    const std::int64_t step = json_int(j, "step");
    by_step[step] = std::move(j);
  });
  if (cut_line) *cut_line = cut;
  STP_CHECK(!by_step.empty(), "'", path, "' has no logged step",
            cut ? str(" (its only line, line ", cut, ", is cut: the run stopped while writing it)") : std::string());
  std::vector<PlotSeries> out;
  for (const char* name : kNames) out.push_back({name, {}});
  for (const auto& [step, j] : by_step) {
    double x = static_cast<double>(step), v = 0;
    try {
      for (int i = 0; i < 4; ++i)
        if (value_of(j, kNames[i], v)) out[static_cast<std::size_t>(i)].points.emplace_back(x, v);
      auto peaks = j.find("peak_device_bytes");
      if (peaks != j.end() && peaks->is_array() && !peaks->empty()) {
        double top = 0;
        for (const json& b : *peaks) {
          STP_CHECK(b.is_number(), "\"peak_device_bytes\" must hold numbers, not ", b.dump());
          top = std::max(top, b.get<double>());
        }
        out[4].points.emplace_back(x, top / (1024.0 * 1024.0));
      }
    } catch (const Error& e) {
      throw Error(str("'", path, "' step ", step, ": ", e.what()));
    }
  }
  return out;
}

std::string render_metrics_svg(const std::vector<PlotSeries>& series, const std::string& title) {
  using sched::svg::num;
  struct Panel {
    const char* heading;
    std::vector<const PlotSeries*> lines;
  };
  auto find = [&](const std::string& name) -> const PlotSeries* {
    for (const auto& s : series)
      if (s.name == name) return &s;
    return nullptr;
  };
  std::vector<Panel> panels = {{"loss (blue) and val_loss (orange)", {find("loss"), find("val_loss")}},
                               {"learning rate", {find("lr")}},
                               {"throughput, tokens/s", {find("tokens_per_s")}},
                               {"peak device memory, MiB (largest device)", {find("peak_device_mib")}}};
  const char* colours[] = {"#1f77b4", "#ff7f0e"};
  double x_min = 1e300, x_max = -1e300;
  for (const auto& s : series)
    for (auto [x, y] : s.points) {
      x_min = std::min(x_min, x);
      x_max = std::max(x_max, x);
    }
  if (x_min > x_max) x_min = x_max = 1;
  if (x_max == x_min) x_min -= 0.5, x_max += 0.5;  // one step: in the middle, its own tick

  const double W = 1000, left = 90, right = 30, top = 50, panel_h = 170, gap = 50;
  const double plot_w = W - left - right;
  const double H = top + panels.size() * (panel_h + gap) + 10;
  std::string o;
  o += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(W) + "\" height=\"" + num(H) + "\" viewBox=\"0 0 " +
       num(W) + " " + num(H) + "\" font-family=\"sans-serif\">\n";
  o += "<rect x=\"0\" y=\"0\" width=\"" + num(W) + "\" height=\"" + num(H) + "\" fill=\"white\"/>\n";
  o += "<text x=\"" + num(left) + "\" y=\"28\" font-size=\"16\">" + escape(title) + "</text>\n";
  for (std::size_t p = 0; p < panels.size(); ++p) {
    const double y0 = top + static_cast<double>(p) * (panel_h + gap);
    double lo = 1e300, hi = -1e300;
    for (const PlotSeries* s : panels[p].lines)
      if (s)
        for (auto [x, y] : s->points) {
          lo = std::min(lo, y);
          hi = std::max(hi, y);
        }
    if (lo > hi) lo = hi = 0;
    if (hi == lo) {
      hi += std::max(1e-12, std::fabs(hi) * 0.05);
      lo -= std::max(1e-12, std::fabs(lo) * 0.05);
    }
    auto px = [&](double x) { return left + (x - x_min) / (x_max - x_min) * plot_w; };
    auto py = [&](double y) { return y0 + panel_h - (y - lo) / (hi - lo) * panel_h; };
    o += "<g class=\"panel\">\n";
    o += "<text x=\"" + num(left) + "\" y=\"" + num(y0 - 8) + "\" font-size=\"13\">" + escape(panels[p].heading) +
         "</text>\n";
    o += "<rect x=\"" + num(left) + "\" y=\"" + num(y0) + "\" width=\"" + num(plot_w) + "\" height=\"" + num(panel_h) +
         "\" fill=\"#fafafa\" stroke=\"#999\"/>\n";
    std::vector<double> values;
    for (int k = 0; k <= 4; ++k) values.push_back(lo + (hi - lo) * k / 4.0);
    const std::vector<std::string> labels = value_labels(values);
    for (std::size_t k = 0; k < values.size(); ++k) {  // horizontal grid with value labels
      const double v = values[k];
      o += "<line x1=\"" + num(left) + "\" x2=\"" + num(left + plot_w) + "\" y1=\"" + num(py(v)) + "\" y2=\"" +
           num(py(v)) + "\" stroke=\"#e3e3e3\"/>\n";
      o += "<text x=\"" + num(left - 6) + "\" y=\"" + num(py(v) + 4) + "\" font-size=\"11\" text-anchor=\"end\">" +
           labels[k] + "</text>\n";
    }
    for (double x : step_ticks(x_min, x_max)) {
      char step[32];
      std::snprintf(step, sizeof step, "%.0f", x);
      o += "<text x=\"" + num(px(x)) + "\" y=\"" + num(y0 + panel_h + 15) +
           "\" font-size=\"11\" text-anchor=\"middle\">" + step + "</text>\n";
    }
    o += "<text x=\"" + num(left + plot_w) + "\" y=\"" + num(y0 + panel_h + 30) +
         "\" font-size=\"11\" text-anchor=\"end\">step</text>\n";
    for (std::size_t i = 0; i < panels[p].lines.size(); ++i) {
      const PlotSeries* s = panels[p].lines[i];
      if (!s) continue;
      std::string pts;
      for (auto [x, y] : s->points) pts += (pts.empty() ? "" : " ") + num(px(x)) + "," + num(py(y));
      o += "<polyline class=\"series " + s->name + "\" fill=\"none\" stroke=\"" + colours[i % 2] +
           "\" stroke-width=\"1.5\" points=\"" + pts + "\"/>\n";
      if (s->points.size() == 1)  // a polyline of one point draws nothing
        o += "<circle class=\"point " + s->name + "\" cx=\"" + num(px(s->points[0].first)) + "\" cy=\"" +
             num(py(s->points[0].second)) + "\" r=\"3\" fill=\"" + colours[i % 2] + "\"/>\n";
    }
    o += "</g>\n";
  }
  o += "</svg>\n";
  return o;
}

}  // namespace stp::profile
