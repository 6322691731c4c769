// stp profile RUN_DIR [--json] [--svg FILE] [--steps A[-B]]
//
// Reads RUN_DIR/trace.json (a run with output.trace: true) and RUN_DIR/metrics.jsonl and prints
// per rank and in total where the time of a step went (compute busy, pipeline bubble, exposed TP
// and P2P communication, offload traffic and stalls), peak device and pinned memory with the
// high-water moments, and the simulator's prediction with costs calibrated from the trace next to
// the measurement (docs/profile.md). RUN_DIR/config.yaml (written by stp train) names the
// schedule; without it the prediction is skipped with a note. --svg draws one step (the last one
// analysed; FILE may not be a file the command or another stp command reads:
// tools/cli/output_guard.h). By default step 1 (warm-up) is left out when the trace has more steps.
// `stp profile --help` lists the options.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "config/config.h"
#include "base/error.h"
#include "base/file_io.h"
#include "profile/predict.h"
#include "profile/render_svg.h"
#include "profile/report.h"
#include "profile/run_metrics.h"
#include "profile/trace_reader.h"
#include "schedule/schedule.h"
#include "tools/cli/cli.h"
#include "tools/cli/output_guard.h"
#include "tools/stp/command.h"
#include "train/memory_planning.h"

namespace {

namespace fs = std::filesystem;
using stp::str;

struct ProfileArgs {
  std::string dir, svg;
  bool json = false;
  std::string steps_text;  // --steps as given; check() fills steps
  bool steps_given = false;
  stp::profile::StepFilter steps;
};

std::int64_t parse_step(const std::string& text) {
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  STP_CHECK(!text.empty() && end && *end == '\0' && v >= 0, "--steps expects A or A-B (step numbers), got '", text,
            "'");
  return v;
}

// What the command line cannot say alone: the --steps range and that RUN_DIR is a folder.
void check(ProfileArgs& a) {
  if (a.steps_given) {
    const std::string& v = a.steps_text;
    auto dash = v.find('-', 1);
    a.steps.first = parse_step(v.substr(0, dash));
    a.steps.last = dash == std::string::npos ? a.steps.first : parse_step(v.substr(dash + 1));
    STP_CHECK(a.steps.first <= a.steps.last, "--steps ", v, ": the first step is after the last");
  }
  std::error_code ec;  // a path that cannot be looked at is "not a folder", never a filesystem_error
  STP_CHECK(fs::is_directory(a.dir, ec), "'", a.dir,
            "' is not a folder (expected a run folder: output.dir of stp train)");
}

// The prediction needs the run's schedule; the memory comparison the planner's dry run.
void add_prediction(stp::profile::Report& report, const stp::profile::Trace& trace,
                    const std::vector<stp::profile::RankTimeline>& ranks, const stp::profile::StepFilter& steps,
                    const fs::path& dir) {
  fs::path config_path = dir / "config.yaml";
  std::error_code ec;
  if (!fs::exists(config_path, ec)) {
    report.notes.push_back(str("no prediction: ", config_path.string(), " is missing (stp train writes it)"));
    return;
  }
  stp::Config cfg;
  try {
    cfg = stp::load_config(config_path.string());
  } catch (const stp::Error& e) {
    report.notes.push_back(str("no prediction: ", e.what()));
    return;
  }
  report.schedule = cfg.parallel.schedule;
  report.pp = cfg.parallel.pp;
  report.tp = cfg.parallel.tp;
  report.microbatches = cfg.train.microbatches;
  stp::sched::Schedule s = stp::sched::generate(cfg.parallel.schedule, cfg.parallel.pp, cfg.train.microbatches);
  report.prediction = stp::profile::predict(trace, ranks, s, cfg.parallel.tp, steps);
  report.has_prediction = true;
  try {
    stp::MemoryPlan plan = stp::make_memory_plan(cfg);
    for (const auto& p : plan.predicted) report.planned_peak_device.push_back(static_cast<double>(p.peak_device_bytes));
  } catch (const stp::Error& e) {
    report.notes.push_back(str("no memory prediction: ", e.what()));
  }
}

int run(ProfileArgs& a) {
  check(a);
  const fs::path dir(a.dir);
  if (!a.svg.empty())
    stp::tools::check_output_file(a.svg, "--svg",
                                  {{(dir / "trace.json").string(), "RUN_DIR's trace.json"},
                                   {(dir / "metrics.jsonl").string(), "RUN_DIR's metrics.jsonl"},
                                   {(dir / "config.yaml").string(), "RUN_DIR's config.yaml"}});
  stp::profile::Trace trace = stp::profile::read_trace_file((dir / "trace.json").string());
  auto ranks = stp::profile::timelines(trace);
  STP_CHECK(!ranks.empty(), "trace '", (dir / "trace.json").string(), "' has no spans or counters");
  std::int64_t first = INT64_MAX, last = INT64_MIN;
  for (const auto& r : ranks)
    for (const auto& w : r.steps) first = std::min(first, w.step), last = std::max(last, w.step);
  stp::profile::StepFilter steps = a.steps;
  if (!a.steps_given && last > first) steps.first = first + 1;  // leave out the warm-up step

  stp::profile::Report report = stp::profile::measure_run(trace, ranks, steps);
  report.run = a.dir;
  STP_CHECK(!report.steps.empty(), "no step of the trace is in --steps (the trace has steps ", first, " to ", last,
            ")");
  fs::path metrics = dir / "metrics.jsonl";
  std::error_code ec;
  if (fs::exists(metrics, ec)) {
    report.metrics = stp::profile::read_run_metrics(metrics.string());
    report.has_metrics = true;
    if (report.metrics.cut_line)
      report.notes.push_back(str(metrics.string(), ": line ", report.metrics.cut_line,
                                 " is cut (the run stopped while writing it); it is ignored"));
  } else {
    report.notes.push_back(str(metrics.string(), " is missing: no peaks from the run's own log"));
  }
  add_prediction(report, trace, ranks, steps, dir);

  std::string out = a.json ? stp::profile::render_json(report) : stp::profile::render_text(report);
  if (!a.svg.empty()) {
    std::string title = report.has_prediction ? str(report.schedule, ", tp ", report.tp, " × pp ", report.pp,
                                                    ", m = ", report.microbatches, " — measured step ",
                                                    report.steps.back(), " of ", a.dir)
                                              : str("measured step ", report.steps.back(), " of ", a.dir);
    stp::write_file_atomic(a.svg,
                           stp::profile::render_timeline_svg(trace, ranks, report.steps.back(), title, report.tp));
    if (!a.json) out += str("wrote ", a.svg, " (step ", report.steps.back(), ")\n");
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

stp::tools::Run define(CLI::App& app) {
  auto a = std::make_shared<ProfileArgs>();
  app.add_option("RUN_DIR", a->dir, "output.dir of a `stp train` run with output.trace: true")->required();
  app.add_flag("--json", a->json, "print the report as JSON");
  app.add_option("--svg", a->svg, "also draw the timeline of the last step analysed as SVG")->type_name("FILE");
  app.add_option("--steps", a->steps_text, "the steps to analyse, e.g. 3 or 2-5 (default: all but the warm-up step 1)")
      ->type_name("A[-B]")
      ->each([a](const std::string&) { a->steps_given = true; });
  return [a] { return run(*a); };
}

}  // namespace

static const stp::tools::Command kCmd{"profile", "overlap, memory and prediction report from a traced run", &define};
