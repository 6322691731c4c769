#include "train/sharded_optimizer.h"

#include <algorithm>

#include "base/error.h"
#include "base/trace_names.h"
#include "core/kernels/nn_kernels.h"
#include "core/kernels/optim_kernels.h"
#include "memory/block_arena.h"

namespace stp {

ShardedOptimizer::ShardedOptimizer(std::vector<ChunkBuffers> chunks, std::vector<ParamInfo>& params,
                                   const std::vector<int>& param_chunk, int dp, int dp_rank, Communicator* comm,
                                   Device& device, Stream& compute, Stream* dp_stream, std::size_t bucket_bytes,
                                   const AdamWHyper& hyper, Allocator& alloc,
                                   std::function<bool(const ParamInfo&)> counted, bool trace, HostUpdate* host,
                                   std::vector<bool> host_chunks)
    : params_(params),
      dp_(dp),
      dp_rank_(dp_rank),
      comm_(comm),
      compute_(compute),
      dp_stream_(dp_stream),
      done_(device.create_event()),
      hyper_(hyper),
      host_(host),
      host_chunks_(std::move(host_chunks)),
      trace_(trace) {
  STP_ASSERT(host_chunks_.empty() || host_chunks_.size() == chunks.size(), "ShardedOptimizer: ", host_chunks_.size(),
             " placements for ", chunks.size(), " chunks");
  STP_ASSERT(dp >= 1 && dp_rank >= 0 && dp_rank < dp, "ShardedOptimizer: dp rank ", dp_rank, " of ", dp);
  STP_ASSERT((comm == nullptr) == (dp_stream == nullptr) && (comm == nullptr || comm->size() == dp),
             "ShardedOptimizer: a communicator of the dp ranks and its stream, or neither (dry run)");
  STP_ASSERT(params.size() == param_chunk.size(), "ShardedOptimizer: a chunk for every parameter");
  const std::size_t per_bucket = bucket_bytes == 0 ? SIZE_MAX : std::max<std::size_t>(1, bucket_bytes / sizeof(float));
  for (ChunkBuffers& b : chunks) {
    Chunk c;
    const auto n = static_cast<std::size_t>(b.grads.numel());
    c.split = static_cast<std::size_t>(b.params.numel());
    const std::size_t tail = b.copies.defined() ? static_cast<std::size_t>(b.copies.numel()) : 0;
    STP_ASSERT(c.split + tail == n && (tail == 0 || b.copies.dtype() == DType::BF16),
               "ShardedOptimizer: a chunk's gradients are its f32 parameters then its bf16 copies (", c.split, " + ",
               tail, " != ", n, ")");
    // Buckets never straddle the split: a bucket is all-gathered as f32 parameters or bf16 copies.
    std::size_t state = 0;
    for (auto [lo, hi] : {std::pair{std::size_t{0}, c.split}, std::pair{c.split, n}}) {
      if (lo == c.split) c.master_base = state;  // the tail's state (and masters) come last
      for (std::size_t at = lo; at < hi; at += std::min(per_bucket, hi - at)) {
        const std::size_t count = std::min(per_bucket, hi - at);
        c.buckets.emplace_back(at, count);
        c.bucket_state.push_back(state);
        state += (count + static_cast<std::size_t>(dp) - 1) / static_cast<std::size_t>(dp);
      }
    }
    Allocator& where = on_host(chunks_.size()) ? host->allocator() : alloc;
    {
      MaybeCategoryScope as(alloc, MemoryCategory::OptimizerState);
      for (Tensor& t : c.state) {
        t = Tensor::empty(where, Shape{static_cast<std::int64_t>(std::max<std::size_t>(state, 1))});
        compute.zero(t.raw(), t.bytes());
      }
    }
    if (state > c.master_base) {  // the owned part of the sharded masters (loads fill it)
      MaybeCategoryScope as(alloc, MemoryCategory::Weights);
      c.masters = Tensor::empty(where, Shape{static_cast<std::int64_t>(state - c.master_base)});
    }
    c.buf = std::move(b);
    c.final = device.create_event();
    c.gathered = device.create_event();
    chunks_.push_back(std::move(c));
  }
  // Segments: each owned bucket slice cut at parameter boundaries.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    const auto ci = static_cast<std::size_t>(param_chunk[i]);
    STP_ASSERT(ci < chunks_.size(), "ShardedOptimizer: parameter ", p.name, " of chunk ", ci);
    Chunk& c = chunks_[ci];
    const std::int64_t off = p.grad.f32() - c.buf.grads.f32();
    const auto split = static_cast<std::int64_t>(c.split);
    const bool viewed =
        off >= 0 && off + p.grad.numel() <= c.buf.grads.numel() &&
        (p.sharded_master ? off >= split && p.compute.as<bf16>() - c.buf.copies.as<bf16>() == off - split
                          : off + p.grad.numel() <= split && p.param.f32() - c.buf.params.f32() == off);
    STP_ASSERT(viewed, "ShardedOptimizer: parameter ", p.name, " is not a view into its chunk's flat buffers");
    const auto lo = static_cast<std::size_t>(off), hi = lo + static_cast<std::size_t>(p.grad.numel());
    for (std::size_t b = 0; b < c.buckets.size(); ++b) {
      CommSlice s = comm_slice(c.buckets[b].second, dp_rank, dp);
      const std::size_t first = c.buckets[b].first + s.first, last = first + s.count;
      const std::size_t a = std::max(lo, first), z = std::min(hi, last);
      if (a < z) segments_.push_back(Segment{i, a - lo, z - a, ci, c.bucket_state[b] + (a - first)});
    }
    if (p.tied) c.delayed = true;
  }
  for (const Segment& s : segments_) {
    const ParamInfo& p = params_[s.param];
    const Shape piece{static_cast<std::int64_t>(s.count)};
    ParamInfo o = p;
    o.param = p.sharded_master ? chunks_[s.chunk].masters.view(
                                     static_cast<std::int64_t>(s.state_at - chunks_[s.chunk].master_base), piece)
                               : p.param.view(static_cast<std::int64_t>(s.offset), piece);
    o.grad = p.grad.view(static_cast<std::int64_t>(s.offset), piece);
    owned_.push_back(std::move(o));
    // A sharded master is a host master there: updated in place, its bf16 rounding uploaded into
    // this rank's part of the copy.
    if (on_host(s.chunk))
      host->add(s.chunk, master(s), p.grad.f32() + s.offset, chunks_[s.chunk].state[0].f32() + s.state_at,
                chunks_[s.chunk].state[1].f32() + s.state_at, s.count, p.decay, p.sharded_master ? copy(s) : nullptr);
  }
  // A segment enters the norm when its parameter does (the predicate sees the rank's parameters).
  std::vector<bool> param_counted(params_.size(), true);
  if (counted)
    for (std::size_t i = 0; i < params_.size(); ++i) param_counted[i] = counted(params_[i]);
  std::vector<bool> segment_counted;
  for (const Segment& s : segments_) segment_counted.push_back(param_counted[s.param]);
  const ParamInfo* base = owned_.data();
  clipper_ = std::make_unique<GradClipper>(
      owned_, alloc, [base, segment_counted](const ParamInfo& o) { return segment_counted[std::size_t(&o - base)]; });
}

std::size_t ShardedOptimizer::state_bytes() const {
  std::size_t n = 0;
  for (const Chunk& c : chunks_) n += c.state[0].bytes() + c.state[1].bytes();
  return n;
}

std::size_t ShardedOptimizer::master_bytes(bool on_host) const {
  std::size_t n = 0;
  for (std::size_t c = 0; c < chunks_.size(); ++c)
    if (on_host == this->on_host(c) && chunks_[c].masters.defined()) n += chunks_[c].masters.bytes();
  return n;
}

float* ShardedOptimizer::master(const Segment& s) const {
  const ParamInfo& p = params_[s.param];
  if (!p.sharded_master) return p.param.f32() + s.offset;
  const Chunk& c = chunks_[s.chunk];
  return c.masters.f32() + (s.state_at - c.master_base);
}

bf16* ShardedOptimizer::copy(const Segment& s) const { return params_[s.param].compute.as<bf16>() + s.offset; }

std::size_t ShardedOptimizer::buckets() const {
  std::size_t n = 0;
  for (const Chunk& c : chunks_) n += c.buckets.size();
  return n;
}

void ShardedOptimizer::begin_step() {
  for (Chunk& c : chunks_) c.started = false;
}

void ShardedOptimizer::chunk_final(int chunk) {
  STP_ASSERT(chunk >= 0 && chunk < static_cast<int>(chunks_.size()), "chunk ", chunk, " of ", chunks_.size());
  Chunk& c = chunks_[static_cast<std::size_t>(chunk)];
  if (c.delayed) return;  // after the tied-gradient sum, in finish()
  reduce(static_cast<std::size_t>(chunk));
}

void ShardedOptimizer::reduce(std::size_t chunk) {
  Chunk& c = chunks_[chunk];
  STP_ASSERT(!c.started, "chunk ", chunk, "'s gradients reported final twice in one step");
  c.started = true;
  if (!comm_) return;
  compute_.record(*c.final);
  dp_stream_->wait(*c.final);
  for (std::size_t b = 0; b < c.buckets.size(); ++b) {
    auto [first, count] = c.buckets[b];
    if (trace_)
      dp_stream_->trace_begin(
          str("RS dp chunk ", chunk, " bucket ", b), trace::cat::kDpComm,
          TraceArgs().add(trace::arg::kChunk, chunk).add(trace::arg::kBytes, count * sizeof(float)));
    comm_->reduce_scatter_sum(*dp_stream_, c.buf.grads.f32() + first, count);
    if (trace_) dp_stream_->trace_end();
  }
}

void ShardedOptimizer::finish(const std::function<void()>& sum_tied) {
  if (sum_tied) sum_tied();
  for (std::size_t c = 0; c < chunks_.size(); ++c)
    if (!chunks_[c].started) reduce(c);
  if (!comm_) return;
  dp_stream_->record(*done_);
  compute_.wait(*done_);
}

void ShardedOptimizer::gather(std::size_t chunk, float* data, bf16* copies, bool head) {
  Chunk& c = chunks_[chunk];
  for (std::size_t b = 0; b < c.buckets.size(); ++b) {
    auto [first, count] = c.buckets[b];
    const bool tail = first >= c.split;
    if (!tail && !head) continue;
    const bool as_bf16 = tail && copies;
    if (trace_)
      dp_stream_->trace_begin(str("AG dp chunk ", chunk, " bucket ", b), trace::cat::kDpComm,
                              TraceArgs()
                                  .add(trace::arg::kChunk, chunk)
                                  .add(trace::arg::kBytes, count * (as_bf16 ? sizeof(bf16) : sizeof(float))));
    if (as_bf16) comm_->all_gather_bf16(*dp_stream_, copies + (first - c.split), count);
    else comm_->all_gather(*dp_stream_, data + first, count);
    if (trace_) dp_stream_->trace_end();
  }
}

void ShardedOptimizer::gather_parameters(std::size_t chunk) {
  Chunk& c = chunks_[chunk];
  gather(chunk, c.buf.params.f32(), c.buf.copies.defined() ? c.buf.copies.as<bf16>() : nullptr, true);
  dp_stream_->record(*c.gathered);
  c.gather_pending = true;  // the next step's first op of this chunk waits for it
}

void ShardedOptimizer::step(float lr) {
  ++step_count_;
  const int step = static_cast<int>(step_count_);
  // The device chunks first: AdamW on compute, each chunk's all-gather after its update.
  std::size_t next = 0;
  for (std::size_t ci = 0; ci < chunks_.size(); ++ci) {
    Chunk& c = chunks_[ci];
    const bool host = on_host(ci);
    for (; next < segments_.size() && segments_[next].chunk == ci; ++next) {
      if (host) continue;
      const Segment& s = segments_[next];
      const ParamInfo& p = params_[s.param];
      adamw_step(compute_, master(s), p.grad.f32() + s.offset, c.state[0].f32() + s.state_at,
                 c.state[1].f32() + s.state_at, s.count, lr, hyper_, step, p.decay);
      // The owned part of a copy: the convert kernel's rounding (what refresh_compute gives).
      if (p.sharded_master) convert(compute_, copy(s), master(s), static_cast<std::int64_t>(s.count));
    }
    if (host || !comm_) continue;
    compute_.record(*c.final);  // this chunk's owned parameters are updated
    dp_stream_->wait(*c.final);
    gather_parameters(ci);
  }
  if (!host_) return;
  // The CPU updates the host chunks' owned segments; each gathers once uploaded.
  host_->step(lr, hyper_, step);
  for (std::size_t ci = 0; comm_ && ci < chunks_.size(); ++ci) {
    if (!on_host(ci)) continue;
    dp_stream_->wait(host_->uploaded(ci));
    gather_parameters(ci);
  }
}

void ShardedOptimizer::params_needed(int chunk) {
  STP_ASSERT(chunk >= 0 && chunk < static_cast<int>(chunks_.size()), "chunk ", chunk, " of ", chunks_.size());
  if (host_) host_->params_needed(static_cast<std::size_t>(chunk));
  Chunk& c = chunks_[static_cast<std::size_t>(chunk)];
  if (!c.gather_pending) return;
  compute_.wait(*c.gathered);
  c.gather_pending = false;
}

void ShardedOptimizer::settle() {
  if (host_) host_->settle();
  if (dp_stream_) dp_stream_->synchronize();
  for (Chunk& c : chunks_) c.gather_pending = false;
}

std::vector<Tensor> ShardedOptimizer::full_moments(int which) {
  STP_ASSERT(which == 0 || which == 1, "moment ", which);
  // Each chunk's gradient buffer has the chunk's element count, and between steps its contents are
  // dead (the next step zeroes it before any backward): the moment is assembled there, so saving
  // takes no device memory beyond the plan's.
  for (std::size_t ci = 0; ci < chunks_.size(); ++ci) {
    Chunk& c = chunks_[ci];
    Tensor& t = c.buf.grads;
    compute_.zero(t.raw(), t.bytes());
    for (std::size_t b = 0; b < c.buckets.size(); ++b) {
      CommSlice s = comm_slice(c.buckets[b].second, dp_rank_, dp_);
      if (s.count)
        compute_.copy(t.f32() + c.buckets[b].first + s.first, c.state[which].f32() + c.bucket_state[b],
                      s.count * sizeof(float));
    }
    if (comm_) gather_into(ci, t.f32(), true);
  }
  std::vector<Tensor> out;
  for (const ParamInfo& p : params_) out.push_back(p.grad);
  return out;
}

void ShardedOptimizer::gather_into(std::size_t chunk, float* data, bool head) {
  Chunk& c = chunks_[chunk];
  compute_.record(*c.final);
  dp_stream_->wait(*c.final);
  gather(chunk, data, nullptr, head);
  dp_stream_->record(*done_);
  compute_.wait(*done_);
}

std::vector<Tensor> ShardedOptimizer::full_parameters() {
  // As full_moments: the owned parts of the sharded masters are all-gathered into the tail of the
  // chunks' gradient buffers (the other parameters are whole on every rank already).
  for (std::size_t ci = 0; ci < chunks_.size(); ++ci) {
    Chunk& c = chunks_[ci];
    if (!c.masters.defined()) continue;
    for (std::size_t b = 0; b < c.buckets.size(); ++b) {
      if (c.buckets[b].first < c.split) continue;
      CommSlice s = comm_slice(c.buckets[b].second, dp_rank_, dp_);
      if (s.count)
        compute_.copy(c.buf.grads.f32() + c.buckets[b].first + s.first,
                      c.masters.f32() + (c.bucket_state[b] - c.master_base), s.count * sizeof(float));
    }
    if (comm_) gather_into(ci, c.buf.grads.f32(), false);
  }
  std::vector<Tensor> out;
  for (const ParamInfo& p : params_) out.push_back(p.sharded_master ? p.grad : p.param);
  return out;
}

void ShardedOptimizer::adopt_masters() {
  for (const Segment& s : segments_) {
    const ParamInfo& p = params_[s.param];
    if (p.sharded_master) compute_.copy(master(s), p.grad.f32() + s.offset, s.count * sizeof(float));
  }
}

void ShardedOptimizer::load_moments(int which, const std::vector<std::vector<float>>& shards) {
  STP_ASSERT(shards.size() == params_.size(), "load_moments: ", shards.size(), " shards for ", params_.size(),
             " parameters");
  for (const Segment& s : segments_) {
    Tensor dst = chunks_[s.chunk].state[which].view(static_cast<std::int64_t>(s.state_at),
                                                    Shape{static_cast<std::int64_t>(s.count)});
    upload(dst, shards[s.param].data() + s.offset, compute_);
  }
}

}  // namespace stp
