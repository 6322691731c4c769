// `stp profile` on a real tiny run (stp train with output.trace: true, offloading so every lane
// and both memory counters appear):
//  * trace.json is valid Chrome Trace Event Format (the schema Perfetto's JSON importer reads),
//    checked with the generic JSON reader, independently of the profile's own reader;
//  * the report's peak device memory equals metrics.jsonl's, per device;
//  * the report's per-stream busy times, summed over the steps analysed, equal the union of
//    that stream's spans in the trace (recomputed here from the JSON);
//  * --svg writes a picture; errors name the missing file.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "tests/support/run_command.h"
#include "tests/train/train_fixture.h"

namespace fs = std::filesystem;

namespace {

struct TracedRun {
  fs::path dir;
  bool ok = false;
  std::string log;
};

// One traced run shared by the tests of this file in one process (3 steps, ~2 s). ctest runs each
// test as its own process, in parallel: each process trains into its own folder and removes it.
struct RunFolder {
  fs::path dir = fs::path(STP_BINARY_DIR) / "tests" / ("profile_run." + std::to_string(::getpid()));
  ~RunFolder() {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
};

const TracedRun& traced_run() {
  static const RunFolder folder;
  static const TracedRun run = [] {
    TracedRun r;
    r.dir = folder.dir;
    fs::remove_all(r.dir);
    fs::create_directories(r.dir);
    fs::path config = r.dir / "config.in.yaml";
    std::ofstream(config) << "model: {arch: gpt2, n_layer: 4, n_head: 4, n_embd: 32, vocab_size: 256, seq_len: 16}\n"
                          << "data: {path: " << stp::testing::tiny_text_file() << ", format: text}\n"
                          << "train: {steps: 3, micro_batch_size: 2, microbatches: 4}\n"
                          << "parallel: {backend: cpu, tp: 2, pp: 2, schedule: stp, cpu_threads: 1}\n"
                          << "memory: {offload: all, recompute: none}\n"
                          << "output: {dir: " << (r.dir / "out").string() << ", trace: true}\n";
    auto res = stp::testing::run_stp("train " + config.string());
    r.ok = res.status == 0;
    r.log = res.err;
    return r;
  }();
  return run;
}

std::string read(const fs::path& p) { return stp::testing::slurp(p.string()); }

TEST(ProfileRealRun, TraceIsValidChromeTraceEventFormat) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  const TracedRun& run = traced_run();
  ASSERT_TRUE(run.ok) << run.log;
  nlohmann::json j = nlohmann::json::parse(read(run.dir / "out" / "trace.json"));
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.at("displayTimeUnit").get<std::string>(), "ms");
  std::set<std::pair<std::int64_t, std::int64_t>> named;  // (pid, tid) with a thread_name
  std::set<std::pair<std::int64_t, std::int64_t>> used;
  std::set<std::string> streams, tracks;
  std::map<std::string, int> phases;
  for (const nlohmann::json& e : j.at("traceEvents")) {
    ASSERT_TRUE(e.is_object());
    const std::string ph = e.at("ph").get<std::string>();
    ++phases[ph];
    ASSERT_TRUE(e.at("pid").is_number());
    ASSERT_TRUE(e.at("tid").is_number());  // numbers: Perfetto treats string ids as a non-standard hack
    ASSERT_TRUE(e.at("name").is_string());
    ASSERT_TRUE(e.at("args").is_object());
    auto key = std::make_pair(e.at("pid").get<std::int64_t>(), e.at("tid").get<std::int64_t>());
    if (ph == "M") {
      const std::string n = e.at("name").get<std::string>();
      ASSERT_TRUE(n == "process_name" || n == "process_sort_index" || n == "thread_name" || n == "thread_sort_index")
          << n;
      if (n == "thread_name") {
        named.insert(key);
        streams.insert(e.at("args").at("name").get<std::string>());
      }
    } else if (ph == "X") {
      ASSERT_TRUE(e.at("cat").is_string());
      ASSERT_GE(e.at("ts").get<double>(), 0.0);
      ASSERT_GE(e.at("dur").get<double>(), 0.0);
      used.insert(key);
    } else if (ph == "C") {
      ASSERT_GE(e.at("ts").get<double>(), 0.0);
      ASSERT_FALSE(e.at("args").empty());
      for (const auto& [series, v] : e.at("args").items()) ASSERT_TRUE(v.is_number()) << series;
      tracks.insert(e.at("name").get<std::string>());
    } else {
      FAIL() << "unexpected phase " << ph;
    }
  }
  for (const auto& k : used)
    EXPECT_TRUE(named.count(k)) << "pid " << k.first << " tid " << k.second << " has no thread_name";
  EXPECT_EQ(streams, (std::set<std::string>{"compute", "tp-comm", "p2p", "d2h", "h2d"}));
  EXPECT_EQ(tracks, (std::set<std::string>{"device memory", "pinned memory"}));
  EXPECT_GT(phases.at("X"), 100);
  EXPECT_GT(phases.at("C"), 100);
}

// Union length of [ts, min(end, window end)) of the spans starting in each window.
double busy_ms(const std::vector<std::pair<double, double>>& spans,
               const std::vector<std::pair<double, double>>& windows) {
  double total = 0;
  for (const auto& [wa, wb] : windows) {
    std::vector<std::pair<double, double>> in;
    for (const auto& [a, b] : spans)
      if (a >= wa && a < wb) in.push_back({a, std::min(b, wb)});
    std::sort(in.begin(), in.end());
    double cur_a = 0, cur_b = -1e300;
    for (const auto& [a, b] : in) {
      if (a > cur_b) {
        if (cur_b > cur_a) total += cur_b - cur_a;
        cur_a = a, cur_b = b;
      } else {
        cur_b = std::max(cur_b, b);
      }
    }
    if (cur_b > cur_a) total += cur_b - cur_a;
  }
  return total / 1000;
}

TEST(ProfileRealRun, PeaksEqualMetricsAndStreamBusyTimesEqualTheTrace) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  const TracedRun& run = traced_run();
  ASSERT_TRUE(run.ok) << run.log;
  auto res = stp::testing::run_stp("profile " + (run.dir / "out").string() + " --json");
  ASSERT_EQ(res.status, 0) << res.err;
  nlohmann::json report = nlohmann::json::parse(res.out);

  // Peaks: the last metrics line holds the allocators' peaks since the start.
  std::string metrics = read(run.dir / "out" / "metrics.jsonl");
  std::string last = metrics.substr(metrics.rfind('\n', metrics.size() - 2) + 1);
  nlohmann::json m = nlohmann::json::parse(last);
  const auto& ranks = report.at("ranks");
  ASSERT_EQ(ranks.size(), 4u);
  for (const nlohmann::json& r : ranks) {
    auto g = static_cast<std::size_t>(r.at("rank").get<std::int64_t>());
    EXPECT_EQ(r.at("peak_device_bytes").get<double>(), m.at("peak_device_bytes").at(g).get<double>()) << "rank " << g;
    EXPECT_GT(r.at("peak_pinned_bytes").get<double>(), 0) << "rank " << g << " offloads";
    EXPECT_GT(r.at("d2h_bytes").get<double>(), 0);
    EXPECT_EQ(r.at("d2h_bytes").get<double>(), r.at("h2d_bytes").get<double>());  // every offloaded byte comes back
  }
  // The planner's dry run predicts the same peaks exactly on the CPU backend.
  for (const nlohmann::json& p : report.at("predicted").at("peak_device_bytes"))
    EXPECT_EQ(p.at("measured").get<double>(), p.at("predicted").get<double>())
        << "rank " << p.at("rank").get<std::int64_t>();

  // Stream busy times: the report (per step, over the steps analysed) against the trace itself.
  std::set<std::int64_t> analysed;
  for (const nlohmann::json& s : report.at("steps")) analysed.insert(s.get<std::int64_t>());
  EXPECT_EQ(analysed, (std::set<std::int64_t>{2, 3}));  // step 1 (warm-up) left out
  nlohmann::json trace = nlohmann::json::parse(read(run.dir / "out" / "trace.json"));
  std::map<std::pair<std::int64_t, std::int64_t>, std::string> stream_of;
  for (const nlohmann::json& e : trace.at("traceEvents"))
    if (e.at("ph").get<std::string>() == "M" && e.at("name").get<std::string>() == "thread_name")
      stream_of[{e.at("pid").get<std::int64_t>(), e.at("tid").get<std::int64_t>()}] =
          e.at("args").at("name").get<std::string>();
  std::map<std::int64_t, std::vector<std::pair<double, double>>> windows;
  std::map<std::pair<std::int64_t, std::string>, std::vector<std::pair<double, double>>> spans;
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    if (e.at("ph").get<std::string>() != "X") continue;
    std::int64_t pid = e.at("pid").get<std::int64_t>();
    std::string stream = stream_of.at({pid, e.at("tid").get<std::int64_t>()});
    std::string cat = e.at("cat").get<std::string>(), name = e.at("name").get<std::string>();
    double a = e.at("ts").get<double>(), b = a + e.at("dur").get<double>();
    if (cat == "step") {
      if (analysed.count(std::stoll(name.substr(5)))) windows[pid].push_back({a, b});
      continue;
    }
    if (stream == "compute" && cat != "F" && cat != "B" && cat != "W") continue;  // ops nest the units
    spans[{pid, stream}].push_back({a, b});
  }
  for (const nlohmann::json& r : ranks) {
    std::int64_t pid = r.at("rank").get<std::int64_t>();
    double steps = r.at("steps").get<double>();
    for (const char* stream : {"compute", "tp-comm", "p2p", "d2h", "h2d"}) {
      double want = busy_ms(spans[{pid, stream}], windows[pid]);
      EXPECT_GT(want, 0) << stream;
      EXPECT_NEAR(r.at("streams").at(stream).get<double>() * steps, want, 1e-6 * want + 1e-9)
          << "rank " << pid << " " << stream;
    }
  }
}

TEST(ProfileRealRun, SvgTextAndErrors) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  const TracedRun& run = traced_run();
  ASSERT_TRUE(run.ok) << run.log;
  fs::path svg = run.dir / "timeline.svg";
  auto res = stp::testing::run_stp("profile " + (run.dir / "out").string() + " --svg " + svg.string());
  ASSERT_EQ(res.status, 0) << res.err;
  EXPECT_NE(res.out.find("stp sim --schedule stp --pp 2 --microbatches 4 --tf "), std::string::npos) << res.out;
  EXPECT_NE(res.out.find("peak device memory"), std::string::npos);
  std::string picture = read(svg);
  EXPECT_EQ(picture.rfind("<svg", 0), 0u);
  EXPECT_NE(picture.find("</svg>"), std::string::npos);
  for (const char* row : {">compute<", ">TP<", ">P2P<", ">D2H<", ">H2D<", ">memory<", "rank 3"})
    EXPECT_NE(picture.find(row), std::string::npos) << row;

  // A run folder without a trace, and a truncated trace: one-line errors naming the file.
  fs::path bare = run.dir / "bare";
  fs::create_directories(bare);
  auto missing = stp::testing::run_stp("profile " + bare.string());
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.err.find((bare / "trace.json").string()), std::string::npos) << missing.err;
  std::string whole = read(run.dir / "out" / "trace.json");
  std::ofstream(bare / "trace.json") << whole.substr(0, whole.size() / 3);
  auto truncated = stp::testing::run_stp("profile " + bare.string());
  EXPECT_EQ(truncated.status, 1);
  EXPECT_NE(truncated.err.find("truncated"), std::string::npos) << truncated.err;
  EXPECT_NE(truncated.err.find((bare / "trace.json").string()), std::string::npos) << truncated.err;
}

}  // namespace
