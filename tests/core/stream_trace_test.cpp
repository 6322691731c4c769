// Streams record trace spans around their work (Stream::set_trace, trace_begin/trace_end), which the
// recorder exports as Chrome Trace Event Format JSON (docs/design.md, Files).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "base/trace.h"
#include "core/cpu/cpu_device.h"

namespace {

TEST(Trace, SpansCoverTheirStreamWorkAndExportValidChromeJson) {
  auto devs = stp::make_cpu_devices(2);
  stp::TraceRecorder rec;
  auto compute = devs[1]->create_stream("compute");
  compute->set_trace(&rec, 1, "compute");
  compute->trace_begin("F0.3", "F", stp::TraceArgs().add("mb", 3));
  compute->enqueue_host([] { std::this_thread::sleep_for(std::chrono::milliseconds(5)); });
  compute->trace_end();
  compute->trace_begin("name with \"quotes\"", "W");
  compute->trace_end();
  compute->synchronize();

  auto json = nlohmann::json::parse(rec.to_json());
  std::vector<nlohmann::json> events;
  std::string thread_of_tid1;
  for (const auto& e : json.at("traceEvents")) {
    if (e.at("ph").get<std::string>() == "X") events.push_back(e);
    if (e.at("ph").get<std::string>() == "M" && e.at("name").get<std::string>() == "thread_name" &&
        e.at("tid").get<std::int64_t>() == 1)
      thread_of_tid1 = e.at("args").at("name").get<std::string>();
  }
  ASSERT_EQ(events.size(), 2u);
  const auto& e = events[0];
  EXPECT_EQ(e.at("ph").get<std::string>(), "X");
  EXPECT_EQ(e.at("pid").get<std::int64_t>(), 1);
  EXPECT_EQ(e.at("tid").get<std::int64_t>(), 1);  // numeric tid, named by a thread_name metadata event
  EXPECT_EQ(thread_of_tid1, "compute");
  EXPECT_EQ(e.at("name").get<std::string>(), "F0.3");
  EXPECT_EQ(e.at("cat").get<std::string>(), "F");
  EXPECT_EQ(e.at("args").at("mb").get<std::int64_t>(), 3);
  EXPECT_GE(e.at("dur").get<double>(), 5000.0);  // microseconds: the span covers the 5 ms task
  EXPECT_GE(e.at("ts").get<double>(), 0.0);
  EXPECT_EQ(events[1].at("name").get<std::string>(), "name with \"quotes\"");
  EXPECT_GE(events[1].at("ts").get<double>(), e.at("ts").get<double>() + e.at("dur").get<double>());
}

TEST(Trace, NothingIsRecordedWithoutARecorder) {
  auto devs = stp::make_cpu_devices(1);
  stp::TraceRecorder rec;
  auto s = devs[0]->create_stream("compute");
  s->trace_begin("F0.1", "F");  // not attached: no-op
  s->trace_end();
  s->synchronize();
  EXPECT_TRUE(rec.spans().empty());
}

}  // namespace
