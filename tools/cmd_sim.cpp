// `stp sim`: generate, validate and simulate a pipeline schedule (docs/design.md, Command line; docs/schedules.md), or
// print Table 1.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "schedule/compare.h"
#include "schedule/render.h"
#include "schedule/simulator.h"
#include "schedule/validator.h"
#include "tools/command.h"
#include "tools/write_file.h"

namespace {

using stp::tools::write_file;

using stp::str;

struct SimArgs {
  std::string schedule;
  int pp = 0, microbatches = 0;
  stp::sched::Costs costs;
  bool compare = false, json = false;
  std::string svg, trace;
};

double parse_number(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  STP_CHECK(!text.empty() && end && *end == '\0' && errno == 0 && std::isfinite(v), flag,
            " expects a number, got '", text, "'");
  return v;
}

int parse_int(const std::string& flag, const std::string& text) {
  double v = parse_number(flag, text);
  STP_CHECK(v == std::floor(v) && std::fabs(v) < 1e9, flag, " expects an integer, got '", text, "'");
  return static_cast<int>(v);
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

SimArgs parse(const stp::tools::Args& args) {
  SimArgs a;
  bool have_pp = false, have_m = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& f = args[i];
    if (f == "--compare") { a.compare = true; continue; }
    if (f == "--json") { a.json = true; continue; }
    STP_CHECK(i + 1 < args.size(), "unknown flag '", f, "' or missing value");
    const std::string& v = args[++i];
    if (f == "--schedule") a.schedule = v;
    else if (f == "--pp") a.pp = parse_int(f, v), have_pp = true;
    else if (f == "--microbatches") a.microbatches = parse_int(f, v), have_m = true;
    else if (f == "--tf") a.costs.tf = parse_number(f, v);
    else if (f == "--tb") a.costs.tb = parse_number(f, v);
    else if (f == "--tw") a.costs.tw = parse_number(f, v);
    else if (f == "--tar") a.costs.tar = parse_number(f, v);
    else if (f == "--tp2p") a.costs.tp2p = parse_number(f, v);
    else if (f == "--units") a.costs.units = parse_int(f, v);
    else if (f == "--issue") parse_issue(v, a.costs);
    else if (f == "--svg") a.svg = v;
    else if (f == "--trace") a.trace = v;
    else throw stp::Error(str("unknown flag '", f, "'"));
  }
  STP_CHECK(have_pp && have_m, "--pp and --microbatches are required");
  STP_CHECK(a.pp >= 1, "--pp must be at least 1, got ", a.pp);
  STP_CHECK(a.microbatches >= 1, "--microbatches must be at least 1, got ", a.microbatches);
  STP_CHECK(a.compare || !a.schedule.empty(), "--schedule NAME is required (gpipe, 1f1b, 1f1b-i, zb-h1, zb-v, stp)");
  STP_CHECK(!a.compare || a.schedule.empty(), "--compare prints 1f1b-i, zb-v and stp; drop --schedule");
  int outputs = a.json + !a.svg.empty() + !a.trace.empty();
  STP_CHECK(outputs <= 1, "choose one of --json, --svg FILE, --trace FILE");
  stp::sched::check_costs(a.costs);
  return a;
}

int run(const stp::tools::Args& args) {
  SimArgs a = parse(args);
  std::string out;
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
      write_file(path, a.svg.empty() ? stp::sched::render_trace(s, r, a.costs) : stp::sched::render_svg(s, r, a.costs));
      out = str("wrote ", path, " (", a.schedule, ", pp ", a.pp, ", microbatches ", a.microbatches, ", makespan ",
                stp::sched::format_number(r.makespan), ")\n");
    } else {
      out = stp::sched::render_text(s, r);
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

static const stp::tools::Command kCmd{
    "sim",
    "sim --schedule NAME --pp P --microbatches M [--tf X --tb X --tw X --tar X --tp2p X --units N --issue SHAPE=X,...] [--json | --svg FILE | "
    "--trace FILE] | sim --compare --pp P --microbatches M [costs]",
    &run};
