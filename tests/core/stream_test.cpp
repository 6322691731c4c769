// Stream and event semantics of the CPU backend (core/device.h contract).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "core/cpu/cpu_device.h"
#include "base/error.h"

using namespace std::chrono_literals;

namespace {

struct CpuStreams : ::testing::Test {
  std::vector<std::unique_ptr<stp::CpuDevice>> devs = stp::make_cpu_devices(2);
  stp::Device& dev = *devs[0];
};

TEST_F(CpuStreams, StreamRunsTasksInFifoOrder) {
  auto s = dev.create_stream("compute");
  std::vector<int> order;  // touched only by the stream's worker until synchronize()
  for (int i = 0; i < 1000; ++i) s->enqueue_host([&order, i] { order.push_back(i); });
  s->synchronize();
  ASSERT_EQ(order.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
}

TEST_F(CpuStreams, EnqueueIsAsynchronousToTheCaller) {
  auto s = dev.create_stream("compute");
  std::atomic<bool> release{false}, ran{false};
  s->enqueue_host([&] {
    while (!release.load()) std::this_thread::sleep_for(1ms);
  });
  s->enqueue_host([&] { ran = true; });
  EXPECT_FALSE(ran.load());  // the caller got control back while the stream is blocked
  release = true;
  s->synchronize();
  EXPECT_TRUE(ran.load());
}

TEST_F(CpuStreams, StreamWaitNeverRunsAheadOfASlowProducer) {
  auto producer = dev.create_stream("producer");
  auto consumer = dev.create_stream("consumer");
  auto ready = dev.create_event();
  for (int round = 0; round < 20; ++round) {
    std::atomic<int> value{0};
    int seen = -1;
    producer->enqueue_host([&] {
      std::this_thread::sleep_for(2ms);  // deliberately slow
      value = 42;
    });
    producer->record(*ready);
    consumer->wait(*ready);
    consumer->enqueue_host([&] { seen = value.load(); });
    consumer->synchronize();
    EXPECT_EQ(seen, 42) << "round " << round;
  }
}

TEST_F(CpuStreams, WaitCapturesTheRecordMadeBeforeTheCallOnly) {
  auto a = dev.create_stream("a");
  auto b = dev.create_stream("b");
  auto e = dev.create_event();
  std::atomic<bool> gate{false};
  a->record(*e);  // generation 1: completes at once
  b->wait(*e);    // waits for generation 1 only
  a->enqueue_host([&] {
    while (!gate.load()) std::this_thread::sleep_for(1ms);
  });
  a->record(*e);  // generation 2: blocked behind the gate
  std::atomic<bool> b_ran{false};
  b->enqueue_host([&] { b_ran = true; });
  b->synchronize();  // must not deadlock: b waited for generation 1
  EXPECT_TRUE(b_ran.load());
  EXPECT_FALSE(e->query());  // generation 2 still pending
  gate = true;
  a->synchronize();
  EXPECT_TRUE(e->query());
}

TEST_F(CpuStreams, WaitOnNeverRecordedEventIsANoOp) {
  auto s = dev.create_stream("s");
  auto e = dev.create_event();
  EXPECT_TRUE(e->query());
  s->wait(*e);
  s->synchronize();
}

TEST_F(CpuStreams, HostWaitBlocksUntilExactlyThatPoint) {
  auto s = dev.create_stream("s");
  auto e = dev.create_event();
  std::atomic<int> stage{0};
  std::atomic<bool> gate{false};
  s->enqueue_host([&] {
    std::this_thread::sleep_for(5ms);
    stage = 1;
  });
  s->record(*e);
  s->enqueue_host([&] {
    while (!gate.load()) std::this_thread::sleep_for(1ms);
    stage = 2;
  });
  e->synchronize();
  EXPECT_EQ(stage.load(), 1);  // everything before the record ran, nothing after it
  EXPECT_TRUE(e->query());
  gate = true;
  s->synchronize();
  EXPECT_EQ(stage.load(), 2);
}

TEST_F(CpuStreams, EventsWorkAcrossDevices) {
  auto s0 = devs[0]->create_stream("s0");
  auto s1 = devs[1]->create_stream("s1");
  auto e = devs[0]->create_event();
  std::atomic<int> v{0};
  int seen = 0;
  s0->enqueue_host([&] {
    std::this_thread::sleep_for(3ms);
    v = 7;
  });
  s0->record(*e);
  s1->wait(*e);
  s1->enqueue_host([&] { seen = v.load(); });
  s1->synchronize();
  EXPECT_EQ(seen, 7);
}

TEST_F(CpuStreams, ErrorInStreamWorkIsRethrownAtSynchronizeAndSkipsLaterWork) {
  auto s = dev.create_stream("s");
  auto other = dev.create_stream("other");
  auto e = dev.create_event();
  bool later_ran = false;
  s->enqueue_host([] { throw stp::Error("kernel failed"); });
  s->enqueue_host([&] { later_ran = true; });
  s->record(*e);  // still completes, so `other` does not hang
  other->wait(*e);
  other->synchronize();
  EXPECT_THROW(
      {
        try {
          s->synchronize();
        } catch (const stp::Error& err) {
          EXPECT_STREQ(err.what(), "kernel failed");
          throw;
        }
      },
      stp::Error);
  EXPECT_FALSE(later_ran);
  s->synchronize();  // the error was reported once
}

TEST_F(CpuStreams, AsyncCopyIsByteExactAndSourceReusableAfterItsEvent) {
  auto copy = dev.create_stream("d2h");
  auto done = dev.create_event();
  const std::size_t n = 1 << 20;
  auto* src = static_cast<unsigned char*>(dev.allocate(n));
  auto* dst = static_cast<unsigned char*>(dev.allocate_pinned_host(n));
  for (int round = 0; round < 5; ++round) {
    for (std::size_t i = 0; i < n; ++i)
      src[i] = static_cast<unsigned char>((i * 31 + static_cast<std::size_t>(round)) & 0xFF);
    std::vector<unsigned char> expect(src, src + n);
    std::atomic<bool> gate{false};
    copy->enqueue_host([&] {  // delay the copy stream
      while (!gate.load()) std::this_thread::sleep_for(1ms);
    });
    copy->copy(dst, src, n);
    copy->record(*done);
    EXPECT_FALSE(done->query()) << "the copy cannot be complete while its stream is held";
    gate = true;
    done->synchronize();  // only now may src be overwritten
    EXPECT_EQ(std::memcmp(dst, expect.data(), n), 0);
  }
  dev.deallocate(src);
  dev.deallocate_pinned_host(dst);
}

TEST_F(CpuStreams, LinkRateLimitsDeviceHostCopies) {
  stp::CpuDeviceOptions opts;
  opts.link_bytes_per_s = 100e6;  // 100 MB/s: 1 MB takes >= 10 ms
  stp::CpuDevice slow(0, opts);
  auto s = slow.create_stream("h2d");
  const std::size_t n = 1000000;
  void* d = slow.allocate(n);
  void* h = slow.allocate_pinned_host(n);
  auto t0 = std::chrono::steady_clock::now();
  s->copy(d, h, n);
  s->synchronize();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(ms, 10.0);
  slow.deallocate(d);
  slow.deallocate_pinned_host(h);
}

}  // namespace

namespace {

TEST(CpuEvents, DestroyingAnEventWithAPendingRecordIsSafe) {
  stp::CpuDevice dev(0, {});
  auto s = dev.create_stream("s");
  std::atomic<bool> gate{false};
  s->enqueue_host([&] {
    while (!gate.load()) std::this_thread::sleep_for(1ms);
  });
  {
    auto e = dev.create_event();
    s->record(*e);
  }  // destroyed before its record completes (allowed, as with cudaEventDestroy)
  gate = true;
  s->synchronize();
  SUCCEED() << "no use-after-free (checked under ASan/TSan in CI)";
}

// Event::elapsed_ms on the CPU backend: a record's time is when the stream reached it, and asking
// before a record has completed is a bug (CUDA returns cudaErrorNotReady), not a silent zero.
TEST(CpuEvents, ElapsedTimeIsTheTimeBetweenTheRecordsAndNeedsBothCompleted) {
  stp::CpuDevice dev(0, {});
  auto s = dev.create_stream("s");
  auto start = dev.create_timing_event();
  auto end = dev.create_timing_event();
  EXPECT_THROW((void)end->elapsed_ms(*start), stp::InternalError) << "never recorded";
  std::atomic<bool> gate{false};
  s->record(*start);
  s->enqueue_host([&] {
    while (!gate.load()) std::this_thread::sleep_for(1ms);
  });
  s->enqueue_host([] { std::this_thread::sleep_for(20ms); });
  s->record(*end);
  EXPECT_THROW((void)end->elapsed_ms(*start), stp::InternalError) << "end still pending";
  gate = true;
  s->synchronize();
  EXPECT_GE(end->elapsed_ms(*start), 20.0);
  EXPECT_LE(start->elapsed_ms(*end), -20.0);
}

}  // namespace
