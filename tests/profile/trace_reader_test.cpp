// The trace reader (profile/trace_reader.h): the Chrome format in its forms, and clear errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "base/trace.h"
#include "profile/trace_reader.h"
#include "tests/profile/trace_builder.h"

namespace {

using stp::profile::Kind;
using stp::profile::Lane;
using stp::profile::parse_trace;

void expect_error(const std::string& json, const std::string& needle) {
  try {
    parse_trace(json, "t.json");
    FAIL() << "no error for: " << json;
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("t.json"), std::string::npos) << e.what();
  }
}

TEST(TraceReader, ReadsSpansArgsCountersAndLanesFromMetadataThatComesLast) {
  stp::testing::TraceBuilder b;
  b.x(3, "compute", "F1.2 h.3.attn", "F", 100, 50, R"({"part":"F1.2","unit":1,"mb":2,"chunk":1,"pass":"F"})")
      .x(3, "tp-comm", "AR F1.2 h.3.attn", "tp-comm", 150, 20, R"({"part":"F1.2","bytes":4096})")
      .x(3, "d2h", "offload 1.2 u1", "d2h", 160, 5, R"({"bytes":1e6,"chunk":1,"mb":2,"nested":{"a":[1,{"b":null}]}})")
      .x(3, "weird", "x", "misc", 1, 1)
      .c(3, "device memory", 155, R"({"weights":10,"activations":2.5e3})");
  auto t = parse_trace(b.json(), "t.json");
  ASSERT_EQ(t.spans.size(), 4u);
  const auto& f = t.spans[0];
  EXPECT_EQ(f.pid, 3);
  EXPECT_EQ(f.lane, Lane::Compute);
  EXPECT_EQ(f.kind, Kind::F);
  EXPECT_EQ(t.str(f.name), "F1.2 h.3.attn");
  EXPECT_EQ(t.str(f.part), "F1.2");
  EXPECT_DOUBLE_EQ(f.ts, 100);
  EXPECT_DOUBLE_EQ(f.end, 150);
  EXPECT_EQ(f.mb, 2);
  EXPECT_EQ(f.chunk, 1);
  EXPECT_DOUBLE_EQ(f.bytes, -1);
  EXPECT_EQ(t.spans[1].lane, Lane::TpComm);
  EXPECT_DOUBLE_EQ(t.spans[1].bytes, 4096);
  EXPECT_EQ(t.spans[2].lane, Lane::D2h);
  EXPECT_DOUBLE_EQ(t.spans[2].bytes, 1e6);
  EXPECT_EQ(t.spans[3].lane, Lane::Other);
  ASSERT_EQ(t.counters.size(), 1u);
  EXPECT_EQ(t.str(t.counters[0].track), "device memory");
  EXPECT_DOUBLE_EQ(t.total(t.counters[0]), 2510);
  EXPECT_EQ(t.counters[0].end - t.counters[0].begin, 2u);
}

TEST(TraceReader, AcceptsTheArrayFormStringTidsAndEscapes) {
  std::string json = R"([{"ph":"X","pid":0,"tid":"p2p","name":"send \"a\"\u00e9\n","cat":"p2p","ts":1.5,"dur":2},
                         {"ph":"B","pid":0,"tid":1,"ts":3}, {"ph":"i","pid":0,"ts":4,"s":"g"}])";
  auto t = parse_trace(json, "t.json");
  ASSERT_EQ(t.spans.size(), 1u);
  EXPECT_EQ(t.spans[0].lane, Lane::P2p);
  EXPECT_EQ(t.str(t.spans[0].name), "send \"a\"\xc3\xa9\n");
  EXPECT_DOUBLE_EQ(t.spans[0].end, 3.5);
}

TEST(TraceReader, RoundTripsTheRecorder) {
  stp::TraceRecorder rec;
  rec.add({1, "h2d", "reload 0.3", "h2d", stp::TraceArgs().add("bytes", 512), 10, 4});
  rec.add({1, "compute", "B0.3 h.0.mlp", "B", stp::TraceArgs().add("part", "B0.3"), 12, 3});
  rec.add_counter({1, "pinned memory", 11, {{"activations", 512}}});
  auto t = stp::profile::from_recorder(rec);
  ASSERT_EQ(t.spans.size(), 2u);
  EXPECT_EQ(t.spans[0].lane, Lane::H2d);
  EXPECT_DOUBLE_EQ(t.spans[0].bytes, 512);
  EXPECT_EQ(t.spans[1].kind, Kind::B);
  ASSERT_EQ(t.counters.size(), 1u);
  EXPECT_EQ(t.str(t.counters[0].track), "pinned memory");
}

TEST(TraceReader, MalformedOrTruncatedTracesAreErrorsNamingTheFile) {
  stp::testing::TraceBuilder b;
  b.x(0, "compute", "F0.1 embed", "F", 0, 10);
  std::string good = b.json();
  expect_error(good.substr(0, good.size() / 2), "truncated");
  expect_error(R"({"traceEvents":[{"ph":"X","pid":0,"tid":1,"ts":1}]})", "without \"ts\" or \"dur\"");
  expect_error(R"({"traceEvents":[{"ph":"X","pid":0,"tid":1,"ts":1,"dur":-2}]})", "negative");
  expect_error(R"({"traceEvents":[{"ph":"X","pid":"rank 0","tid":1,"ts":1,"dur":2}]})", "pid");
  expect_error(R"({"traceEvents":[{"ph":"X" "pid":0}]})", "byte");
  expect_error(R"({"events":[]})", "traceEvents");
  expect_error(good + "x", "after the trace");
}

TEST(TraceReader, MissingOrEmptyFileIsAnErrorNamingIt) {
  std::string dir = std::string(STP_BINARY_DIR) + "/tests/profile_reader";
  std::filesystem::create_directories(dir);
  std::string missing = dir + "/nope.json", empty = dir + "/empty.json";
  std::ofstream(empty).close();
  for (const std::string& path : {missing, empty}) {
    try {
      stp::profile::read_trace_file(path);
      FAIL() << path;
    } catch (const stp::Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
}

}  // namespace
