#include "offload/offload_engine.h"

#include <algorithm>
#include <exception>
#include <mutex>

#include "base/error.h"
#include "base/trace_names.h"

namespace stp {

template <class Fn>
void OffloadEngine::timed(Stream& s, Clock clock, Fn&& fn) {
  std::shared_ptr<Event> start = timing_event_on(s);
  fn();
  std::shared_ptr<Event> end = timing_event_on(s);
  std::lock_guard lock(clock_mu_);
  intervals_.push_back({clock, std::move(start), std::move(end)});
}

std::shared_ptr<Event> OffloadEngine::timing_event_on(Stream& s) {
  std::shared_ptr<Event> e = device_.create_timing_event();
  s.record(*e);
  return e;
}

void OffloadEngine::harvest() const {
  std::lock_guard lock(clock_mu_);
  std::erase_if(intervals_, [&](const Interval& i) {
    if (!i.start->query() || !i.end->query()) return false;
    double ms = std::max(0.0, i.end->elapsed_ms(*i.start));
    (i.clock == Clock::D2h ? d2h_ms_ : i.clock == Clock::H2d ? h2d_ms_ : stall_ms_) += ms;
    return true;
  });
}

OffloadEngine::OffloadEngine(Device& device, Stream& compute, Allocator& device_alloc, Allocator& host_pool,
                             OffloadEngineOptions options)
    : device_(device),
      compute_(compute),
      device_alloc_(device_alloc),
      host_pool_(host_pool),
      options_(options),
      d2h_(device.create_stream(trace::stream::kD2h)),
      h2d_(device.create_stream(trace::stream::kH2d)) {}

OffloadEngine::~OffloadEngine() {
  try {
    synchronize();
  } catch (...) {  // the step that failed reported it
  }
}

void OffloadEngine::synchronize() {
  std::exception_ptr first;
  for (Stream* s : {d2h_.get(), h2d_.get()}) {
    try {
      s->synchronize();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
  harvest();
}

OffloadCounters OffloadEngine::counters() const {
  harvest();
  OffloadCounters c = counters_;
  std::lock_guard lock(clock_mu_);
  c.d2h_busy_s = d2h_ms_ * 1e-3;
  c.h2d_busy_s = h2d_ms_ * 1e-3;
  c.compute_stall_s = stall_ms_ * 1e-3;
  return c;
}

void OffloadEngine::offload(Key key, int unit, RecordSet& set, bool split_weight) {
  STP_ASSERT(!key.weight, "offload takes the set's key; split_weight files the W-only records");
  STP_ASSERT(key.unit == -1 || key.unit == unit, "unit ", unit, "'s records filed under unit ", key.unit);
  Entry& e = entry_for_offload(key);
  Entry& w = split_weight ? entry_for_offload({key.chunk, key.mb, true, unit}) : e;
  std::vector<std::pair<ActivationRecord*, Entry*>> moving;
  for (ActivationRecord& r : set.mutable_list())
    if (r.saved_by == 'F') moving.emplace_back(&r, r.reader == RecordReader::W ? &w : &e);
  copy_out(std::move(moving), set, key, unit, false);
}

void OffloadEngine::offload_for_weight(Key key, int unit, RecordSet& set) {
  STP_ASSERT(!key.weight, "offload_for_weight takes the set's key; the weight key is derived from it");
  Entry& w = entry_for_offload({key.chunk, key.mb, true, unit});
  std::vector<std::pair<ActivationRecord*, Entry*>> moving;
  for (ActivationRecord& r : set.mutable_list())
    if (r.reader == RecordReader::W || r.reader == RecordReader::BW) moving.emplace_back(&r, &w);
  copy_out(std::move(moving), set, key, unit, true);
}

OffloadEngine::Entry& OffloadEngine::entry_for_offload(Key key) {
  Entry& e = entries_[key];
  STP_ASSERT(e.state == State::Offloading, "offload of chunk ", key.chunk, " mb ", key.mb,
             key.weight ? str(" (W records of unit ", key.unit, ")") : "",
             " after its prefetch started (a forward after its backward began?)");
  return e;
}

void OffloadEngine::copy_out(std::vector<std::pair<ActivationRecord*, Entry*>> moving, RecordSet& set, Key key,
                             int unit, bool weight) {
  std::uint64_t bytes = 0;
  std::erase_if(moving, [&](const auto& m) {
    const ActivationRecord& r = *m.first;
    if (!r.tensor.defined()) return true;      // already away, or dropped for recompute
    if (r.tensor.storage().use_count() > 1) {  // another tensor shares these bytes: nothing to free
      ++counters_.skipped_shared;
      return true;
    }
    bytes += r.bytes;
    return false;
  });
  auto produced = device_.create_event();
  compute_.record(*produced);
  d2h_->wait(*produced);  // the copies read what the unit just wrote
  // Buffers first: reusing pool bytes may enqueue waits for other streams, which are neither copy
  // time (the counters) nor part of the copy's trace span.
  std::vector<void*> dest;  // the host buffers' bytes (the Moved entries may still reallocate)
  for (auto& [r, entry] : moving) {
    Tensor host = Tensor::empty_on(host_pool_, *d2h_, r->tensor.shape(), r->tensor.dtype());
    dest.push_back(host.raw());
    entry->records.push_back(Moved{&set, r->name, std::move(host), Tensor()});
  }
  TraceArgs args;  // for stp profile
  args.add(trace::arg::kBytes, bytes).add(trace::arg::kChunk, key.chunk).add(trace::arg::kMb, key.mb);
  args.add(trace::arg::kUnit, unit);
  if (weight) args.add(trace::arg::kWeight, true);
  d2h_->trace_begin(str("offload ", key.chunk, ".", key.mb, " u", unit, weight ? " W" : ""), trace::cat::kD2h,
                    std::move(args));
  timed(*d2h_, Clock::D2h, [&] {
    for (std::size_t i = 0; i < moving.size(); ++i) {
      ActivationRecord& r = *moving[i].first;
      d2h_->copy(dest[i], r.tensor.raw(), r.bytes);
      r.tensor.record_use(*d2h_);
      r.tensor = Tensor();  // freed now; the allocator's fence orders any reuse after the copy
    }
  });
  d2h_->trace_end();
  counters_.d2h_bytes += bytes;
  counters_.d2h_copies += moving.size();
  std::shared_ptr<Event> done = device_.create_event();
  d2h_->record(*done);
  std::vector<Entry*> entries;
  for (auto& m : moving)
    if (std::find(entries.begin(), entries.end(), m.second) == entries.end()) entries.push_back(m.second);
  for (Entry* entry : entries) entry->offloaded.push_back(done);
}

void OffloadEngine::prefetch(Key key) {
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.state == State::Prefetching) return;
  Entry& e = it->second;
  if (!options_.fault_skip_d2h_wait)
    for (auto& ev : e.offloaded) h2d_->wait(*ev);  // never read a host buffer its D2H is still writing
  std::uint64_t bytes = 0;
  for (const Moved& m : e.records) bytes += m.host.bytes();
  // Buffers first: reusing device bytes may enqueue waits for other streams, which are neither copy
  // time (the counters) nor part of the copy's trace span.
  for (Moved& m : e.records) m.device = Tensor::empty_on(device_alloc_, *h2d_, m.host.shape(), m.host.dtype());
  TraceArgs args;
  args.add(trace::arg::kBytes, bytes).add(trace::arg::kChunk, key.chunk).add(trace::arg::kMb, key.mb);
  if (key.unit >= 0) args.add(trace::arg::kUnit, key.unit);
  if (key.weight) args.add(trace::arg::kWeight, true);
  h2d_->trace_begin(
      str("reload ", key.chunk, ".", key.mb, key.unit >= 0 ? str(" u", key.unit) : "", key.weight ? " W" : ""),
      trace::cat::kH2d, std::move(args));
  timed(*h2d_, Clock::H2d, [&] {
    for (Moved& m : e.records) {
      h2d_->copy(m.device.raw(), m.host.raw(), m.host.bytes());
      m.host.record_use(*h2d_);
      m.host = Tensor();  // back to the pool, fenced by this copy
    }
  });
  h2d_->trace_end();
  counters_.h2d_bytes += bytes;
  counters_.h2d_copies += e.records.size();
  e.reloaded = timing_event_on(*h2d_);
  e.state = State::Prefetching;
  harvest();  // keeps the pending intervals few: most copies before this one have finished
}

void OffloadEngine::make_ready(Key key, Stream& consumer) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  if (it->second.state == State::Offloading) {
    prefetch(key);
    ++counters_.late_prefetches;
  }
  Entry& e = it->second;
  std::shared_ptr<Event> arrived = timing_event_on(consumer);  // the consumer reaches its wait
  consumer.wait(*e.reloaded);
  {
    std::lock_guard lock(clock_mu_);
    intervals_.push_back({Clock::Stall, std::move(arrived), e.reloaded});
  }
  for (Moved& m : e.records) {
    bool found = false;
    for (ActivationRecord& r : m.set->mutable_list()) {
      if (r.name != m.name) continue;
      STP_ASSERT(!r.tensor.defined(), "record ", r.name, " came back while still resident");
      r.tensor = std::move(m.device);
      found = true;
      break;
    }
    STP_ASSERT(found, "offloaded record ", m.name, " vanished from its record set");
  }
  entries_.erase(it);
}

}  // namespace stp
