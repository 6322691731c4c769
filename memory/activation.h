// Activation records: the tensors a unit keeps between its forward (F) and its backward passes
// (B = input gradient, W = weight gradient). They are the *only* per-microbatch state a stage
// holds across calls, so the memory planner and the offload engine can account for, move or drop
// exactly these bytes (docs/style.md, Memory from a size table). A record is named, sized and tagged with who reads it:
//
//   saved by F(u), read by B(u) and/or W(u)     — the usual case (e.g. "h.0.attn.att").
//   saved by B(u), read by W(u)                 — output gradients a deferred W needs
//                                                 (e.g. "h.0.mlp.dy"); they appear after B(u).
//   saved by F(u), read by B(u-1)               — a TP unit's LayerNorm input and statistics.
//                                                 See Note [LayerNorm after the all-reduce] in
//                                                 models/gpt2_units.h: the LayerNorm backward of
//                                                 unit u needs the all-reduced gradient, so it runs
//                                                 at the start of B(u-1), after the all-reduce.
//
// Lifetime: a record is released as soon as its last reader has been enqueued (the release is
// stream-ordered, so work already enqueued that reads it stays valid). After W(u, mb) and
// B(u-1, mb) have run, unit u holds nothing for mb.
//
// Recompute (models/stage.h): under a unit's policy, F(u) drops some of its records right away
// and B(u) saves them again at the start of its call (same name, reader, size; saved_by stays
// 'F'), so between F(u) and B(u) they are absent from the unit's RecordSet.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "core/tensor.h"

namespace stp {

enum class RecordReader : std::uint8_t {
  B = 1,      // read by B of the owning unit
  W = 2,      // read by W of the owning unit
  BW = 3,     // read by both
  BPrev = 4,  // read by B of the previous unit (u-1) of the same stage
};

const char* to_string(RecordReader reader);

struct ActivationRecord {
  std::string name;       // "<hf prefix>.<what>", e.g. "h.3.attn.qkv", "h.3.mlp.ln_2.x", "head.logits"
  Tensor tensor;          // on the stage's device
  std::size_t bytes = 0;  // tensor.bytes()
  RecordReader reader = RecordReader::B;
  char saved_by = 'F';  // 'F' or 'B' (gradients kept for a deferred W)
};

inline const char* to_string(RecordReader reader) {
  switch (reader) {
    case RecordReader::B: return "B";
    case RecordReader::W: return "W";
    case RecordReader::BW: return "BW";
    case RecordReader::BPrev: return "B(u-1)";
  }
  return "?";
}

}  // namespace stp

namespace stp {

// The records of one (unit, microbatch). Names are stored with the unit's prefix ("h.3.attn.").
class RecordSet {
 public:
  explicit RecordSet(std::string prefix = {}) : prefix_(std::move(prefix)) {}

  void save(const std::string& name, Tensor t, RecordReader reader, char saved_by = 'F');
  const Tensor& get(const std::string& name) const;  // asserts the record exists
  Tensor take(const std::string& name);              // removes it and returns its tensor
  bool has(const std::string& name) const;
  bool empty() const { return records_.empty(); }
  std::size_t bytes() const;
  const std::vector<ActivationRecord>& list() const { return records_; }
  // For the offload engine, which swaps a record's tensor for a host copy and back (the record
  // keeps its name, size and readers; `tensor` is undefined while only the host copy exists).
  std::vector<ActivationRecord>& mutable_list() { return records_; }

 private:
  std::string prefix_;
  std::vector<ActivationRecord> records_;
};

}  // namespace stp

namespace stp {

inline void RecordSet::save(const std::string& name, Tensor t, RecordReader reader, char saved_by) {
  STP_ASSERT(!has(name), "record ", prefix_, name, " saved twice");
  std::size_t bytes = t.bytes();
  records_.push_back(ActivationRecord{prefix_ + name, std::move(t), bytes, reader, saved_by});
}

inline bool RecordSet::has(const std::string& name) const {
  for (const ActivationRecord& r : records_)
    if (r.name.size() == prefix_.size() + name.size() && r.name.compare(prefix_.size(), name.size(), name) == 0)
      return true;
  return false;
}

inline const Tensor& RecordSet::get(const std::string& name) const {
  for (const ActivationRecord& r : records_) {
    if (r.name != prefix_ + name) continue;
    STP_ASSERT(r.tensor.defined(), "record ", r.name, " is offloaded and was not prefetched before its reader");
    return r.tensor;
  }
  STP_UNREACHABLE("no record ", prefix_, name, " (already released, or its pass has not run)");
}

inline Tensor RecordSet::take(const std::string& name) {
  for (auto it = records_.begin(); it != records_.end(); ++it) {
    if (it->name == prefix_ + name) {
      STP_ASSERT(it->tensor.defined(), "record ", it->name, " is offloaded and was not prefetched before its reader");
      Tensor t = std::move(it->tensor);
      records_.erase(it);
      return t;
    }
  }
  STP_UNREACHABLE("no record ", prefix_, name, " (already released, or its pass has not run)");
}

inline std::size_t RecordSet::bytes() const {
  std::size_t total = 0;
  for (const ActivationRecord& r : records_) total += r.bytes;
  return total;
}

}  // namespace stp
