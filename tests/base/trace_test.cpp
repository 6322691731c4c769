// The trace recorder exports spans and counters as Chrome Trace Event Format JSON (docs/design.md, Files).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/json.h"
#include "base/trace.h"

namespace {

TEST(Trace, WriteProducesAFileThatParses) {
  stp::TraceRecorder rec;
  rec.add({0, "tp-comm", "AR", "comm", "", 1.0, 2.5});
  std::string path = std::string(STP_BINARY_DIR) + "/trace_test.json";
  rec.write(path);
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  auto json = stp::Json::parse(ss.str());
  const auto& events = json["traceEvents"].as_array();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["dur"].as_number(), 2.5);
  EXPECT_THROW(rec.write("/nonexistent-dir/x/trace.json"), stp::Error);
}

}  // namespace

namespace {

TEST(Trace, CountersExportAsChromeCounterEvents) {
  stp::TraceRecorder rec;
  rec.add_counter({2, "device memory", 12.5, {{"weights", 1024}, {"activations", 256}}});
  auto json = stp::Json::parse(rec.to_json());
  const stp::Json* counter = nullptr;
  for (const auto& e : json["traceEvents"].as_array())
    if (e["ph"].as_string() == "C") counter = &e;
  ASSERT_NE(counter, nullptr);
  EXPECT_EQ((*counter)["pid"].as_int(), 2);
  EXPECT_EQ((*counter)["name"].as_string(), "device memory");
  EXPECT_EQ((*counter)["ts"].as_number(), 12.5);
  EXPECT_EQ((*counter)["args"]["weights"].as_int(), 1024);
  EXPECT_EQ((*counter)["args"]["activations"].as_int(), 256);
  ASSERT_EQ(rec.counters().size(), 1u);
}

}  // namespace
