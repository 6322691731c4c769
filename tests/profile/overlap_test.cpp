// Every number of the overlap and memory report checked against hand-computed values on
// synthetic traces with known overlaps: none, full, partial, nested streams, copies, steps.
// Times are written in µs; the report is in ms (1000 µs = 1 ms).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "profile/memory.h"
#include "profile/overlap.h"
#include "profile/report.h"
#include "profile/trace_reader.h"
#include "tests/profile/trace_builder.h"

namespace {

using stp::profile::Lane;
using stp::profile::RankTimes;
using stp::testing::TraceBuilder;

constexpr double ms = 1000;  // µs

RankTimes measure_one(const TraceBuilder& b, stp::profile::StepFilter f = {}) {
  auto t = stp::profile::parse_trace(b.json(), "synthetic");
  auto ranks = stp::profile::timelines(t);
  EXPECT_EQ(ranks.size(), 1u);
  return stp::profile::measure(ranks.at(0), f);
}

double lane(const RankTimes& m, Lane l) { return m.lane_busy_ms[static_cast<std::size_t>(l)]; }

TEST(Overlap, NoOverlapEverythingExposed) {
  // compute [0,10) [30,40); all-reduce [10,20); receive [20,25); nothing [25,30)
  TraceBuilder b;
  b.x(0, "compute", "F0.1 a", "F", 0, 10 * ms, R"({"part":"F0.1"})")
      .x(0, "compute", "F0.1 b", "F", 30 * ms, 10 * ms, R"({"part":"F0.1"})")
      .x(0, "tp-comm", "AR F0.1 a", "tp-comm", 10 * ms, 10 * ms, R"({"part":"F0.1"})")
      .x(0, "p2p", "recv x", "p2p", 20 * ms, 5 * ms);
  RankTimes m = measure_one(b);
  EXPECT_EQ(m.steps, 1);
  EXPECT_DOUBLE_EQ(m.step_ms, 40);
  EXPECT_DOUBLE_EQ(m.span_ms, 40);
  EXPECT_DOUBLE_EQ(m.busy_ms, 20);
  EXPECT_DOUBLE_EQ(m.busy_fraction(), 0.5);
  EXPECT_DOUBLE_EQ(m.tp_ms, 10);
  EXPECT_DOUBLE_EQ(m.tp_exposed_ms, 10);
  EXPECT_DOUBLE_EQ(m.p2p_ms, 5);
  EXPECT_DOUBLE_EQ(m.p2p_exposed_ms, 5);
  EXPECT_DOUBLE_EQ(m.bubble_ms, 10);
  EXPECT_DOUBLE_EQ(m.p2p_wait_ms, 5);
  EXPECT_DOUBLE_EQ(m.copy_stall_ms, 0);
  EXPECT_DOUBLE_EQ(m.issue_gap_ms, 5);
  EXPECT_DOUBLE_EQ(lane(m, Lane::Compute), 20);
  EXPECT_DOUBLE_EQ(lane(m, Lane::TpComm), 10);
  EXPECT_DOUBLE_EQ(lane(m, Lane::P2p), 5);
}

TEST(Overlap, FullOverlapNothingExposed) {
  // compute [0,40) (two touching units); all-reduce [10,20) and receive [20,25) under it
  TraceBuilder b;
  b.x(0, "compute", "F0.1 a", "F", 0, 20 * ms).x(0, "compute", "B0.1 a", "B", 20 * ms, 20 * ms);
  b.x(0, "tp-comm", "AR", "tp-comm", 10 * ms, 10 * ms).x(0, "p2p", "recv y", "p2p", 20 * ms, 5 * ms);
  RankTimes m = measure_one(b);
  EXPECT_DOUBLE_EQ(m.span_ms, 40);
  EXPECT_DOUBLE_EQ(m.busy_ms, 40);
  EXPECT_DOUBLE_EQ(m.busy_fraction(), 1);
  EXPECT_DOUBLE_EQ(m.tp_ms, 10);
  EXPECT_DOUBLE_EQ(m.tp_exposed_ms, 0);
  EXPECT_DOUBLE_EQ(m.p2p_exposed_ms, 0);
  EXPECT_DOUBLE_EQ(m.bubble_ms, 0);
  EXPECT_DOUBLE_EQ(m.issue_gap_ms, 0);
}

TEST(Overlap, PartialOverlap) {
  // compute [0,10) [20,30); all-reduce [5,15): 5 hidden, 5 exposed; [15,20) idle with nothing
  TraceBuilder b;
  b.x(0, "compute", "F0.1 a", "F", 0, 10 * ms).x(0, "compute", "F0.2 a", "F", 20 * ms, 10 * ms);
  b.x(0, "tp-comm", "AR", "tp-comm", 5 * ms, 10 * ms);
  // two overlapping sends count once in the lane's busy time: [16,18) ∪ [17,19) = 3 ms, exposed
  b.x(0, "p2p", "send a", "p2p", 16 * ms, 2 * ms).x(0, "p2p", "send b", "p2p", 17 * ms, 2 * ms);
  RankTimes m = measure_one(b);
  EXPECT_DOUBLE_EQ(m.span_ms, 30);
  EXPECT_DOUBLE_EQ(m.busy_ms, 20);
  EXPECT_DOUBLE_EQ(m.tp_ms, 10);
  EXPECT_DOUBLE_EQ(m.tp_exposed_ms, 5);
  EXPECT_DOUBLE_EQ(m.p2p_ms, 3);
  EXPECT_DOUBLE_EQ(m.p2p_exposed_ms, 3);
  EXPECT_DOUBLE_EQ(m.bubble_ms, 5);  // 30 - 20 - 5
  EXPECT_DOUBLE_EQ(m.p2p_wait_ms, 3);
  EXPECT_DOUBLE_EQ(m.issue_gap_ms, 2);
}

// Nested streams: a step span holds op spans that hold the units; none of the outer spans is
// compute work. Copies with bytes: achieved GB/s, hidden fraction and the stall they cause.
TraceBuilder nested() {
  TraceBuilder b;
  b.x(0, "compute", "step 1", "step", -5 * ms, 45 * ms);
  b.x(0, "compute", "F0.1", "op", 0, 12 * ms).x(0, "compute", "B0.1", "op", 15 * ms, 15 * ms);
  b.x(0, "compute", "F0.1 a", "F", 0, 10 * ms, R"({"part":"F0.1"})");
  b.x(0, "compute", "B0.1 a", "B", 15 * ms, 15 * ms, R"({"part":"B0.1"})");
  b.x(0, "d2h", "offload 0.1 u0", "d2h", 5 * ms, 7 * ms, R"({"bytes":7e6})");  // 1 GB/s
  b.x(0, "h2d", "reload 0.1", "h2d", 12 * ms, 6 * ms, R"({"bytes":3e6})");     // 0.5 GB/s
  b.x(0, "other", "host work", "misc", 0, 30 * ms);
  b.c(0, "device memory", -5 * ms, R"({"weights":10,"activations":0})");
  b.c(0, "device memory", 5 * ms, R"({"weights":10,"activations":20})");
  b.c(0, "device memory", 8 * ms, R"({"weights":10,"activations":50})");  // peak 60, during F0.1
  b.c(0, "device memory", 14 * ms, R"({"weights":10,"activations":10})");
  b.c(0, "device memory", 20 * ms, R"({"weights":10,"activations":40})");  // 50, during B0.1
  b.c(0, "device memory", 25 * ms, R"({"weights":10,"activations":5})");
  b.c(0, "pinned memory", 6 * ms, R"({"activations":30})");
  b.c(0, "pinned memory", 13 * ms, R"({"activations":0})");
  return b;
}

TEST(Overlap, NestedStreamsAndCopies) {
  RankTimes m = measure_one(nested());
  EXPECT_DOUBLE_EQ(m.step_ms, 45);
  EXPECT_DOUBLE_EQ(m.span_ms, 30);
  EXPECT_DOUBLE_EQ(m.busy_ms, 25);  // the units, not the op or step spans
  EXPECT_DOUBLE_EQ(m.d2h_bytes, 7e6);
  EXPECT_DOUBLE_EQ(m.h2d_bytes, 3e6);
  EXPECT_DOUBLE_EQ(m.d2h_ms, 7);
  EXPECT_DOUBLE_EQ(m.h2d_ms, 6);
  EXPECT_DOUBLE_EQ(m.d2h_gbps(), 1.0);
  EXPECT_DOUBLE_EQ(m.h2d_gbps(), 0.5);
  EXPECT_DOUBLE_EQ(m.copy_ms, 13);        // [5,18)
  EXPECT_DOUBLE_EQ(m.copy_hidden_ms, 8);  // [5,10) + [15,18)
  EXPECT_DOUBLE_EQ(m.copy_hidden_fraction(), 8.0 / 13.0);
  EXPECT_DOUBLE_EQ(m.copy_stall_ms, 5);  // [10,15): only copies in flight
  EXPECT_DOUBLE_EQ(m.bubble_ms, 5);
  EXPECT_DOUBLE_EQ(m.issue_gap_ms, 0);
  EXPECT_DOUBLE_EQ(lane(m, Lane::Other), 30);
}

TEST(Overlap, MemoryPeaksAndHighWaterMoments) {
  auto t = stp::profile::parse_trace(nested().json(), "synthetic");
  auto ranks = stp::profile::timelines(t);
  auto mem = stp::profile::memory_report(t, ranks.at(0));
  EXPECT_DOUBLE_EQ(mem.peak_device, 60);
  EXPECT_DOUBLE_EQ(mem.peak_pinned, 30);
  ASSERT_EQ(mem.high_water.size(), 2u);  // two local maxima, in different ops
  EXPECT_DOUBLE_EQ(mem.high_water[0].total, 60);
  EXPECT_EQ(mem.high_water[0].op, "F0.1");
  EXPECT_EQ(mem.high_water[0].step, 1);
  EXPECT_DOUBLE_EQ(mem.high_water[0].into_step_ms, 13);  // 8 ms, the step began at -5 ms
  ASSERT_EQ(mem.high_water[0].by_category.size(), 2u);
  EXPECT_EQ(mem.high_water[0].by_category[1].first, "activations");
  EXPECT_DOUBLE_EQ(mem.high_water[0].by_category[1].second, 50);
  EXPECT_DOUBLE_EQ(mem.high_water[1].total, 50);
  EXPECT_EQ(mem.high_water[1].op, "B0.1");
}

TEST(Overlap, StepsAreWindowsAndTheFilterPicksThem) {
  // Two steps of the no-overlap pattern shifted by 100 ms; step 2's all-reduce is twice as long.
  TraceBuilder b;
  for (int s = 0; s < 2; ++s) {
    double o = s * 100 * ms;
    b.x(0, "compute", "step " + std::to_string(s + 1), "step", o - ms, 50 * ms);
    b.x(0, "compute", "F0.1 a", "F", o, 10 * ms).x(0, "compute", "F0.1 b", "F", o + 30 * ms, 10 * ms);
    b.x(0, "tp-comm", "AR", "tp-comm", o + 10 * ms, (s + 1) * 10 * ms);
  }
  RankTimes all = measure_one(b);
  EXPECT_EQ(all.steps, 2);
  EXPECT_DOUBLE_EQ(all.step_ms, 100);
  EXPECT_DOUBLE_EQ(all.tp_exposed_ms, 10 + 20);
  stp::profile::StepFilter second;
  second.first = 2;
  RankTimes two = measure_one(b, second);
  EXPECT_EQ(two.steps, 1);
  EXPECT_DOUBLE_EQ(two.tp_exposed_ms, 20);
  EXPECT_DOUBLE_EQ(two.issue_gap_ms, 0);
  EXPECT_DOUBLE_EQ(two.bubble_ms, 0);
}

TEST(Overlap, JsonReportHasThePerStepNumbers) {
  auto t = stp::profile::parse_trace(nested().json(), "synthetic");
  auto ranks = stp::profile::timelines(t);
  auto report = stp::profile::measure_run(t, ranks, {});
  report.run = "synthetic";
  auto j = nlohmann::json::parse(stp::profile::render_json(report));
  const auto& r = j.at("ranks").at(0);
  EXPECT_EQ(r.at("rank").get<std::int64_t>(), 0);
  EXPECT_DOUBLE_EQ(r.at("compute_busy_fraction").get<double>(), 25.0 / 30.0);
  EXPECT_DOUBLE_EQ(r.at("pp_bubble_ms").get<double>(), 5);
  EXPECT_DOUBLE_EQ(r.at("copy_stall_ms").get<double>(), 5);
  EXPECT_DOUBLE_EQ(r.at("d2h_bytes").get<double>(), 7e6);
  EXPECT_DOUBLE_EQ(r.at("peak_device_bytes").get<double>(), 60);
  EXPECT_DOUBLE_EQ(r.at("streams").at("compute").get<double>(), 25);
  EXPECT_EQ(j.at("steps").size(), 1u);
  // The text report names every rank and says where the bubble went.
  std::string text = stp::profile::render_text(report);
  EXPECT_NE(text.find("bubble = p2p wait + copy stall + issue gap"), std::string::npos);
}

}  // namespace
