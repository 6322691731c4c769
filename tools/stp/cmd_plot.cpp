// `stp plot RUN_DIR --svg FILE`: draws RUN_DIR/metrics.jsonl (loss, val_loss, lr, throughput, peak
// device memory against the step) into one self-contained SVG (profile/metrics_plot.h). FILE may not
// be the metrics it reads nor another file stp reads (tools/cli/output_guard.h). A cut last line (a
// run killed while writing it) is left out with a warning; the lines before it are drawn.
#include <filesystem>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "base/file_io.h"
#include "profile/metrics_plot.h"
#include "tools/cli/output_guard.h"
#include "tools/stp/command.h"

namespace {

struct PlotArgs {
  std::string dir, svg;
};

int run(const PlotArgs& a) {
  const std::string metrics = (std::filesystem::path(a.dir) / "metrics.jsonl").string();
  std::error_code ec;
  STP_CHECK(std::filesystem::is_regular_file(metrics, ec), "'", a.dir,
            "' has no metrics.jsonl (give the output.dir of a `stp train` run)");
  stp::tools::check_output_file(a.svg, "--svg", {{metrics, "RUN_DIR's metrics.jsonl"}});
  int cut = 0;
  auto series = stp::profile::read_plot_series(metrics, &cut);
  if (cut)
    std::fprintf(stderr,
                 "stp plot: warning: %s: line %d is cut (the run stopped while writing it, or the disk was full); "
                 "it is ignored\n",
                 metrics.c_str(), cut);
  std::size_t points = 0;
  for (const auto& s : series) points += s.points.size();
  stp::write_file_atomic(a.svg, stp::profile::render_metrics_svg(series, "stp run " + a.dir));
  std::fprintf(stderr, "stp plot: %s (%zu points from %s)\n", a.svg.c_str(), points, metrics.c_str());
  return 0;
}

stp::tools::Run define(CLI::App& app) {
  auto args = std::make_shared<PlotArgs>();
  app.add_option("RUN_DIR", args->dir, "output.dir of a run (holds metrics.jsonl)")->required();
  app.add_option("--svg", args->svg, "the SVG file to write")->required();
  return [args] { return run(*args); };
}

}  // namespace

static const stp::tools::Command kCmd{"plot", "plot a run's metrics.jsonl into an SVG", &define};
