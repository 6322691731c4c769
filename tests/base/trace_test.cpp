// The trace recorder exports spans and counters as Chrome Trace Event Format JSON (docs/design.md, Files).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "base/error.h"
#include "base/trace.h"
#include "base/trace_names.h"

namespace {

TEST(Trace, WriteProducesAFileThatParses) {
  stp::TraceRecorder rec;
  rec.add({0, "tp-comm", "AR", "comm", {}, 1.0, 2.5});
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

namespace {

namespace arg = stp::trace::arg;

// Span arguments are typed and export as one JSON object in the order they were added, with
// integers exact: byte for byte what the producers wrote by hand before (a unit's and an offload's
// args here), so every reader of a trace sees the same document.
TEST(TraceArgs, ExportInOrderWithExactIntegers) {
  EXPECT_EQ(stp::TraceArgs().json(), "{}");
  EXPECT_TRUE(stp::TraceArgs().empty());
  auto unit = stp::TraceArgs()
                  .add(arg::kPart, "F0.3")
                  .add(arg::kUnit, 1)
                  .add(arg::kMb, 3)
                  .add(arg::kChunk, 0)
                  .add(arg::kPass, std::string("F"));
  EXPECT_FALSE(unit.empty());
  EXPECT_EQ(unit.json(), R"({"part":"F0.3","unit":1,"mb":3,"chunk":0,"pass":"F"})");
  stp::TraceArgs copy;
  copy.add(arg::kBytes, std::uint64_t{1} << 40).add(arg::kChunk, -1).add(arg::kUnit, 2);
  copy.add(arg::kWeight, true).add("other", false);
  EXPECT_EQ(copy.json(), R"({"bytes":1099511627776,"chunk":-1,"unit":2,"weight":true,"other":false})");
  auto limits = stp::TraceArgs()
                    .add("max", std::numeric_limits<std::uint64_t>::max())
                    .add("min", std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(limits.json(), R"({"max":18446744073709551615,"min":-9223372036854775808})");
  auto parsed = nlohmann::json::parse(limits.json());
  EXPECT_EQ(parsed.at("max").get<std::uint64_t>(), std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(parsed.at("min").get<std::int64_t>(), std::numeric_limits<std::int64_t>::min());
}

// Strings and keys go through json_escape, so any text stays valid JSON (the hand-built strings
// inserted part names unescaped).
TEST(TraceArgs, EscapeStringsAndKeys) {
  const std::string text = "q\"\\\x01\n\xc3\xa9";
  auto args = stp::TraceArgs().add(arg::kPart, text).add("k\"ey", std::string_view("v"));
  auto parsed = nlohmann::json::parse(args.json());
  EXPECT_EQ(parsed.at("part").get<std::string>(), text);
  EXPECT_EQ(parsed.at("k\"ey").get<std::string>(), "v");
  stp::TraceRecorder rec;
  rec.add({0, stp::trace::stream::kCompute, "F0.3 h.0.mlp", stp::trace::cat::kForward, args, 1.0, 2.0});
  auto json = nlohmann::json::parse(rec.to_json());
  EXPECT_EQ(json.at("traceEvents").back().at("args"), parsed);
}

// The five analysed streams keep their fixed tids, in the order of base/trace_names.h; the names
// built from the vocabulary are the ones `stp profile` parses.
TEST(TraceNames, KnownStreamsAndBuiltNames) {
  namespace stream = stp::trace::stream;
  EXPECT_EQ(stp::known_stream_tid(stream::kCompute), 1);
  EXPECT_EQ(stp::known_stream_tid(stream::kTpComm), 2);
  EXPECT_EQ(stp::known_stream_tid(stream::kP2p), 3);
  EXPECT_EQ(stp::known_stream_tid(stream::kD2h), 4);
  EXPECT_EQ(stp::known_stream_tid(stream::kH2d), 5);
  EXPECT_EQ(stp::known_stream_tid(stream::kDpComm), 0);
  EXPECT_EQ(stp::known_stream_tid(stream::kOptimizerCpu), 0);
  EXPECT_EQ(stp::trace::p2p_channel_stream("activations 0->1"), "p2p activations 0->1");
  EXPECT_EQ(stp::trace::step_span(12), "step 12");
  EXPECT_EQ(stp::trace::send_span("m"), "send m");
  EXPECT_EQ(stp::trace::recv_span("m"), "recv m");
  EXPECT_EQ(std::string(stp::trace::cat::kTpComm), stream::kTpComm);
}

}  // namespace
