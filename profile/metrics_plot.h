// `stp plot`: a run's metrics.jsonl (docs/design.md, Files) as curves against the step, in one
// self-contained SVG (no scripts, no external fonts or files; any browser shows it).
//
// Series, one <polyline> each with one point per step that has the value (class="series NAME",
// in this order): loss, val_loss, lr, tokens_per_s, peak_device_mib (the largest device's
// peak_device_bytes / 2^20); a series of one point also gets a dot (<circle class="point NAME">),
// since a polyline of one point draws nothing. Panels, stacked: loss with val_loss, lr,
// throughput, peak memory; each with its own linear y range (min..max of its values; five value
// labels with as many digits as it takes to tell them apart) and the step range on x (ticks on
// whole steps, no step twice).
// A step logged twice (a resumed run appends) keeps its last line; a null or missing value
// (a skipped step's loss, val_loss off the evaluation steps) leaves the step out of that series.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace stp::profile {

struct PlotSeries {
  std::string name;                               // loss | val_loss | lr | tokens_per_s | peak_device_mib
  std::vector<std::pair<double, double>> points;  // (step, value), step ascending
};

// The file is read as profile/metrics_lines.h says: a cut last line (a run stopped while writing
// it) is left out, and its number stored in `cut_line` (0 when the file ends with a whole line).
// Throws stp::Error naming the file and line on a missing file, malformed JSON, a line without
// "step", or a file without any logged step.
std::vector<PlotSeries> read_plot_series(const std::string& metrics_path, int* cut_line = nullptr);

// The SVG document; `title` is written at the top (escaped).
std::string render_metrics_svg(const std::vector<PlotSeries>& series, const std::string& title);

}  // namespace stp::profile
