#include "models/unit_common.h"

#include "base/error.h"

namespace stp {

CallScope::~CallScope() {
  // Stream-ordered release (core/tensor.h): the bytes were used on this stream up to here.
  for (const Tensor& t : dead_) t.record_use(s_);
  dead_.clear();
}

Tensor CallScope::tmp(Shape shape, DType dtype) {
  Tensor t = Tensor::empty(alloc_, std::move(shape), dtype);
  dead_.push_back(t);
  return t;
}

Tensor CallScope::keep(Shape shape, DType dtype) { return Tensor::empty(alloc_, std::move(shape), dtype); }

void CallScope::release(Tensor t) {
  if (t.defined()) dead_.push_back(std::move(t));
}

void drop_recomputed(const std::vector<RecomputedRecord>& dropped, RecordSet& rec, CallScope& cs) {
  for (const RecomputedRecord& r : dropped) {
    Tensor t = rec.take(r.name);
    STP_ASSERT(t.numel() == r.numel && t.dtype() == r.dtype, "recomputed record ", r.name, " is ", t.numel(), " ",
               to_string(t.dtype()), " elements, not ", r.numel, " ", to_string(r.dtype));
    cs.release(std::move(t));
  }
}

}  // namespace stp
