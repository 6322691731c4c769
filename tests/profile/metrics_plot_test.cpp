// `stp plot`'s SVG (profile/metrics_plot.h): well-formed, one polyline per series with one point
// per step that has the value; last line wins for a step logged twice; clear errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "base/error.h"
#include "profile/metrics_plot.h"

namespace {

std::string write_metrics(const std::string& name, const std::string& text) {
  auto dir = std::filesystem::path(STP_BINARY_DIR) / "tests" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "metrics.jsonl") << text;
  return (dir / "metrics.jsonl").string();
}

// Every element closed in order, attributes quoted, '&' only in entities, one root <svg>.
::testing::AssertionResult well_formed(const std::string& s) {
  std::vector<std::string> open;
  int roots = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '&') {
      std::size_t semi = s.find(';', i);
      std::string ent = s.substr(i, semi == std::string::npos ? 0 : semi - i + 1);
      if (ent != "&lt;" && ent != "&gt;" && ent != "&amp;" && ent != "&quot;")
        return ::testing::AssertionFailure() << "bare & at " << i;
    }
    if (s[i] != '<') continue;
    std::size_t end = s.find('>', i);
    if (end == std::string::npos) return ::testing::AssertionFailure() << "unclosed tag at " << i;
    std::string tag = s.substr(i + 1, end - i - 1);
    i = end;
    if (tag.front() == '?') continue;
    if (std::count(tag.begin(), tag.end(), '"') % 2 != 0) return ::testing::AssertionFailure() << "quotes: " << tag;
    if (tag.front() == '/') {
      std::string name = tag.substr(1);
      if (open.empty() || open.back() != name) return ::testing::AssertionFailure() << "mismatched </" << name << ">";
      open.pop_back();
      continue;
    }
    std::string name = tag.substr(0, tag.find_first_of(" \n/"));
    if (open.empty()) ++roots;
    if (tag.back() != '/') open.push_back(name);
  }
  if (!open.empty()) return ::testing::AssertionFailure() << "<" << open.back() << "> never closed";
  if (roots != 1) return ::testing::AssertionFailure() << roots << " root elements";
  return ::testing::AssertionSuccess();
}

// class name -> number of points of its polyline; a series drawn twice fails.
std::map<std::string, int> polylines(const std::string& svg) {
  std::map<std::string, int> out;
  std::regex re("<polyline class=\"series ([a-z_]+)\"[^>]*points=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it) {
    std::string name = (*it)[1], pts = (*it)[2];
    EXPECT_EQ(out.count(name), 0u) << name << " drawn twice";
    out[name] = pts.empty() ? 0 : static_cast<int>(std::count(pts.begin(), pts.end(), ' ')) + 1;
  }
  return out;
}

TEST(MetricsPlot, OnePolylinePerSeriesWithOnePointPerStep) {
  std::string text;
  for (int s = 1; s <= 12; ++s) {
    std::string loss = s == 7 ? "null" : std::to_string(5.0 - 0.2 * s);  // step 7 was skipped
    text += "{\"step\":" + std::to_string(s) + ",\"loss\":" + loss;
    if (s % 4 == 0) text += ",\"val_loss\":" + std::to_string(5.1 - 0.2 * s);
    text += ",\"lr\":" + std::to_string(1e-3 * s / 12) +
            ",\"step_ms\":10,\"tokens_per_s\":" + std::to_string(1000 + s) + ",\"peak_device_bytes\":[1048576," +
            std::to_string(2097152 + s) + "],\"peak_host_pinned_bytes\":0}\n";
  }
  text += "{\"step\":12,\"loss\":1.5,\"lr\":0.001,\"tokens_per_s\":1,\"peak_device_bytes\":[1]}\n";  // resumed
  auto series = stp::profile::read_plot_series(write_metrics("plot_ok", text));
  ASSERT_EQ(series.size(), 5u);
  EXPECT_EQ(series[0].points.back().second, 1.5) << "the last line of step 12 wins";
  EXPECT_EQ(series[1].points.size(), 2u) << "val_loss at steps 4 and 8 (step 12's last line has none)";
  std::string svg = stp::profile::render_metrics_svg(series, "run <a&b>");
  EXPECT_TRUE(well_formed(svg));
  EXPECT_NE(svg.find("run &lt;a&amp;b&gt;"), std::string::npos);
  auto lines = polylines(svg);
  std::map<std::string, int> want = {
      {"loss", 11}, {"val_loss", 2}, {"lr", 12}, {"tokens_per_s", 12}, {"peak_device_mib", 12}};
  EXPECT_EQ(lines, want);
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  EXPECT_EQ(svg.find("href"), std::string::npos) << "self-contained";
}

TEST(MetricsPlot, ClearErrors) {
  EXPECT_THROW(stp::profile::read_plot_series("/nonexistent/metrics.jsonl"), stp::Error);
  try {
    stp::profile::read_plot_series(write_metrics("plot_bad", "{\"step\":1,\"loss\":2}\n{\"loss\":\n"));
    FAIL();
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(stp::profile::read_plot_series(write_metrics("plot_empty", "\n")), stp::Error);
  EXPECT_THROW(stp::profile::read_plot_series(write_metrics("plot_str", "{\"step\":1,\"loss\":\"x\"}\n")), stp::Error);
}

}  // namespace
