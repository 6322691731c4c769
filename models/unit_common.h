// What the unit passes of every architecture share: the scope of one call (its temporaries and the
// tensors it releases, in stream order) and the records a recompute policy drops.
#pragma once

#include <cstdint>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "memory/activation.h"

namespace stp {

// Temporaries of one call: allocated from the stage's allocator and released in stream order
// when the scope ends (a host task on `s` holds them until the work enqueued before it is done).
class CallScope {
 public:
  CallScope(Allocator& alloc, Stream& s) : alloc_(alloc), s_(s) {}
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

  Tensor tmp(Shape shape, DType dtype = DType::F32);   // dead after this call
  Tensor keep(Shape shape, DType dtype = DType::F32);  // allocated here, kept by the caller (records, outputs)
  void release(Tensor t);                              // a record whose last reader is enqueued in this call
  Stream& stream() { return s_; }

 private:
  Allocator& alloc_;
  Stream& s_;
  std::vector<Tensor> dead_;
};

// One record a recompute policy drops at the end of F and B regenerates (models/stage.h).
struct RecomputedRecord {
  const char* name;    // without the unit prefix, e.g. "att"
  std::int64_t numel;  // elements
  DType dtype;
  std::size_t bytes() const { return static_cast<std::size_t>(numel) * dtype_size(dtype); }
};

// Right after F: releases (in stream order) the records policy r drops.
void drop_recomputed(const std::vector<RecomputedRecord>& dropped, RecordSet& rec, CallScope& cs);

}  // namespace stp
