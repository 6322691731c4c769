#include "offload/offload_engine.h"

#include <exception>

#include "core/error.h"

namespace stp {

OffloadEngine::OffloadEngine(Device& device, Stream& compute, Allocator& device_alloc, Allocator& host_pool,
                             OffloadEngineOptions options)
    : device_(device),
      compute_(compute),
      device_alloc_(device_alloc),
      host_pool_(host_pool),
      options_(options),
      d2h_(device.create_stream("d2h")),
      h2d_(device.create_stream("h2d")) {}

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
}

void OffloadEngine::offload(Key key, int unit, RecordSet& set) {
  Entry& e = entries_[key];
  STP_ASSERT(e.state == State::Offloading, "offload of chunk ", key.chunk, " mb ", key.mb,
             " after its prefetch started (a forward after its backward began?)");
  auto produced = device_.create_event();
  compute_.record(*produced);
  d2h_->wait(*produced);  // the copies read what F(unit) wrote
  std::uint64_t bytes = 0;
  std::uint64_t moving = 0;  // the span's args carry the bytes it moves (stp profile)
  for (const ActivationRecord& r : set.mutable_list())
    if (r.saved_by == 'F' && r.tensor.defined() && r.tensor.storage().use_count() == 1) moving += r.bytes;
  d2h_->trace_begin(str("offload ", key.chunk, ".", key.mb, " u", unit), "d2h",
                    str("{\"bytes\":", moving, ",\"chunk\":", key.chunk, ",\"mb\":", key.mb, ",\"unit\":", unit, "}"));
  for (ActivationRecord& r : set.mutable_list()) {
    if (r.saved_by != 'F' || !r.tensor.defined()) continue;
    if (r.tensor.storage().use_count() > 1) {  // another tensor shares these bytes: nothing to free
      ++counters_.skipped_shared;
      continue;
    }
    Tensor host = Tensor::empty_on(host_pool_, *d2h_, r.tensor.shape(), r.tensor.dtype());
    d2h_->copy(host.raw(), r.tensor.raw(), r.bytes);
    r.tensor.record_use(*d2h_);
    r.tensor = Tensor();  // freed now; the allocator's fence orders any reuse after the copy
    e.records.push_back(Moved{&set, r.name, std::move(host), Tensor()});
    bytes += r.bytes;
    ++counters_.d2h_copies;
  }
  d2h_->trace_end();
  counters_.d2h_bytes += bytes;
  auto done = device_.create_event();
  d2h_->record(*done);
  e.offloaded.push_back(std::move(done));
}

void OffloadEngine::prefetch(Key key) {
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.state == State::Prefetching) return;
  Entry& e = it->second;
  if (!options_.fault_skip_d2h_wait)
    for (auto& ev : e.offloaded) h2d_->wait(*ev);  // never read a host buffer its D2H is still writing
  std::uint64_t bytes = 0;
  std::uint64_t moving = 0;
  for (const Moved& m : e.records) moving += m.host.bytes();
  h2d_->trace_begin(str("reload ", key.chunk, ".", key.mb), "h2d",
                    str("{\"bytes\":", moving, ",\"chunk\":", key.chunk, ",\"mb\":", key.mb, "}"));
  for (Moved& m : e.records) {
    m.device = Tensor::empty_on(device_alloc_, *h2d_, m.host.shape(), m.host.dtype());
    h2d_->copy(m.device.raw(), m.host.raw(), m.host.bytes());
    m.host.record_use(*h2d_);
    bytes += m.host.bytes();
    m.host = Tensor();  // back to the pool, fenced by this copy
    ++counters_.h2d_copies;
  }
  h2d_->trace_end();
  counters_.h2d_bytes += bytes;
  e.reloaded = device_.create_event();
  h2d_->record(*e.reloaded);
  e.state = State::Prefetching;
}

void OffloadEngine::make_ready(Key key, Stream& consumer) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  if (it->second.state == State::Offloading) {
    prefetch(key);
    ++counters_.late_prefetches;
  }
  Entry& e = it->second;
  consumer.wait(*e.reloaded);
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
