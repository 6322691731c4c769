// `stp plot`'s SVG (profile/metrics_plot.h): well-formed, one polyline per series with one point
// per step that has the value; last line wins for a step logged twice; clear errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
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

// A run killed while writing (kill -9, a full disk) leaves its last line cut: no newline and not a
// whole JSON object. The lines before it are read; the cut line is left out and reported.
TEST(MetricsPlot, ACutLastLineIsLeftOutAndReported) {
  const std::string whole = "{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":2.5}\n{\"step\":3,\"loss\":2}\n";
  int cut = -1;
  auto series = stp::profile::read_plot_series(write_metrics("plot_cut", whole + "{\"step\":4,\"lo"), &cut);
  EXPECT_EQ(cut, 4);
  EXPECT_EQ(series[0].points.size(), 3u);
  series = stp::profile::read_plot_series(write_metrics("plot_whole", whole), &cut);
  EXPECT_EQ(cut, 0);
  EXPECT_EQ(series[0].points.size(), 3u);
  // A whole last object without its newline is read.
  series = stp::profile::read_plot_series(write_metrics("plot_no_newline", whole + "{\"step\":4,\"loss\":1}"), &cut);
  EXPECT_EQ(cut, 0);
  EXPECT_EQ(series[0].points.size(), 4u);
  // A bad line that is not the cut end of the file is still an error, in stp's words.
  try {
    stp::profile::read_plot_series(write_metrics("plot_mid", "{\"step\":1,\"lo\n" + whole));
    FAIL();
  } catch (const stp::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("line 1, column"), std::string::npos) << what;
    EXPECT_EQ(what.find("json.exception"), std::string::npos) << what;
  }
  // Nothing but a cut line: no logged step, and the message says the only line was cut.
  try {
    stp::profile::read_plot_series(write_metrics("plot_only_cut", "{\"step\":1,\"lo"));
    FAIL();
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cut"), std::string::npos) << e.what();
  }
}

// The tick labels of each panel's axes (value labels: text-anchor end; step labels: middle).
std::vector<std::vector<std::string>> panel_labels(const std::string& svg, const std::string& anchor) {
  std::vector<std::vector<std::string>> out;
  std::regex text_re("<text [^>]*font-size=\"11\" text-anchor=\"" + anchor + "\">([^<]*)</text>");
  for (std::size_t at = svg.find("<g class=\"panel\">"); at != std::string::npos;
       at = svg.find("<g class=\"panel\">", at + 1)) {
    const std::string panel = svg.substr(at, svg.find("</g>", at) - at);
    out.emplace_back();
    for (auto it = std::sregex_iterator(panel.begin(), panel.end(), text_re); it != std::sregex_iterator(); ++it)
      if ((*it)[1] != "step") out.back().push_back((*it)[1]);
  }
  return out;
}

// A one-point series (a run of one logged step, one evaluation) is visible, and no axis repeats a
// tick label (a step range of one or two steps, values that differ in the fifth digit).
TEST(MetricsPlot, OnePointSeriesAreVisibleAndTickLabelsAreDistinct) {
  for (const std::string& text :
       {std::string("{\"step\":1,\"loss\":5,\"val_loss\":5.1,\"lr\":0.001,\"tokens_per_s\":100,"
                    "\"peak_device_bytes\":[1048576]}\n"),
        std::string("{\"step\":1,\"loss\":10.0001,\"lr\":0.001,\"tokens_per_s\":100}\n"
                    "{\"step\":2,\"loss\":10.0002,\"val_loss\":9,\"lr\":0.001,\"tokens_per_s\":100.5}\n"
                    "{\"step\":3,\"loss\":10.0003,\"lr\":0.001,\"tokens_per_s\":101}\n")}) {
    SCOPED_TRACE(text);
    auto series = stp::profile::read_plot_series(write_metrics("plot_small", text));
    const std::string svg = stp::profile::render_metrics_svg(series, "small");
    EXPECT_TRUE(well_formed(svg));
    for (const auto& s : series) {
      const bool marker = svg.find("<circle class=\"point " + s.name + "\"") != std::string::npos;
      EXPECT_EQ(marker, s.points.size() == 1) << s.name << ": a marker exactly when the series has one point";
    }
    for (const char* anchor : {"end", "middle"})
      for (const auto& labels : panel_labels(svg, anchor)) {
        EXPECT_GE(labels.size(), 1u) << anchor;
        std::set<std::string> distinct(labels.begin(), labels.end());
        EXPECT_EQ(distinct.size(), labels.size()) << anchor << " labels repeat: " << ::testing::PrintToString(labels);
      }
  }
  // One logged step: its step is the one step label.
  auto one = stp::profile::read_plot_series(write_metrics("plot_one", "{\"step\":7,\"loss\":5}\n"));
  for (const auto& labels : panel_labels(stp::profile::render_metrics_svg(one, "one"), "middle"))
    EXPECT_EQ(labels, std::vector<std::string>{"7"});
}

}  // namespace
