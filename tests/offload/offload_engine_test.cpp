// The offload engine on the CPU backend (each stream a thread, an emulated link for copy times):
// records round-trip bitwise, device and host buffers are freed only behind their copies, the
// reload waits for its own offload (and a fault that drops that wait — the reordering bug Megatron-LM
// had — is caught), and the counters (bytes, copy times, consumer stalls) are what happened.
//
// Determinism: races are forced, not hoped for. The D2H stream is held behind a gate (a latch in
// a host task) while the host checks whether later work could overtake it, as in
// tests/memory/stream_reuse_test.cpp.
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
#include "offload/offload_engine.h"
#include "tests/support/events.h"

namespace {

using namespace std::chrono_literals;

constexpr std::int64_t kFloats = 64 * 1024;  // 256 KiB per record
constexpr std::size_t kBytes = kFloats * sizeof(float);

// One rank's pieces: a device with a compute stream, its caching allocator and a pinned pool.
// Reloads go to `reload_arena`, the same arena unless a test needs them apart.
struct Rig {
  explicit Rig(double link_bytes_per_s = 0, stp::OffloadEngineOptions options = {}, bool separate_reloads = false)
      : dev(0, {.link_bytes_per_s = link_bytes_per_s}),
        compute(dev.create_stream("compute")),
        arena(dev, *compute, stp::device_arena_options(dev)),
        other_arena(dev, *compute, stp::device_arena_options(dev)),
        reload_arena(separate_reloads ? other_arena : arena),
        pool(dev, *compute, {.bytes = 16 * kBytes}),
        engine(dev, *compute, reload_arena, pool, options) {}

  // A tensor on compute whose i-th float is seed + i (written by compute, as a forward would).
  stp::Tensor produce(float seed) {
    stp::Tensor t = stp::Tensor::empty_on(arena, *compute, {kFloats});
    compute->enqueue_host([p = static_cast<float*>(t.raw()), seed] {
      for (std::int64_t i = 0; i < kFloats; ++i) p[i] = seed + static_cast<float>(i);
    });
    return t;
  }

  // Copies `t` to the host on `s` (as the consumer would read it) and returns the bytes once s is done.
  std::vector<float> read(const stp::Tensor& t, stp::Stream& s) {
    std::vector<float> out(kFloats);
    s.enqueue_host([&out, p = t.raw()] { std::memcpy(out.data(), p, kBytes); });
    s.synchronize();
    return out;
  }

  stp::CpuDevice dev;
  std::unique_ptr<stp::Stream> compute;
  stp::BlockArena arena;
  stp::BlockArena other_arena;
  stp::BlockArena& reload_arena;
  stp::PinnedPool pool;
  stp::OffloadEngine engine;
};

bool holds(const std::vector<float>& v, float seed) {
  for (std::int64_t i = 0; i < kFloats; ++i)
    if (v[static_cast<std::size_t>(i)] != seed + static_cast<float>(i)) return false;
  return true;
}

using stp::testing::completes_within;

// Holds the D2H stream until open() (or destruction).
struct Gate {
  explicit Gate(stp::Stream& s) {
    s.enqueue_host([this] { latch.wait(); });
  }
  ~Gate() { open(); }
  void open() {
    if (!opened) latch.count_down(), opened = true;
  }
  std::latch latch{1};
  bool opened = false;
};

TEST(OffloadEngine, RoundTripRestoresRecordsBitwiseAndFreesDeviceBytesAtOnce) {
  Rig rig;
  stp::RecordSet set("h.0.mlp.");
  set.save("x", rig.produce(1.0f), stp::RecordReader::B);
  set.save("g", rig.produce(-7.5f), stp::RecordReader::BW);
  set.save("dy", rig.produce(3.0f), stp::RecordReader::W, 'B');  // saved by B: not the engine's
  std::size_t before = rig.arena.stats().allocated;

  rig.engine.offload({1, 1}, 0, set);
  EXPECT_EQ(rig.arena.stats().allocated, before - 2 * kBytes) << "offloaded device bytes must be free at once";
  EXPECT_FALSE(set.list()[0].tensor.defined());
  EXPECT_TRUE(set.list()[2].tensor.defined());

  rig.engine.prefetch({1, 1});
  rig.engine.make_ready({1, 1}, *rig.compute);
  EXPECT_TRUE(holds(rig.read(set.get("x"), *rig.compute), 1.0f));
  EXPECT_TRUE(holds(rig.read(set.get("g"), *rig.compute), -7.5f));
  rig.engine.synchronize();

  stp::OffloadCounters c = rig.engine.counters();
  EXPECT_EQ(c.d2h_bytes, 2 * kBytes);
  EXPECT_EQ(c.h2d_bytes, 2 * kBytes);
  EXPECT_EQ(c.d2h_copies, 2u);
  EXPECT_EQ(c.h2d_copies, 2u);
  EXPECT_EQ(c.late_prefetches, 0u);
  EXPECT_GT(c.d2h_busy_s, 0.0);
  EXPECT_GT(c.h2d_busy_s, 0.0);
  EXPECT_EQ(rig.arena.stats().allocated, before);
  EXPECT_EQ(rig.pool.stats().allocated, 0u) << "host buffers go back to the pool after their reload";
}

TEST(OffloadEngine, SharedRecordsStayAndMakeReadyPrefetchesLateOnes) {
  Rig rig;
  stp::RecordSet set("h.0.attn.");
  stp::Tensor x = rig.produce(2.0f);
  set.save("x", x, stp::RecordReader::B);  // `x` still refers to the bytes: moving frees nothing
  set.save("y", rig.produce(5.0f), stp::RecordReader::B);
  rig.engine.offload({2, 3}, 1, set);
  EXPECT_TRUE(set.list()[0].tensor.defined());
  EXPECT_FALSE(set.list()[1].tensor.defined());
  rig.engine.make_ready({2, 3}, *rig.compute);  // no prefetch first: make_ready issues it
  EXPECT_TRUE(holds(rig.read(set.get("y"), *rig.compute), 5.0f));
  rig.engine.synchronize();
  EXPECT_EQ(rig.engine.counters().skipped_shared, 1u);
  EXPECT_EQ(rig.engine.counters().late_prefetches, 1u);
  EXPECT_EQ(rig.engine.counters().d2h_bytes, kBytes);
}

// A deferred W: the records only W reads stay on the host through B and come back with the
// set's weight key.
TEST(OffloadEngine, WeightOnlyRecordsWaitOnTheHostForADeferredW) {
  Rig rig;
  stp::RecordSet set("h.0.mlp.");
  set.save("h", rig.produce(1.0f), stp::RecordReader::B);
  set.save("gelu", rig.produce(2.0f), stp::RecordReader::W);
  set.save("x", rig.produce(3.0f), stp::RecordReader::BW);
  std::size_t before = rig.arena.stats().allocated;
  rig.engine.offload({1, 2}, 0, set, /*split_weight=*/true);
  rig.engine.make_ready({1, 2}, *rig.compute);  // before B
  EXPECT_TRUE(set.list()[0].tensor.defined());
  EXPECT_FALSE(set.list()[1].tensor.defined()) << "a W-only record came back for B";
  EXPECT_TRUE(set.list()[2].tensor.defined());
  EXPECT_EQ(rig.arena.stats().allocated, before - kBytes);
  rig.engine.make_ready({1, 2, true, 0}, *rig.compute);  // before W(unit 0)
  EXPECT_TRUE(holds(rig.read(set.get("gelu"), *rig.compute), 2.0f));
  EXPECT_TRUE(holds(rig.read(set.get("h"), *rig.compute), 1.0f));
  EXPECT_TRUE(holds(rig.read(set.get("x"), *rig.compute), 3.0f));
  rig.engine.synchronize();
  EXPECT_EQ(rig.engine.counters().h2d_bytes, 3 * kBytes);
  EXPECT_EQ(rig.pool.stats().allocated, 0u);
}

// Filed unit by unit (late reloads): making unit 1's key ready brings back unit 1's records only;
// unit 0's stay on the host, their device bytes free, until their own key is made ready.
TEST(OffloadEngine, UnitKeysBringBackOneUnitAtATime) {
  Rig rig;
  stp::RecordSet u0("h.0.attn."), u1("h.0.mlp.");
  u0.save("x", rig.produce(1.0f), stp::RecordReader::B);
  u1.save("x", rig.produce(2.0f), stp::RecordReader::B);
  u1.save("ln", rig.produce(3.0f), stp::RecordReader::BPrev);  // read by B(0), after B(1)
  const std::size_t before = rig.arena.stats().allocated;
  rig.engine.offload({4, 2, false, 0}, 0, u0);
  rig.engine.offload({4, 2, false, 1}, 1, u1);
  EXPECT_EQ(rig.arena.stats().allocated, before - 3 * kBytes);

  rig.engine.make_ready({4, 2, false, 1}, *rig.compute);  // before B(1)
  EXPECT_FALSE(u0.list()[0].tensor.defined()) << "unit 0 came back with unit 1";
  EXPECT_EQ(rig.arena.stats().allocated, before - kBytes);
  EXPECT_TRUE(holds(rig.read(u1.get("x"), *rig.compute), 2.0f));
  rig.engine.make_ready({4, 2, false, 0}, *rig.compute);  // before B(0)
  EXPECT_TRUE(holds(rig.read(u0.get("x"), *rig.compute), 1.0f));
  EXPECT_TRUE(holds(rig.read(u1.get("ln"), *rig.compute), 3.0f));
  rig.engine.synchronize();
  EXPECT_EQ(rig.engine.counters().h2d_bytes, 3 * kBytes);
  EXPECT_EQ(rig.engine.counters().late_prefetches, 2u);
  EXPECT_EQ(rig.pool.stats().allocated, 0u);
}

// The freed device bytes are handed out again at once; the new owner's writes must wait for the
// D2H copy that still reads them.
TEST(OffloadEngine, FreedDeviceBytesAreNotOverwrittenBeforeTheirCopy) {
  Rig rig;
  stp::RecordSet set("h.0.");
  set.save("x", rig.produce(1.0f), stp::RecordReader::B);
  void* old_address = set.list()[0].tensor.raw();
  Gate gate(rig.engine.d2h());
  rig.engine.offload({1, 1}, 0, set);
  stp::Tensor reuse = rig.produce(100.0f);  // the next forward's allocation
  ASSERT_EQ(reuse.raw(), old_address) << "the arena did not reuse the bytes: the test proves nothing";
  auto written = rig.dev.create_event();
  rig.compute->record(*written);
  EXPECT_FALSE(completes_within(*written, 50ms)) << "compute overwrote bytes the D2H copy had not read";
  gate.open();
  rig.engine.make_ready({1, 1}, *rig.compute);
  EXPECT_TRUE(holds(rig.read(set.get("x"), *rig.compute), 1.0f));
  EXPECT_TRUE(holds(rig.read(reuse, *rig.compute), 100.0f));
  EXPECT_GE(rig.arena.stats().stream_waits, 1u);
}

// Outcome of offload + immediate reload + consumer read with the D2H stream held at a gate.
struct ReorderOutcome {
  bool consumer_finished_while_d2h_held = false;
  bool restored = false;
};

// The reload lands in another arena: were it to reuse the offloaded record's own bytes, the
// arena's fence (after the D2H read them) would order H2D after D2H by itself and hide the fault.
ReorderOutcome reload_while_offload_is_held(stp::OffloadEngineOptions options, std::chrono::milliseconds patience) {
  Rig rig(0, options, /*separate_reloads=*/true);
  // The pool's bytes start as something no record holds, so a stale read is visible.
  {
    stp::Tensor junk = stp::Tensor::empty_on(rig.pool, *rig.compute, {kFloats});
    rig.compute->enqueue_host([p = junk.raw()] { std::memset(p, 0xff, kBytes); });
    junk.record_use(*rig.compute);
  }
  stp::RecordSet set("h.0.");
  set.save("x", rig.produce(1.0f), stp::RecordReader::B);
  ReorderOutcome out;
  Gate gate(rig.engine.d2h());
  rig.engine.offload({1, 1}, 0, set);
  rig.engine.prefetch({1, 1});
  rig.engine.make_ready({1, 1}, *rig.compute);
  std::vector<float> seen(kFloats);
  rig.compute->enqueue_host([&seen, p = set.get("x").raw()] { std::memcpy(seen.data(), p, kBytes); });
  auto consumed = rig.dev.create_event();
  rig.compute->record(*consumed);
  out.consumer_finished_while_d2h_held = completes_within(*consumed, patience);
  gate.open();
  rig.compute->synchronize();
  rig.engine.synchronize();
  out.restored = holds(seen, 1.0f);
  return out;
}

TEST(OffloadEngine, ReloadWaitsForItsOwnOffload) {
  ReorderOutcome o = reload_while_offload_is_held({}, 50ms);
  EXPECT_FALSE(o.consumer_finished_while_d2h_held) << "the reload overtook the offload it reads";
  EXPECT_TRUE(o.restored);
}

TEST(OffloadEngine, FaultInjectionReorderingD2HAndH2DIsCaught) {
  // The reordering bug Megatron-LM had: H2D started before the D2H of the same buffer had finished. With the wait
  // removed the consumer runs on bytes the offload never wrote, and the check sees it.
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the injected fault is a real data race, which ThreadSanitizer reports (as it should); "
                  "the release and ASan builds run this test";
#endif
  ReorderOutcome o = reload_while_offload_is_held({.fault_skip_d2h_wait = true}, 10s);
  EXPECT_TRUE(o.consumer_finished_while_d2h_held);
  EXPECT_FALSE(o.restored) << "the injected reorder went unnoticed";
}

// Stall = how long the consumer waited at make_ready; with an emulated link the copy times are
// bounded below by bytes / rate, which makes the numbers checkable. The consumer reaches its wait
// right after `produce`, while the D2H (which waits for `produce` too) has a whole one-way copy
// ahead of it and the H2D another, so the stall is at least the H2D's one-way time even when the
// consumer's worker thread is descheduled for up to a one-way time (sanitizer builds on a loaded
// machine are); it can never exceed the wall time around the whole exchange.
TEST(OffloadEngine, CountersMeasureCopyTimeAndConsumerStalls) {
  constexpr double kRate = 16e6;  // bytes/s: 256 KiB take ~16.4 ms each way
  const double one_way = static_cast<double>(kBytes) / kRate;
  {
    Rig rig(kRate);
    stp::RecordSet set("h.0.");
    auto t0 = std::chrono::steady_clock::now();
    set.save("x", rig.produce(1.0f), stp::RecordReader::B);
    rig.engine.offload({1, 1}, 0, set);
    rig.engine.make_ready({1, 1}, *rig.compute);  // needed at once: compute waits for both copies
    rig.compute->synchronize();
    rig.engine.synchronize();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stp::OffloadCounters c = rig.engine.counters();
    EXPECT_GE(c.d2h_busy_s, 0.95 * one_way);
    EXPECT_GE(c.h2d_busy_s, 0.95 * one_way);
    EXPECT_LE(c.d2h_bytes_per_s(), 1.05 * kRate);
    EXPECT_GE(c.compute_stall_s, 0.95 * one_way) << "compute waited for the D2H, then the H2D";
    EXPECT_LE(c.compute_stall_s, wall);
  }
  {
    Rig rig(kRate);
    stp::RecordSet set("h.0.");
    set.save("x", rig.produce(1.0f), stp::RecordReader::B);
    rig.engine.offload({1, 1}, 0, set);
    rig.engine.prefetch({1, 1});
    rig.engine.synchronize();  // the reload is done long before compute needs it
    rig.engine.make_ready({1, 1}, *rig.compute);
    rig.compute->synchronize();
    EXPECT_EQ(rig.engine.counters().compute_stall_s, 0.0);
  }
}

}  // namespace
