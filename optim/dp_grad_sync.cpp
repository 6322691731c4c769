#include "optim/dp_grad_sync.h"

#include <algorithm>

#include "base/error.h"
#include "base/trace_names.h"

namespace stp {

DpGradSync::DpGradSync(std::vector<Tensor> chunk_grads, Communicator* dp, Device& device, Stream& compute,
                       Stream& dp_stream, std::size_t bucket_bytes, bool trace, std::vector<bool> staged,
                       std::unique_ptr<StagedComm> staging)
    : dp_(dp),
      staging_(std::move(staging)),
      compute_(compute),
      dp_stream_(dp_stream),
      done_(device.create_event()),
      trace_(trace) {
  const std::size_t per_bucket = bucket_bytes == 0 ? SIZE_MAX : std::max<std::size_t>(1, bucket_bytes / sizeof(float));
  for (std::size_t i = 0; i < chunk_grads.size(); ++i) {
    Tensor& g = chunk_grads[i];
    Chunk c;
    c.staged = i < staged.size() && staged[i];
    STP_ASSERT(!c.staged || staging_, "DpGradSync: a staged chunk without a staging communicator");
    const auto n = static_cast<std::size_t>(g.numel());
    for (std::size_t at = 0; at < n; at += std::min(per_bucket, n - at))
      c.buckets.emplace_back(at, std::min(per_bucket, n - at));
    c.grads = std::move(g);
    c.final = device.create_event();
    chunks_.push_back(std::move(c));
  }
}

std::size_t DpGradSync::buckets() const {
  std::size_t n = 0;
  for (const Chunk& c : chunks_) n += c.buckets.size();
  return n;
}

void DpGradSync::begin_step() {
  for (Chunk& c : chunks_) c.started = false;
}

void DpGradSync::chunk_final(int chunk) {
  STP_ASSERT(chunk >= 0 && chunk < static_cast<int>(chunks_.size()), "chunk ", chunk, " of ", chunks_.size());
  Chunk& c = chunks_[static_cast<std::size_t>(chunk)];
  STP_ASSERT(!c.started, "chunk ", chunk, "'s gradients reported final twice in one step");
  c.started = true;
  compute_.record(*c.final);
  dp_stream_.wait(*c.final);
  if (!dp_ && !c.staged) return;  // a dry run: nothing to send, nothing to stage
  for (std::size_t b = 0; b < c.buckets.size(); ++b) {
    auto [first, count] = c.buckets[b];
    if (trace_)
      dp_stream_.trace_begin(str("AR dp chunk ", chunk, " bucket ", b), trace::cat::kDpComm,
                             TraceArgs().add(trace::arg::kChunk, chunk).add(trace::arg::kBytes, count * sizeof(float)));
    if (c.staged) staging_->all_reduce_sum(dp_stream_, c.grads.f32() + first, count, count);
    else dp_->all_reduce_sum(dp_stream_, c.grads.f32() + first, count);
    if (trace_) dp_stream_.trace_end();
  }
}

void DpGradSync::finish() {
  for (std::size_t c = 0; c < chunks_.size(); ++c)
    if (!chunks_[c].started) chunk_final(static_cast<int>(c));
  dp_stream_.record(*done_);
  compute_.wait(*done_);
}

}  // namespace stp
