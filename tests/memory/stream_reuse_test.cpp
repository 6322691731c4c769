// Use-after-free races of stream-ordered reuse, on the CPU backend (each stream is a thread).
//
// Scenario (PyTorch's test_caching_pinned_memory, torchtune's offload use-after-free tests): a
// block still read by queued work on stream A is dropped by the host right after enqueueing;
// the same bytes are handed out again for stream B, which overwrites them. A correct allocator
// makes B wait for A (event fence), so A reads the old bytes.
//
// To make the outcome deterministic rather than timing-dependent, A's read is held behind a gate
// that the host opens only after giving B ample time (kPatience) to run: with fences B cannot
// finish before the gate opens; without them it finishes at once and A reads the new bytes. The
// gate (a latch) and the events order every access, so the tests are race-free under TSan.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <latch>
#include <memory>
#include <thread>
#include <vector>

#include "core/cpu/cpu_device.h"
#include "core/tensor.h"
#include "memory/block_arena.h"
#include "memory/pinned_pool.h"
#include "tests/support/events.h"

namespace {

using namespace std::chrono_literals;
using Block = std::shared_ptr<stp::Storage>;

constexpr std::uint64_t kOld = 0x01d01d01d01d01d0ull;
constexpr std::uint64_t kNew = 0x0e770e770e770e77ull;
constexpr auto kPatience = 50ms;  // time B gets to overtake A before A may read

void fill(void* p, std::size_t bytes, std::uint64_t v) {
  auto* w = static_cast<std::uint64_t*>(p);
  for (std::size_t i = 0; i < bytes / sizeof v; ++i) w[i] = v;
}

bool all_equal(const void* p, std::size_t bytes, std::uint64_t v) {
  auto* w = static_cast<const std::uint64_t*>(p);
  for (std::size_t i = 0; i < bytes / sizeof v; ++i)
    if (w[i] != v) return false;
  return true;
}

using stp::testing::completes_within;

// A caching allocator without fences: hands its one buffer out again as soon as the host drops
// it (what DeviceAllocator-style reuse without record_use amounts to). The negative control.
class UnfencedAllocator final : public stp::Allocator {
 public:
  UnfencedAllocator(stp::Device& d, std::size_t bytes) : dev_(d), p_(d.allocate(bytes)) {}
  ~UnfencedAllocator() override { dev_.deallocate(p_); }
  Block allocate(std::size_t bytes) override {
    return std::make_shared<stp::Storage>(&dev_, p_, bytes, [](void*, const std::vector<stp::Stream*>&) {});
  }
  stp::Device& device() override { return dev_; }

 private:
  stp::Device& dev_;
  void* p_;
};

struct Outcome {
  bool same_address = false;      // the reuse really handed out the same bytes
  bool b_finished_first = false;  // B's overwrite completed while A had not read yet
  std::uint64_t a_saw = 0;
  std::uint64_t final_value = 0;
};

// Device-memory scenario: A reads the block (gated), the host drops it, B reuses and writes.
Outcome device_scenario(stp::Device& dev, stp::Allocator& alloc, stp::Stream& a, stp::Stream& b,
                        std::chrono::milliseconds patience) {
  constexpr std::size_t kBytes = 64 * 1024;
  Outcome out;
  std::latch gate(1);
  std::uint64_t seen = 0;                      // written on A's worker, read after a.synchronize()
  Block block = alloc.allocate_on(kBytes, a);  // A is its only user
  void* first = block->data;
  fill(first, kBytes, kOld);
  a.enqueue_host([&gate, &seen, first] {
    gate.wait();
    seen = *static_cast<const std::uint64_t*>(first);
  });
  block->record_use(a);
  block.reset();  // the host is done with it; A is not

  Block again = alloc.allocate_on(kBytes, b);
  out.same_address = again->data == first;
  b.enqueue_host([p = again->data] { fill(p, kBytes, kNew); });
  auto done = dev.create_event();
  b.record(*done);
  out.b_finished_first = completes_within(*done, patience);
  gate.count_down();
  a.synchronize();
  b.synchronize();
  out.a_saw = seen;
  out.final_value = *static_cast<const std::uint64_t*>(again->data);
  return out;
}

TEST(StreamReuse, DeviceArenaMakesTheReusingStreamWait) {
  stp::CpuDevice dev(0, {});
  auto home = dev.create_stream("home"), a = dev.create_stream("A"), b = dev.create_stream("B");
  stp::BlockArena arena(dev, *home, stp::device_arena_options(dev));
  Outcome o = device_scenario(dev, arena, *a, *b, kPatience);
  ASSERT_TRUE(o.same_address) << "the arena did not reuse the block: the test proves nothing";
  EXPECT_FALSE(o.b_finished_first) << "B overwrote the block while A's read was still queued";
  EXPECT_EQ(o.a_saw, kOld);
  EXPECT_EQ(o.final_value, kNew);
  auto s = arena.stats();
  EXPECT_EQ(s.stream_waits, 1u);  // B after A
  EXPECT_EQ(s.segment_allocs, 1u);
}

TEST(StreamReuse, WithoutFencesTheReuseOvertakesTheReader) {
  // Negative control: the same scenario observes the corruption the fence prevents.
  stp::CpuDevice dev(0, {});
  auto a = dev.create_stream("A"), b = dev.create_stream("B");
  UnfencedAllocator unfenced(dev, 64 * 1024);
  Outcome o = device_scenario(dev, unfenced, *a, *b, 10s);  // returns as soon as B is done
  ASSERT_TRUE(o.same_address);
  EXPECT_TRUE(o.b_finished_first);
  EXPECT_EQ(o.a_saw, kNew);
}

// Pinned-pool scenario with a slow emulated link: an H2D copy still reads a pool buffer when the
// host drops it; the pool hands the bytes to a D2H copy on the pool's home stream.
struct PinnedOutcome {
  bool same_address = false;
  bool d2h_finished_first = false;
  bool h2d_got_old = false;
  bool pool_got_new = false;
  std::size_t allocated_after_drop = 0;
  std::uint64_t stream_waits = 0;
};

PinnedOutcome pinned_scenario(bool record_h2d_use, std::chrono::milliseconds patience) {
  constexpr std::size_t kBytes = 4 << 20;
  stp::CpuDeviceOptions opts;
  opts.link_bytes_per_s = 40e6;  // 4 MiB take ~105 ms each way
  stp::CpuDevice dev(0, opts);
  auto d2h = dev.create_stream("d2h"), h2d = dev.create_stream("h2d");
  stp::PinnedPool pool(dev, *d2h, {.bytes = 2 * kBytes, .host_budget = 2 * kBytes});
  void* dev_dst = dev.allocate(kBytes);
  void* dev_src = dev.allocate(kBytes);
  fill(dev_src, kBytes, kNew);

  PinnedOutcome out;
  std::latch gate(1);
  Block host = pool.allocate(kBytes);  // first user: d2h, the pool's home
  void* first = host->data;
  fill(first, kBytes, kOld);
  h2d->enqueue_host([&gate] { gate.wait(); });
  h2d->copy(dev_dst, first, kBytes);  // reads the pool buffer, slowly
  if (record_h2d_use) host->record_use(*h2d);
  host.reset();
  out.allocated_after_drop = pool.stats().allocated;  // host program order: free now

  Block again = pool.allocate_on(kBytes, *d2h);
  out.same_address = again->data == first;
  d2h->copy(again->data, dev_src, kBytes);  // D2H overwrites the reused pool bytes
  auto done = dev.create_event();
  d2h->record(*done);
  out.d2h_finished_first = completes_within(*done, patience);
  gate.count_down();
  h2d->synchronize();
  d2h->synchronize();
  out.h2d_got_old = all_equal(dev_dst, kBytes, kOld);
  out.pool_got_new = all_equal(again->data, kBytes, kNew);
  out.stream_waits = pool.stats().stream_waits;
  again.reset();
  dev.deallocate(dev_dst);
  dev.deallocate(dev_src);
  return out;
}

TEST(StreamReuse, PinnedPoolBufferWaitsForTheSlowH2DCopy) {
  PinnedOutcome o = pinned_scenario(/*record_h2d_use=*/true, kPatience);
  ASSERT_TRUE(o.same_address) << "the pool did not reuse the buffer: the test proves nothing";
  EXPECT_EQ(o.allocated_after_drop, 0u);
  EXPECT_FALSE(o.d2h_finished_first) << "the D2H copy overwrote the buffer the H2D copy was reading";
  EXPECT_TRUE(o.h2d_got_old);
  EXPECT_TRUE(o.pool_got_new);
  EXPECT_EQ(o.stream_waits, 1u);
}

TEST(StreamReuse, PinnedPoolWithoutRecordUseIsUnsafe) {
  // Negative control: the fence is only as good as record_use. Without it the pool sees only
  // its home stream, reuses at once, and the H2D copy delivers the D2H's new bytes.
  PinnedOutcome o = pinned_scenario(/*record_h2d_use=*/false, 10s);
  ASSERT_TRUE(o.same_address);
  EXPECT_TRUE(o.d2h_finished_first);
  EXPECT_FALSE(o.h2d_got_old);
  EXPECT_EQ(o.stream_waits, 0u);
}

}  // namespace
