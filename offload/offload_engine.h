// OffloadEngine: moves activation records (memory/activation.h) of one rank to the pinned host
// pool right after the forward that produced them, and back before the backward that reads them.
//
// Per record a handle walks  resident -> offloading -> offloaded -> prefetching -> resident:
//   offload(set, unit)   after F(u, mb) is enqueued on compute. The D2H stream waits on an event
//                        recorded on compute (the producer), copies each record into a pool
//                        buffer, and the record drops its device tensor at once: the caching
//                        allocator's fence (memory/block_arena.h) keeps the bytes from being
//                        reused before the copy has read them.
//   prefetch(key)        ahead of the consuming backward (the executor decides how far ahead).
//                        The H2D stream first waits for the D2H of the same records (Megatron-LM
//                        once reloaded before its own offload had finished), copies into a
//                        fresh device buffer, and the host buffer returns to the pool fenced by
//                        the H2D stream.
//   make_ready(key, s)   before the first unit of that backward: stream s waits on the prefetch
//                        event (a stream wait, never a host wait); prefetches first if the
//                        executor had not.
// A set is filed under one key for all its units ({chunk, mb}), or unit by unit ({chunk, mb,
// weight = false, unit}: the executor's choice under late reloads, RankPlan::late_reloads), so
// each unit's records come back just before that unit's B instead of the whole set before the
// first. The records F(u) saves for B(u-1) (RecordReader::BPrev) are in unit u's entry: B walks the
// units downwards, so they are back before B(u) and stay until B(u-1) has read them.
// Deferred W: when the set's weight gradients run in a later op (ZB/STP schedules), offload(...,
// split_weight = true) files the records only W reads under the unit's weight key ({chunk, mb,
// weight = true, unit}), and offload_for_weight adds what W still reads after B(unit): they stay
// on the host through B and come back unit by unit for W (prefetch / make_ready with the weight
// key), instead of occupying the device from B until W.
// Records that share their storage with another live tensor are not moved (nothing would be
// freed); they are counted in `skipped_shared`.
//
// Counters: bytes each way, copies, the time each copy stream spent copying (so the achieved
// rate), and how long the consumer stream stalled waiting for a reload. Both times are taken with
// timing events recorded on the streams themselves (Device::create_timing_event,
// Event::elapsed_ms), so they are what the device did, not what the host saw, and they add no host
// task to any stream: on CUDA a host callback would make the stream (compute, for the stall
// probe) wait for the driver's callback thread (docs/gpu-readiness.md, Findings). When tracing, d2h /
// h2d spans carry the same copies and their bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "memory/activation.h"

namespace stp {

struct OffloadCounters {
  std::uint64_t d2h_bytes = 0, h2d_bytes = 0;
  std::uint64_t d2h_copies = 0, h2d_copies = 0;
  std::uint64_t skipped_shared = 0;       // records not moved: their storage is shared
  std::uint64_t late_prefetches = 0;      // prefetches issued by make_ready itself (no lookahead)
  double d2h_busy_s = 0, h2d_busy_s = 0;  // time the copy streams spent in offload/reload batches
  double compute_stall_s = 0;             // time consumers waited for a reload to finish
  double d2h_bytes_per_s() const { return d2h_busy_s > 0 ? static_cast<double>(d2h_bytes) / d2h_busy_s : 0; }
  double h2d_bytes_per_s() const { return h2d_busy_s > 0 ? static_cast<double>(h2d_bytes) / h2d_busy_s : 0; }
};

struct OffloadEngineOptions {
  // Test-only fault injection: omit the H2D stream's wait for the D2H of the same records, the
  // reordering bug Megatron-LM had (a reload before its own offload had finished). Tests prove the equivalence checks
  // catch it.
  bool fault_skip_d2h_wait = false;
};

class OffloadEngine {
 public:
  // compute: the stream that produces and consumes records; device_alloc: where reloaded records
  // go; host_pool: pinned host memory (memory/pinned_pool.h). All must outlive the engine.
  OffloadEngine(Device& device, Stream& compute, Allocator& device_alloc, Allocator& host_pool,
                OffloadEngineOptions options = {});
  ~OffloadEngine();  // drains the copy streams

  // Identifies one chunk-microbatch activation set.
  struct Key {
    int chunk = 0, mb = 0;
    bool weight = false;  // the records only the (deferred) weight-gradient pass reads ...
    int unit = -1;        // ... of this unit; for B records, -1 (the set's key spans its units) or a unit
    auto operator<=>(const Key&) const = default;
  };

  // Moves the records F(u, mb) saved into `set` (those saved by F and resident) to host, under
  // `key` (the set's, or unit u's: key.unit == u).
  // split_weight: file records read only by W under {key.chunk, key.mb, weight = true, unit}.
  void offload(Key key, int unit, RecordSet& set, bool split_weight = false);
  // After B(unit, mb) when its W is deferred: moves what is left for W (records W reads, incl. the
  // gradients B saved for it) to host under {key.chunk, key.mb, weight = true, unit}.
  void offload_for_weight(Key key, int unit, RecordSet& set);
  // Starts bringing every offloaded record of `key` back (no-op if none or already under way).
  void prefetch(Key key);
  // Orders `consumer` after the reload of `key` (prefetching now if needed).
  void make_ready(Key key, Stream& consumer);

  Stream& d2h() { return *d2h_; }
  Stream& h2d() { return *h2d_; }
  // Byte and copy counts are current when this returns; the times cover the work the streams
  // have finished (synchronize() first for exact totals).
  OffloadCounters counters() const;
  void synchronize();  // both copy streams; rethrows their errors

 private:
  enum class State : std::uint8_t { Offloading, Prefetching };
  struct Moved {       // one record away from its device tensor
    RecordSet* set;    // the stage's record set (map nodes: stable while the record lives)
    std::string name;  // the record's full name
    Tensor host;       // pinned copy
    Tensor device;     // the reload buffer (Prefetching)
  };
  // A measured stretch of device time: from `start`'s record to `end`'s (timing events). Kept until
  // both have completed, then added to its clock (harvest). A stall is max(0, reload end - the
  // consumer's arrival at its wait): a consumer that arrives after the reload did not wait.
  enum class Clock : std::uint8_t { D2h, H2d, Stall };
  struct Interval {
    Clock clock;
    std::shared_ptr<Event> start, end;
  };
  struct Entry {
    State state = State::Offloading;
    std::vector<Moved> records;
    std::vector<std::shared_ptr<Event>> offloaded;  // one per offload() call: D2H done
    std::shared_ptr<Event> reloaded;                // H2D done (a timing event: the stall's end)
  };
  Entry& entry_for_offload(Key key);  // asserts its reload has not started
  // D2H of each (record, entry it is filed under) after the compute work enqueued so far: unit
  // `unit` of `key`'s set, its W-only records when `weight` (the d2h span's name and args).
  void copy_out(std::vector<std::pair<ActivationRecord*, Entry*>> moving, RecordSet& set, Key key, int unit,
                bool weight);
  // Runs fn (which enqueues work on s) between two timing events on s, booked to `clock`.
  template <class Fn>
  void timed(Stream& s, Clock clock, Fn&& fn);
  std::shared_ptr<Event> timing_event_on(Stream& s);  // a timing event recorded on s now
  // Adds every interval whose events have completed to the totals; the rest stay pending.
  void harvest() const;

  Device& device_;
  Stream& compute_;
  Allocator& device_alloc_;
  Allocator& host_pool_;
  OffloadEngineOptions options_;
  std::unique_ptr<Stream> d2h_, h2d_;
  std::map<Key, Entry> entries_;
  OffloadCounters counters_;
  // counters() is const and may be called from another thread than the one driving the engine.
  mutable std::mutex clock_mu_;
  mutable std::vector<Interval> intervals_;
  mutable double d2h_ms_ = 0, h2d_ms_ = 0, stall_ms_ = 0;
};

}  // namespace stp
