// stp sim --schedule NAME --pp P --microbatches M [--tf X --tb X --tw X --tar X --tp2p X]
//         [--units N --issue SHAPE=X,...] [--json | --svg FILE | --trace FILE]
//         [--check-deadlock [--p2p-streams per-channel|shared]]
// stp sim --compare --pp P --microbatches M [costs]
//
// Generates, validates and simulates a pipeline schedule (docs/design.md, Command line; docs/schedules.md) and prints
// the result as text or JSON, or writes the timeline as SVG or a Chrome trace; --compare prints Table 1 of the STP
// paper (formula vs simulation for 1f1b-i, zb-v and stp); --check-deadlock replays the executor's p2p posting with
// rendezvous semantics (schedule/deadlock.h) and exits 1 naming the first cycle. `stp sim --help` lists the options.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/file_io.h"
#include "schedule/compare.h"
#include "schedule/deadlock.h"
#include "schedule/render.h"
#include "schedule/simulator.h"
#include "schedule/validator.h"
#include "tools/cli/cli.h"
#include "tools/cli/output_guard.h"
#include "tools/stp/command.h"

namespace {

using stp::str;

struct SimArgs {
  std::string schedule;
  int pp = 0, microbatches = 0;
  stp::sched::Costs costs;
  std::vector<std::string> issue;  // each --issue SHAPE=MS,... as given; parsed into costs.issue by check()
  bool compare = false, json = false, check_deadlock = false;
  std::string svg, trace;
  std::string p2p_streams = "per-channel";
};

double parse_number(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  STP_CHECK(!text.empty() && end && *end == '\0' && errno == 0 && std::isfinite(v), flag, " expects a number, got '",
            text, "'");
  return v;
}

// --issue 'F=0.5,B*=1.2,F&B=3' (op shapes of schedule/simulator.h; others stay 0).
void parse_issue(const std::string& text, stp::sched::Costs& c) {
  std::size_t at = 0;
  while (at <= text.size()) {
    std::size_t comma = text.find(',', at);
    std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    std::size_t eq = item.find('=');
    STP_CHECK(eq != std::string::npos, "--issue expects SHAPE=MS[,SHAPE=MS...], got '", text, "'");
    std::string name = item.substr(0, eq);
    int shape = -1;
    for (int k = 0; k < stp::sched::kOpShapes; ++k)
      if (name == stp::sched::op_shape_name(k)) shape = k;
    STP_CHECK(shape >= 0, "--issue: unknown op shape '", name, "' (F, B, B*, W, F&B, F&B*, F&W, F+F)");
    c.issue[static_cast<std::size_t>(shape)] = parse_number("--issue " + name, item.substr(eq + 1));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
}

// What the command line cannot say alone: values in range, a schedule or --compare.
void check(SimArgs& a) {
  STP_CHECK(a.pp >= 1, "--pp must be at least 1, got ", a.pp);
  STP_CHECK(a.microbatches >= 1, "--microbatches must be at least 1, got ", a.microbatches);
  STP_CHECK(a.compare || !a.schedule.empty(), "--schedule NAME is required (gpipe, 1f1b, 1f1b-i, zb-h1, zb-v, stp)");
  STP_CHECK(a.p2p_streams == "per-channel" || a.p2p_streams == "shared",
            "--p2p-streams expects per-channel or shared, got '", a.p2p_streams, "'");
  for (const std::string& text : a.issue) parse_issue(text, a.costs);
  stp::sched::check_costs(a.costs);
}

// The executor's posting (the same for every tp: TP all-reduces have their own stream and
// communicator), on one stream per channel or, to compare, one shared p2p stream per rank; then
// whether the ranks first use their shared channels in the same order (connection on the host).
int check_deadlock(const SimArgs& a, const stp::sched::Schedule& s) {
  using namespace stp::sched;
  DeadlockOptions o;
  o.streams = a.p2p_streams == "shared" ? P2pStreams::Shared : P2pStreams::PerChannel;
  DeadlockResult r = find_deadlock(s, o);
  std::string out = str(a.schedule, " pp ", a.pp, " microbatches ", a.microbatches, ", p2p streams ", a.p2p_streams,
                        ": ", r.ok ? "no deadlock" : r.message, "\n");
  int status = r.ok ? 0 : 1;
  DeadlockResult connect = find_connect_deadlock(s);
  out += str(a.schedule, " pp ", a.pp, " microbatches ", a.microbatches,
             ", first uses of channels: ", connect.ok ? "agree" : connect.message, "\n");
  if (!connect.ok) status = 1;
  std::fwrite(out.data(), 1, out.size(), stdout);
  return status;
}

int run(SimArgs& a) {
  check(a);
  if (!a.svg.empty()) stp::tools::check_output_file(a.svg, "--svg", {});
  if (!a.trace.empty()) stp::tools::check_output_file(a.trace, "--trace", {});
  std::string out;
  if (a.check_deadlock) {
    STP_CHECK(!a.compare, "--check-deadlock needs --schedule, not --compare");
    stp::sched::Schedule s = stp::sched::generate(a.schedule, a.pp, a.microbatches);
    stp::sched::validate(s);
    return check_deadlock(a, s);
  }
  if (a.compare) {
    out = stp::sched::render_compare(a.pp, a.microbatches, a.costs);
  } else {
    stp::sched::Schedule s = stp::sched::generate(a.schedule, a.pp, a.microbatches);
    stp::sched::validate(s);
    stp::sched::SimResult r = stp::sched::simulate(s, a.costs);
    if (a.json) {
      out = stp::sched::render_json(s, r);
    } else if (!a.svg.empty() || !a.trace.empty()) {
      const std::string& path = a.svg.empty() ? a.trace : a.svg;
      stp::write_file_atomic(
          path, a.svg.empty() ? stp::sched::render_trace(s, r, a.costs) : stp::sched::render_svg(s, r, a.costs));
      out = str("wrote ", path, " (", a.schedule, ", pp ", a.pp, ", microbatches ", a.microbatches, ", makespan ",
                stp::sched::format_number(r.makespan), ")\n");
    } else {
      out = stp::sched::render_text(s, r);
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

stp::tools::Run define(CLI::App& app) {
  auto a = std::make_shared<SimArgs>();
  auto* schedule =
      app.add_option("--schedule", a->schedule, "schedule: gpipe, 1f1b, 1f1b-i, zb-h1, zb-v, stp")->type_name("NAME");
  app.add_flag("--compare", a->compare, "print Table 1 for 1f1b-i, zb-v and stp: formula vs simulation")
      ->excludes(schedule);
  app.add_option("--pp", a->pp, "pipeline stages")->type_name("P")->required();
  app.add_option("--microbatches", a->microbatches, "microbatches per step")->type_name("M")->required();
  const char* costs = "Costs (ms)";
  app.add_option("--tf", a->costs.tf, "time of F, the forward of one chunk-pass")->group(costs)->capture_default_str();
  app.add_option("--tb", a->costs.tb, "time of B, the input gradient")->group(costs)->capture_default_str();
  app.add_option("--tw", a->costs.tw, "time of W, the weight gradient")->group(costs)->capture_default_str();
  app.add_option("--tar", a->costs.tar, "time of one TP all-reduce")->group(costs)->capture_default_str();
  app.add_option("--tp2p", a->costs.tp2p, "time of one pipeline send")->group(costs)->capture_default_str();
  app.add_option("--units", a->costs.units, "compute units per pass per chunk")
      ->type_name("N")
      ->group(costs)
      ->capture_default_str();
  app.add_option("--issue", a->issue, "issue overhead per op shape (F, B, B*, W, F&B, F&B*, F&W, F+F); others 0")
      ->type_name("SHAPE=X,...")
      ->group(costs)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->allow_extra_args(false);
  auto* json = app.add_flag("--json", a->json, "print the schedule and its simulation as JSON");
  auto* svg = app.add_option("--svg", a->svg, "write the timeline as SVG")->type_name("FILE");
  auto* trace =
      app.add_option("--trace", a->trace, "write the timeline as a Chrome trace (Perfetto)")->type_name("FILE");
  auto* deadlock = app.add_flag("--check-deadlock", a->check_deadlock,
                                "replay each rank's sends and receives as the executor posts them (one stream per "
                                "channel; rendezvous: a send completes only once the peer's receive runs); print the "
                                "first cycle of waits, naming the ops, and exit 1 if there is one");
  app.add_option("--p2p-streams", a->p2p_streams,
                 "with --check-deadlock: per-channel (what the executor does: one stream per direction and message "
                 "kind) or shared (every channel on one p2p stream per rank, to compare)")
      ->type_name("RULE")
      ->capture_default_str()
      ->needs(deadlock);
  deadlock->excludes(json)->excludes(svg)->excludes(trace);
  json->excludes(svg)->excludes(trace);
  svg->excludes(trace);
  return [a] { return run(*a); };
}

}  // namespace

static const stp::tools::Command kCmd{
    "sim", "generate, validate and simulate a pipeline schedule, or print Table 1 (--compare)", &define};
