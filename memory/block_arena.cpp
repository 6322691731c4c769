#include "memory/block_arena.h"

#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/trace.h"

namespace stp {

// The names are the series of the memory counter tracks, which `stp profile` reads back.
static_assert(std::size(trace::kMemorySeries) == kMemoryCategories);

const char* to_string(MemoryCategory c) {
  const auto i = static_cast<std::size_t>(c);
  return i < kMemoryCategories ? trace::kMemorySeries[i] : "?";
}

const char* to_string(BlockPlacement p) {
  switch (p) {
    case BlockPlacement::BestFit: return "best-fit";
    case BlockPlacement::FirstFit: return "first-fit";
    case BlockPlacement::StatesLow: return "states-low";
    case BlockPlacement::SmallLow: return "small-low";
    case BlockPlacement::ActivationsLow: return "activations-low";
    case BlockPlacement::StatesAndSmallLow: return "states-and-small-low";
    case BlockPlacement::Planned: return "planned";
  }
  return "?";
}

namespace {

constexpr std::size_t kAlign = 256;  // what cudaMalloc guarantees; keeps vector loads aligned

std::size_t aligned(std::size_t bytes) { return (std::max<std::size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign; }

// The last use of a block on one stream: an event recorded there when the block was freed.
struct Use {
  Stream* stream;
  std::shared_ptr<Event> event;  // returns to its stream's pool when the last fence drops it
  std::uint64_t seq;             // record order: on one stream, a later record covers an earlier one
};
using Fence = std::vector<Use>;

// Union of two fences, keeping the latest record per stream.
void merge_into(Fence& into, Fence&& from) {
  for (Use& u : from) {
    bool found = false;
    for (Use& v : into) {
      if (v.stream != u.stream) continue;
      if (u.seq > v.seq) v = std::move(u);
      found = true;
      break;
    }
    if (!found) into.push_back(std::move(u));
  }
}

struct Block {
  std::size_t size = 0;
  char* segment = nullptr;  // base of the owning segment
  bool free = true;
  MemoryCategory category = MemoryCategory::Activations;
  Fence fence;                // free blocks: last uses to order after
  std::uint64_t ordinal = 0;  // live blocks: the allocation's index (its AllocationTrace entry)
};

}  // namespace

struct BlockArena::State : std::enable_shared_from_this<BlockArena::State> {
  State(Device& d, Stream& h, ArenaOptions o) : device(d), home(h), options(std::move(o)) {}
  ~State();

  Device& device;
  Stream& home;
  ArenaOptions options;

  mutable std::mutex mu;
  std::map<char*, std::size_t> segments;               // base -> bytes
  std::map<char*, Block> blocks;                       // every block, address order
  std::set<std::pair<std::size_t, char*>> free_index;  // (size, address) of free blocks: best fit
  ArenaStats stats;
  MemoryCategory current = MemoryCategory::Activations;

  // Events by the stream they are recorded on (an event is only ever recorded on one stream).
  std::mutex pool_mu;
  std::map<Stream*, std::vector<std::unique_ptr<Event>>> pool;
  std::uint64_t next_seq = 0;

  Fence record_fence(const std::vector<Stream*>& uses);
  std::shared_ptr<Storage> allocate(std::size_t bytes, Stream& s);
  void free_block(char* p, Fence fence);
  struct Detached {
    char* base;
    Fence fence;
  };
  char* find_block(std::size_t size, bool may_release, bool& retry);
  char* find_planned(std::size_t size, bool& out_of_segment);
  AllocationTrace trace_records;  // ArenaOptions::record_allocations
  // Planned: the table ordinal of the next allocation (begin_step() realigns it), steps begun.
  std::uint64_t planned_next = 0, steps_begun = 0;
  std::vector<Detached> detach_free_segments();
  void give_back(std::vector<Detached> detached);
  void add_segment(std::size_t bytes);
  std::string oom_report(std::size_t bytes) const;
  void note_peak();

  // Memory counters (set_trace); under mu.
  TraceRecorder* trace = nullptr;
  int trace_pid = 0;
  std::string trace_name;
  void emit_counter();
};

BlockArena::State::~State() {
  // Storages are gone (they hold this state); give every segment back once its streams are done.
  for (auto& [p, b] : blocks)
    for (Use& u : b.fence) u.event->synchronize();
  blocks.clear();
  for (auto& [base, bytes] : segments) options.give(base);
}

Fence BlockArena::State::record_fence(const std::vector<Stream*>& uses) {
  Fence fence;
  for (Stream* s : uses) {
    std::unique_ptr<Event> e;
    std::uint64_t seq;
    {
      std::lock_guard<std::mutex> lock(pool_mu);
      auto& list = pool[s];
      if (!list.empty()) {
        e = std::move(list.back());
        list.pop_back();
      }
      seq = ++next_seq;
    }
    if (!e) e = device.create_event();
    s->record(*e);
    std::weak_ptr<State> weak = weak_from_this();
    fence.push_back(Use{s,
                        std::shared_ptr<Event>(e.release(),
                                               [weak, s](Event* ev) {
                                                 if (auto st = weak.lock()) {
                                                   std::lock_guard<std::mutex> lock(st->pool_mu);
                                                   st->pool[s].emplace_back(ev);
                                                 } else {
                                                   delete ev;
                                                 }
                                               }),
                        seq});
  }
  return fence;
}

void BlockArena::State::emit_counter() {
  TraceCounter c{trace_pid, trace_name, 0, {}};
  for (std::size_t i = 0; i < kMemoryCategories; ++i)
    c.series.emplace_back(to_string(static_cast<MemoryCategory>(i)), static_cast<double>(stats.by_category[i]));
  home.enqueue_host([rec = trace, c = std::move(c)]() mutable {
    c.ts_us = rec->now_us();
    rec->add_counter(std::move(c));
  });
}

void BlockArena::State::note_peak() {
  if (stats.allocated > stats.peak_allocated) {
    stats.peak_allocated = stats.allocated;
    stats.peak_by_category = stats.by_category;
  }
  if (stats.reserved > stats.peak_reserved) stats.peak_reserved = stats.reserved;
}

void BlockArena::State::add_segment(std::size_t bytes) {
  char* base = static_cast<char*>(options.take(bytes));
  segments.emplace(base, bytes);
  blocks.emplace(base, Block{bytes, base, true, MemoryCategory::Activations, {}});
  free_index.emplace(bytes, base);
  stats.reserved += bytes;
  ++stats.segment_allocs;
  note_peak();
}

// Takes every fully free segment out of the arena (under mu). The caller gives them back with
// give_back() *after* unlocking: waiting for their last uses under the lock could deadlock with a
// stream worker that drops a storage (free_block needs the lock).
std::vector<BlockArena::State::Detached> BlockArena::State::detach_free_segments() {
  std::vector<Detached> out;
  for (auto it = segments.begin(); it != segments.end();) {
    auto b = blocks.find(it->first);
    if (!b->second.free || b->second.size != it->second) {
      ++it;
      continue;
    }
    out.push_back(Detached{it->first, std::move(b->second.fence)});
    free_index.erase({b->second.size, b->first});
    blocks.erase(b);
    stats.reserved -= it->second;
    ++stats.segment_frees;
    it = segments.erase(it);
  }
  return out;
}

void BlockArena::State::give_back(std::vector<Detached> detached) {
  for (Detached& d : detached) {
    for (Use& u : d.fence) u.event->synchronize();
    options.give(d.base);
  }
}

// Under mu, BlockPlacement::Planned: the table's bytes for this allocation, carved out of the free
// block that holds them (its front stays free, with the same fence), or nullptr when the table does
// not foresee it. `out_of_segment`: the table's bytes lie beyond the segment (the budget is below
// the table's high water: out of memory, not a miss).
char* BlockArena::State::find_planned(std::size_t size, bool& out_of_segment) {
  out_of_segment = false;
  const PlacementTable::Entry& e = options.table->at(planned_next);
  if (e.size != size) return nullptr;
  char* const base = segments.begin()->first;
  if (e.offset + size > segments.begin()->second) {
    out_of_segment = true;
    return nullptr;
  }
  char* const want = base + e.offset;
  auto it = blocks.upper_bound(want);
  if (it == blocks.begin()) return nullptr;
  --it;
  Block& b = it->second;
  if (!b.free || b.segment != base || it->first + b.size < want + size) return nullptr;
  if (it->first != want) {  // split off the front
    const std::size_t front = static_cast<std::size_t>(want - it->first);
    free_index.erase({b.size, it->first});
    blocks.emplace(want, Block{b.size - front, base, true, MemoryCategory::Activations, b.fence});
    free_index.emplace(b.size - front, want);
    b.size = front;
    free_index.emplace(front, it->first);
  }
  return want;
}

// Under mu: a free block of `size`, growing the arena if allowed. Returns nullptr when only giving
// cached segments back could help (`retry` set) or when nothing can.
char* BlockArena::State::find_block(std::size_t size, bool may_release, bool& retry) {
  retry = false;
  if (options.placement == BlockPlacement::Planned && options.table && !segments.empty()) {
    bool out_of_segment = false;
    if (char* p = find_planned(size, out_of_segment)) return p;
    if (out_of_segment) return nullptr;         // the budget is below the table's high water
    if (may_release) ++stats.placement_misses;  // not foreseen: best fit below (counted once)
  }
  if (options.placement == BlockPlacement::FirstFit ||
      (options.placement == BlockPlacement::StatesLow && current != MemoryCategory::Activations) ||
      (options.placement == BlockPlacement::SmallLow && size < kSmallBlockBytes) ||
      (options.placement == BlockPlacement::ActivationsLow && current == MemoryCategory::Activations) ||
      (options.placement == BlockPlacement::StatesAndSmallLow &&
       (current != MemoryCategory::Activations || size < kSmallBlockBytes))) {
    // Address order: a one-segment arena's tail is its last block, so it is chosen last.
    for (auto& [p, b] : blocks)
      if (b.free && b.size >= size) return p;
  } else {
    // Best fit among the blocks below each segment's untouched tail; the tail (the free block
    // that ends the segment) only when none fits. The tail is the one block whose size depends on
    // the segment's size, so keeping it out of the choice makes the layout of a one-segment arena
    // the same for every capacity that holds the run: it places exactly when high_water fits
    // (the planner's minimum budget is one dry run's high_water, memory/plan.h).
    char* tail = nullptr;
    for (auto fit = free_index.lower_bound({size, nullptr}); fit != free_index.end(); ++fit) {
      const Block& b = blocks.at(fit->second);
      if (fit->second + b.size != b.segment + segments.at(b.segment)) return fit->second;
      if (!tail) tail = fit->second;  // at most one per segment: the loop skips few
    }
    if (tail) return tail;
  }
  if (!options.grow) return nullptr;
  std::size_t seg = std::max(size, options.segment_bytes);
  if (stats.reserved + seg > options.budget) seg = size;  // the last segment may be smaller
  if (stats.reserved + seg > options.budget) {
    retry = may_release && stats.reserved > stats.allocated;
    return nullptr;
  }
  try {
    add_segment(seg);
  } catch (const OutOfMemoryError&) {  // the device itself is full: cached segments may help
    retry = may_release && stats.reserved > stats.allocated;
    if (!retry) throw;
    return nullptr;
  }
  return find_block(size, false, retry);
}

std::shared_ptr<Storage> BlockArena::State::allocate(std::size_t bytes, Stream& s) {
  const std::size_t size = aligned(bytes);
  Fence wait_for;
  char* p = nullptr;
  {
    std::unique_lock<std::mutex> lock(mu);
    bool retry = false;
    p = find_block(size, true, retry);
    if (!p && retry) {  // give cached segments back (waiting outside the lock), then try again
      std::vector<Detached> detached = detach_free_segments();
      lock.unlock();
      give_back(std::move(detached));
      lock.lock();
      p = find_block(size, false, retry);
    }
    if (!p) throw OutOfMemoryError(oom_report(bytes), bytes);
    Block& b = blocks.at(p);
    free_index.erase({b.size, p});
    if (b.size > size) {  // split: the remainder keeps the fence (its bytes had the same users)
      Block rest{b.size - size, b.segment, true, MemoryCategory::Activations, b.fence};
      blocks.emplace(p + size, std::move(rest));
      free_index.emplace(b.size - size, p + size);
      b.size = size;
    }
    b.free = false;
    b.category = current;
    b.ordinal = stats.alloc_count;
    ++planned_next;
    if (options.record_allocations)
      trace_records.push_back({size, stats.alloc_count + stats.free_count, AllocationRecord::kAlive});
    wait_for = std::move(b.fence);
    b.fence.clear();
    stats.allocated += size;
    stats.high_water = std::max(stats.high_water, static_cast<std::size_t>(p + size - b.segment));
    stats.by_category[static_cast<std::size_t>(current)] += size;
    ++stats.alloc_count;
    note_peak();
    if (trace) emit_counter();
  }
  for (Use& u : wait_for) {
    if (u.stream == &s || u.event->query()) continue;  // same stream: ordered already
    s.wait(*u.event);
    std::lock_guard<std::mutex> lock(mu);
    ++stats.stream_waits;
  }
  std::shared_ptr<State> keep = shared_from_this();
  auto storage = std::make_shared<Storage>(&device, p, bytes, [keep](void* q, const std::vector<Stream*>& uses) {
    keep->free_block(static_cast<char*>(q), keep->record_fence(uses));
  });
  storage->record_use(s);
  return storage;
}

void BlockArena::State::free_block(char* p, Fence fence) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = blocks.find(p);
  STP_ASSERT(it != blocks.end() && !it->second.free, options.what, " arena: free of an unknown block");
  Block& b = it->second;
  if (options.record_allocations) trace_records.at(b.ordinal).freed_at = stats.alloc_count + stats.free_count;
  stats.allocated -= b.size;
  stats.by_category[static_cast<std::size_t>(b.category)] -= b.size;
  ++stats.free_count;
  if (trace) emit_counter();
  b.free = true;
  b.fence = std::move(fence);
  // Coalesce with free neighbours in the same segment.
  auto next = std::next(it);
  if (next != blocks.end() && next->second.free && next->second.segment == b.segment) {
    free_index.erase({next->second.size, next->first});
    b.size += next->second.size;
    merge_into(b.fence, std::move(next->second.fence));
    blocks.erase(next);
  }
  if (it != blocks.begin()) {
    auto prev = std::prev(it);
    if (prev->second.free && prev->second.segment == b.segment) {
      free_index.erase({prev->second.size, prev->first});
      prev->second.size += b.size;
      merge_into(prev->second.fence, std::move(b.fence));
      blocks.erase(it);
      it = prev;
    }
  }
  free_index.emplace(it->second.size, it->first);
}

std::string BlockArena::State::oom_report(std::size_t bytes) const {
  std::string live;
  for (std::size_t c = 0; c < kMemoryCategories; ++c)
    live += str(c ? ", " : "", to_string(static_cast<MemoryCategory>(c)), " ", format_bytes(stats.by_category[c]));
  std::size_t largest = free_index.empty() ? 0 : free_index.rbegin()->first;
  std::string budget = options.budget == SIZE_MAX ? std::string("unlimited") : format_bytes(options.budget);
  // A planned placement that missed: the run allocated otherwise than the dry run its table was laid
  // out from, so the plan's budget no longer holds for it; say so before the usual advice.
  std::string missed;
  if (stats.placement_misses > 0)
    missed =
        str(" ", stats.placement_misses, " allocation(s) were not where the planned block placement put them: this ",
            "run allocated otherwise than the dry run the plan was laid out from (an internal error of the ",
            "planner; memory.device_budget with some margin over the plan's minimum avoids it).");
  return str("out of ", options.what, " memory on ", device.name(), ": cannot allocate ", format_bytes(bytes), "; ",
             options.budget_knob, " = ", budget, ", ", format_bytes(stats.allocated), " live (", live, "), ",
             format_bytes(stats.reserved), " reserved, largest free block ", format_bytes(largest), ".", missed,
             options.advice.empty() ? "" : " ", options.advice);
}

// ---- BlockArena ----------------------------------------------------------------------------------

BlockArena::BlockArena(Device& device, Stream& home, ArenaOptions options) {
  STP_ASSERT(options.take && options.give, "arena without a backend");
  state_ = std::make_shared<State>(device, home, std::move(options));
  state_->stats.budget = state_->options.budget;
}

BlockArena::~BlockArena() {
  std::lock_guard<std::mutex> lock(state_->mu);  // storages outliving the arena must not touch the home stream
  state_->trace = nullptr;
}

void BlockArena::set_trace(TraceRecorder* recorder, int pid, std::string name) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->trace = recorder;
  state_->trace_pid = pid;
  state_->trace_name = std::move(name);
}

std::shared_ptr<Storage> BlockArena::allocate(std::size_t bytes) { return state_->allocate(bytes, state_->home); }
std::shared_ptr<Storage> BlockArena::allocate_on(std::size_t bytes, Stream& s) { return state_->allocate(bytes, s); }
Device& BlockArena::device() { return state_->device; }

void BlockArena::reserve(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (bytes == 0) return;
  std::size_t size = aligned(bytes);
  if (state_->stats.reserved + size > state_->options.budget)
    throw OutOfMemoryError(
        str("cannot reserve ", format_bytes(size), " of ", state_->options.what, " memory on ", state_->device.name(),
            ": ", state_->options.budget_knob, " = ", format_bytes(state_->options.budget), " and ",
            format_bytes(state_->stats.reserved), " are reserved already.", state_->options.advice.empty() ? "" : " ",
            state_->options.advice),
        size);
  state_->add_segment(size);
}

void BlockArena::release_cached() {
  std::vector<State::Detached> detached;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    detached = state_->detach_free_segments();
  }
  state_->give_back(std::move(detached));
}

ArenaStats BlockArena::stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  ArenaStats s = state_->stats;
  s.largest_free = state_->free_index.empty() ? 0 : state_->free_index.rbegin()->first;
  return s;
}

void BlockArena::begin_step() {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->options.table) state_->planned_next = state_->options.table->step_start(state_->steps_begun == 0);
  ++state_->steps_begun;
}

AllocationTrace BlockArena::allocation_trace() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->trace_records;
}

void BlockArena::reset_peak() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->stats.peak_allocated = state_->stats.allocated;
  state_->stats.peak_by_category = state_->stats.by_category;
  state_->stats.peak_reserved = state_->stats.reserved;
}

MemoryCategory BlockArena::category() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->current;
}

BlockArena::CategoryScope::CategoryScope(BlockArena& arena, MemoryCategory c) : arena_(arena) {
  std::lock_guard<std::mutex> lock(arena_.state_->mu);
  previous_ = arena_.state_->current;
  arena_.state_->current = c;
}

BlockArena::CategoryScope::~CategoryScope() {
  std::lock_guard<std::mutex> lock(arena_.state_->mu);
  arena_.state_->current = previous_;
}

ArenaOptions device_arena_options(Device& device, std::size_t budget) {
  ArenaOptions o;
  o.budget = budget;
  o.take = [&device](std::size_t bytes) { return device.allocate(bytes); };
  o.give = [&device](void* p) { device.deallocate(p); };
  return o;
}

MaybeCategoryScope::MaybeCategoryScope(Allocator& alloc, MemoryCategory c) {
  if (auto* arena = dynamic_cast<BlockArena*>(&alloc)) scope_ = std::make_unique<BlockArena::CategoryScope>(*arena, c);
}

MaybeCategoryScope::~MaybeCategoryScope() = default;

}  // namespace stp
