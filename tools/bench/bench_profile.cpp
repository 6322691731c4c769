// Profiling speed: generates a trace of about a million events shaped like a real run's (stp,
// tp 2 x pp 4, m 16: ops, units, all-reduces, sends and receives, offload copies with bytes,
// memory counters after every unit, step spans; timings from the simulator with ±10% jitter),
// writes it, and times what `stp profile --json` does with it: read + parse, then analysis
// (timelines, overlap, memory, calibration, simulation, report). Target: under 2 s.
// --compare-json also times nlohmann-json's generic tree reader on the same file (why profile/
// reads it with simdjson On Demand).
// Usage: build/bench_profile [--events N] [--out PATH] [--keep] [--compare-json]   (or --help)
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "base/error.h"
#include "base/trace.h"
#include "base/trace_names.h"
#include "profile/predict.h"
#include "profile/report.h"
#include "profile/trace_reader.h"
#include "schedule/schedule.h"
#include "schedule/simulator.h"
#include "tools/cli/cli.h"

namespace {

using stp::str;
using stp::TraceArgs;
namespace sched = stp::sched;
namespace stream = stp::trace::stream;
namespace cat = stp::trace::cat;
namespace arg = stp::trace::arg;

constexpr int kTp = 2, kPp = 4, kMicrobatches = 16;

// Adds one step of every rank starting at `origin` (µs); returns the events added.
std::size_t add_step(stp::TraceRecorder& rec, const sched::Schedule& s, const sched::Costs& c,
                     const sched::SimResult& r, int step, double origin, std::mt19937& rng) {
  static const char* kCat[] = {cat::kForward, cat::kBackward, cat::kWeight};
  std::uniform_real_distribution<double> jitter(0.9, 1.1);
  std::size_t events = 0;
  for (int rank = 0; rank < s.pp; ++rank)
    for (int t = 0; t < kTp; ++t) {
      int pid = rank * kTp + t;
      auto at = [&](double ms) { return origin + ms * 1e3; };
      rec.add({pid, stream::kCompute, stp::trace::step_span(step), cat::kStep, {}, at(-0.5), (r.makespan + 1) * 1e3});
      double live = 0;
      for (std::size_t i = 0; i < s.ranks[rank].size(); ++i) {
        const sched::Op& op = s.ranks[rank][i];
        const sched::OpTime& ot = r.times[rank][i];
        rec.add({pid, stream::kCompute, sched::to_string(op), cat::kOp, {}, at(ot.start), (ot.end - ot.start) * 1e3});
        auto msgs = sched::op_messages(s, rank, op);
        for (const auto& m : msgs.recv)
          rec.add({pid,
                   stream::kP2p,
                   stp::trace::recv_span(sched::to_string(m)),
                   cat::kP2p,
                   {},
                   at(ot.start - 0.2),
                   0.2e3});
        for (const sched::Segment& seg : sched::op_segments(op, c, ot.start)) {
          std::string part = sched::to_string(op.part(seg.part));
          double dur = (seg.end - seg.start) * 1e3 * jitter(rng);
          if (seg.stream == 0) {
            rec.add({pid, stream::kCompute, part + " h.0.mlp", kCat[static_cast<int>(seg.pass)],
                     TraceArgs().add(arg::kPart, part).add(arg::kUnit, 1).add(arg::kMb, op.part(seg.part).mb),
                     at(seg.start), dur});
            live += seg.pass == sched::Pass::F ? 1.5e6 : -1.0e6;
            if (live < 0) live = 0;
            const auto& series = stp::trace::kMemorySeries;
            rec.add_counter(
                {pid,
                 stp::trace::track::kDeviceMemory,
                 at(seg.end),
                 {{series[0], 8e6}, {series[1], 8e6}, {series[2], 16e6}, {series[3], live}, {series[4], 1e6}}});
            if (seg.pass == sched::Pass::F) {
              rec.add({pid, stream::kD2h, str("offload ", part), cat::kD2h, TraceArgs().add(arg::kBytes, 1048576),
                       at(seg.end), 0.3e3});
              rec.add_counter({pid, stp::trace::track::kPinnedMemory, at(seg.end), {{series[3], live / 2}}});
              events += 2;
            } else if (seg.pass == sched::Pass::B) {
              rec.add({pid, stream::kH2d, str("reload ", part), cat::kH2d, TraceArgs().add(arg::kBytes, 1048576),
                       at(seg.start - 0.5), 0.3e3});
              ++events;
            }
          } else {
            rec.add({pid, stream::kTpComm, "AR " + part, cat::kTpComm,
                     TraceArgs().add(arg::kPart, part).add(arg::kBytes, 262144), at(seg.start), dur});
          }
          events += seg.stream == 0 ? 2 : 1;
        }
        for (const auto& m : msgs.send)
          rec.add({pid, stream::kP2p, stp::trace::send_span(sched::to_string(m)), cat::kP2p, {}, at(ot.end), 20});
        events += 1 + msgs.recv.size() + msgs.send.size();
      }
      ++events;
    }
  return events;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t target = 1000000;
  std::string out = (std::filesystem::temp_directory_path() / "bench_profile_trace.json").string();
  bool keep = false, compare_json = false;
  CLI::App app{
      "Profiling speed: writes a trace of about a million events shaped like a real run's and times "
      "what `stp profile --json` does with it (read + parse, then analysis); exit status 1 over 2 s.",
      "bench_profile"};
  stp::tools::init_cli(app);
  app.add_option("--events", target, "events in the generated trace (whole steps, at least this many)")
      ->type_name("N")
      ->capture_default_str();
  app.add_option("--out", out, "where the trace is written")->type_name("PATH")->capture_default_str();
  app.add_flag("--keep", keep, "keep the trace file afterwards");
  app.add_flag("--compare-json", compare_json, "also time nlohmann-json's generic tree reader on the same file");
  if (auto status = stp::tools::parse_cli(app, argc, argv)) return *status;
  return stp::tools::run_main(app, [&] {
    sched::Schedule s = sched::generate("stp", kPp, kMicrobatches);
    sched::Costs c;
    c.tf = 4, c.tb = 4, c.tw = 2.5, c.tar = 8, c.tp2p = 0.4;
    sched::SimResult r = sched::simulate(s, c);
    stp::TraceRecorder rec;
    std::mt19937 rng(7);
    std::size_t events = 0;
    int steps = 0;
    while (events < target) {
      ++steps;
      events += add_step(rec, s, c, r, steps, steps * (r.makespan + 20) * 1e3, rng);
    }
    rec.write(out);
    double mb = static_cast<double>(std::filesystem::file_size(out)) / 1e6;
    std::printf("bench_profile: %zu events (%d steps of stp, tp %d x pp %d, m %d), %.0f MB at %s\n", events, steps, kTp,
                kPp, kMicrobatches, mb, out.c_str());

    auto t0 = std::chrono::steady_clock::now();
    std::clock_t c0 = std::clock();
    stp::profile::Trace trace = stp::profile::read_trace_file(out);
    double parse_s = seconds_since(t0);
    std::clock_t c1 = std::clock();
    auto t1 = std::chrono::steady_clock::now();
    auto ranks = stp::profile::timelines(trace);
    stp::profile::StepFilter filter;
    filter.first = 2;
    stp::profile::Report report = stp::profile::measure_run(trace, ranks, filter);
    report.prediction = stp::profile::predict(trace, ranks, s, kTp, filter);
    report.has_prediction = true;
    std::string json = stp::profile::render_json(report);
    double analysis_s = seconds_since(t1);
    std::clock_t c2 = std::clock();
    double total = parse_s + analysis_s;
    auto cpu = [](std::clock_t a, std::clock_t b) { return static_cast<double>(b - a) / CLOCKS_PER_SEC; };
    std::printf("read + parse %.3f s (%.0f MB/s), analysis %.3f s, total %.3f s: %s the 2 s target\n", parse_s,
                mb / parse_s, analysis_s, total, total < 2 ? "within" : "OVER");
    std::printf(
        "(CPU time of this process: read + parse %.3f s, analysis %.3f s; wall > CPU means the machine was busy)\n",
        cpu(c0, c1), cpu(c1, c2));
    std::printf("(%zu spans, %zu counter samples; report %zu bytes of JSON)\n", trace.spans.size(),
                trace.counters.size(), json.size());
    if (compare_json) {  // nlohmann-json's generic tree reader on the same file, for comparison
      auto t2 = std::chrono::steady_clock::now();
      std::string text;
      {
        std::FILE* f = std::fopen(out.c_str(), "rb");
        char buf[1 << 16];
        for (std::size_t n; f && (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
        if (f) std::fclose(f);
      }
      nlohmann::json doc = nlohmann::json::parse(text);
      std::printf("nlohmann-json parse of the same file: %.3f s (%zu events)\n", seconds_since(t2),
                  doc.at("traceEvents").size());
    }
    if (!keep) std::filesystem::remove(out);
    return total < 2 ? 0 : 1;
  });
}
