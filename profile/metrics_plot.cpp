#include "profile/metrics_plot.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/json_fields.h"
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

// A value label: 4 significant digits, plain or exponent form.
std::string label(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, std::fabs(v) != 0 && (std::fabs(v) < 1e-2 || std::fabs(v) >= 1e6) ? "%.3e" : "%.4g",
                v);
  return buf;
}

}  // namespace

std::vector<PlotSeries> read_plot_series(const std::string& path) {
  std::ifstream f(path);
  STP_CHECK(f.good(), "cannot open '", path, "' (the run's metrics.jsonl)");
  std::map<std::int64_t, json> by_step;  // the last line of each step
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      json j = json::parse(line);
      const std::int64_t step = json_int(j, "step");
      by_step[step] = std::move(j);
    } catch (const Error& e) {
      throw Error(str("'", path, "' line ", n, ": ", e.what()));
    } catch (const json::exception& e) {
      throw Error(str("'", path, "' line ", n, ": ", e.what()));
    }
  }
  STP_CHECK(!by_step.empty(), "'", path, "' has no logged step");
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
  if (x_min > x_max) x_min = x_max = 0;
  if (x_max == x_min) x_max = x_min + 1;

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
    for (int k = 0; k <= 4; ++k) {  // horizontal grid with value labels
      double v = lo + (hi - lo) * k / 4.0;
      o += "<line x1=\"" + num(left) + "\" x2=\"" + num(left + plot_w) + "\" y1=\"" + num(py(v)) + "\" y2=\"" +
           num(py(v)) + "\" stroke=\"#e3e3e3\"/>\n";
      o += "<text x=\"" + num(left - 6) + "\" y=\"" + num(py(v) + 4) + "\" font-size=\"11\" text-anchor=\"end\">" +
           label(v) + "</text>\n";
    }
    for (int k = 0; k <= 5; ++k) {  // step ticks
      double x = x_min + (x_max - x_min) * k / 5.0;
      o += "<text x=\"" + num(px(x)) + "\" y=\"" + num(y0 + panel_h + 15) +
           "\" font-size=\"11\" text-anchor=\"middle\">" + label(std::round(x)) + "</text>\n";
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
    }
    o += "</g>\n";
  }
  o += "</svg>\n";
  return o;
}

}  // namespace stp::profile
