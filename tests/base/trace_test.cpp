// The trace recorder exports spans and counters as Chrome Trace Event Format JSON (docs/design.md, Files).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "base/error.h"
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
  auto json = nlohmann::json::parse(ss.str());
  const auto& events = json.at("traceEvents");
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().at("dur").get<double>(), 2.5);
  EXPECT_THROW(rec.write("/nonexistent-dir/x/trace.json"), stp::Error);
}

}  // namespace

namespace {

TEST(Trace, CountersExportAsChromeCounterEvents) {
  stp::TraceRecorder rec;
  rec.add_counter({2, "device memory", 12.5, {{"weights", 1024}, {"activations", 256}}});
  auto json = nlohmann::json::parse(rec.to_json());
  const nlohmann::json* counter = nullptr;
  for (const auto& e : json.at("traceEvents"))
    if (e.at("ph").get<std::string>() == "C") counter = &e;
  ASSERT_NE(counter, nullptr);
  EXPECT_EQ((*counter).at("pid").get<std::int64_t>(), 2);
  EXPECT_EQ((*counter).at("name").get<std::string>(), "device memory");
  EXPECT_EQ((*counter).at("ts").get<double>(), 12.5);
  EXPECT_EQ((*counter).at("args").at("weights").get<std::int64_t>(), 1024);
  EXPECT_EQ((*counter).at("args").at("activations").get<std::int64_t>(), 256);
  ASSERT_EQ(rec.counters().size(), 1u);
}

}  // namespace

namespace {

// json_escape is the one escape function of the hand-written trace writer: it must write what
// nlohmann-json (every other document) writes, for every ASCII character.
TEST(Trace, JsonEscapeWritesWhatNlohmannWrites) {
  for (int c = 1; c < 128; ++c) {
    std::string s = std::string("a") + static_cast<char>(c) + "b";
    EXPECT_EQ("\"" + stp::json_escape(s) + "\"", nlohmann::json(s).dump()) << "character " << c;
  }
  std::string utf8 = "r\xc3\xa9sum\xc3\xa9 \xe2\x86\x92";
  EXPECT_EQ(stp::json_escape(utf8), utf8);
  EXPECT_EQ(nlohmann::json::parse("\"" + stp::json_escape("q\"\\\x01\n") + "\"").get<std::string>(), "q\"\\\x01\n");
}

}  // namespace
