#include "optim/distributed_optimizer.h"

#include <algorithm>

#include "base/error.h"
#include "base/trace_names.h"
#include "core/kernels/nn_kernels.h"
#include "core/kernels/optim_kernels.h"
#include "memory/block_arena.h"

namespace stp {

DistributedOptimizer::DistributedOptimizer(RankOptimizerOptions options)
    : o_(std::move(options)),
      comm_(o_.dp_comm),
      host_chunks_(RankParams::host_chunks(o_)),
      dp_stream_(make_dp_stream(o_)),
      done_(o_.device->create_event()),
      host_(make_host_update(o_)) {
  STP_ASSERT(o_.dp >= 1 && o_.dp_rank >= 0 && o_.dp_rank < o_.dp, "DistributedOptimizer: dp rank ", o_.dp_rank, " of ",
             o_.dp);
  STP_ASSERT(comm_ == nullptr || comm_->size() == o_.dp,
             "DistributedOptimizer: a communicator of the dp ranks, or none (dry run)");
}

StageMasters DistributedOptimizer::masters(int chunk) const {
  StageMasters m;
  if (o_.host_masters && on_host(static_cast<std::size_t>(chunk))) m.host = &host_->allocator();
  m.sharded = o_.bf16;  // the GEMM weights' f32 masters are sharded over the dp ranks
  return m;
}

void DistributedOptimizer::attach(const std::vector<Stage*>& stages) {
  params_ = RankParams::of(stages, o_.tp_rank);
  STP_ASSERT(host_chunks_.size() == stages.size(), "DistributedOptimizer: ", host_chunks_.size(), " placements for ",
             stages.size(), " chunks");
  for (Stage* s : stages) add_chunk(*s);
  const std::vector<bool> staged = staged_chunks(o_, stages);
  for (std::size_t c = 0; c < chunks_.size(); ++c) chunks_[c].staged = staged[c];
  if (std::find(staged.begin(), staged.end(), true) != staged.end())
    staging_ = std::make_unique<StagedComm>(comm_, *o_.alloc, o_.dp_rank, o_.dp);
  for (std::size_t i = 0; i < params_.list.size(); ++i) add_segments(i);
  for (const Segment& s : segments_) {
    const ParamInfo& p = params_.list[s.param];
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
      host_->add(s.chunk, master(s), p.grad.f32() + s.offset, chunks_[s.chunk].state[0].f32() + s.state_at,
                 chunks_[s.chunk].state[1].f32() + s.state_at, s.count, p.decay, p.sharded_master ? copy(s) : nullptr);
  }
  if (host_) set_direct_groups(*host_, stages);
  // A segment enters the norm when its parameter does.
  std::vector<bool> segment_counted;
  for (const Segment& s : segments_) segment_counted.push_back(params_.norm_counts[s.param]);
  const ParamInfo* base = owned_.data();
  clipper_ = std::make_unique<GradClipper>(owned_, *o_.alloc, [base, segment_counted](const ParamInfo& o) {
    return segment_counted[std::size_t(&o - base)];
  });
  add_runs();
  // The fused AdamW reads the device chunks' gradients times the coefficient; clip() scales only
  // the gradients the CPU update downloads.
  std::vector<bool> scaled;
  for (const Segment& sg : segments_) scaled.push_back(on_host(sg.chunk));
  clipper_->set_scaled(std::move(scaled));
  // Speculation: a host chunk's owned gradients are final once its reduce-scatter has landed
  // (reduce); a chunk holding the tied parameter is reduced only after the backward. Set in dry
  // runs too (which reduce nothing): the shadows are allocated alike.
  for (std::size_t c = 0; host_ && o_.speculate && c < chunks_.size(); ++c)
    host_->set_early(c, on_host(c) && !chunks_[c].delayed);
}

// The device chunks' segments as flat runs (adamw_flat_step): in gradient order, a segment
// continues the run when its gradient, master and state start where the previous one's end.
void DistributedOptimizer::add_runs() {
  std::vector<std::size_t> order;
  for (std::size_t k = 0; k < segments_.size(); ++k)
    if (!on_host(segments_[k].chunk)) order.push_back(k);
  auto grad = [&](std::size_t k) { return params_.list[segments_[k].param].grad.f32() + segments_[k].offset; };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return segments_[a].chunk != segments_[b].chunk ? segments_[a].chunk < segments_[b].chunk : grad(a) < grad(b);
  });
  for (std::size_t k : order) {
    const Segment& sg = segments_[k];
    const ParamInfo& p = params_.list[sg.param];
    const bool continues = !runs_.empty() && [&] {
      const Run& r = runs_.back();
      const Segment& first = segments_[r.first];
      return first.chunk == sg.chunk && params_.list[first.param].sharded_master == p.sharded_master &&
             grad(r.first) + r.count == grad(k) && master(first) + r.count == master(sg) &&
             first.state_at + r.count == sg.state_at && (!p.sharded_master || copy(first) + r.count == copy(sg));
    }();
    if (!continues) runs_.push_back(Run{k, 0, {}});
    Run& r = runs_.back();
    r.segments.push_back(FlatSegment{sg.count, p.decay});
    r.count += sg.count;
  }
}

// The chunk's buckets, its state (1/dp of every bucket, rounded up) and the owned part of its
// sharded masters.
void DistributedOptimizer::add_chunk(Stage& stage) {
  const std::size_t dp = static_cast<std::size_t>(o_.dp);
  const std::size_t per_bucket =
      o_.bucket_bytes == 0 ? SIZE_MAX : std::max<std::size_t>(1, o_.bucket_bytes / sizeof(float));
  Chunk c;
  c.params = stage.flat_params();
  c.grads = stage.flat_grads();
  c.copies = stage.flat_copies();
  const auto n = static_cast<std::size_t>(c.grads.numel());
  c.split = static_cast<std::size_t>(c.params.numel());
  const std::size_t tail = c.copies.defined() ? static_cast<std::size_t>(c.copies.numel()) : 0;
  STP_ASSERT(c.split + tail == n && (tail == 0 || c.copies.dtype() == DType::Bf16),
             "DistributedOptimizer: a chunk's gradients are its f32 parameters then its bf16 copies (", c.split, " + ",
             tail, " != ", n, ")");
  // Buckets never straddle the split: a bucket is all-gathered as f32 parameters or bf16 copies.
  std::size_t state = 0;
  for (auto [lo, hi] : {std::pair{std::size_t{0}, c.split}, std::pair{c.split, n}}) {
    if (lo == c.split) c.master_base = state;  // the tail's state (and masters) come last
    for (std::size_t at = lo; at < hi; at += std::min(per_bucket, hi - at)) {
      const std::size_t count = std::min(per_bucket, hi - at);
      c.buckets.emplace_back(at, count);
      c.bucket_state.push_back(state);
      state += (count + dp - 1) / dp;
    }
  }
  Allocator& where = on_host(chunks_.size()) ? host_->allocator() : *o_.alloc;
  {
    MaybeCategoryScope as(*o_.alloc, MemoryCategory::OptimizerState);
    for (Tensor& t : c.state) {
      t = Tensor::empty(where, Shape{static_cast<std::int64_t>(std::max<std::size_t>(state, 1))});
      o_.compute->zero(t.raw(), t.bytes());
    }
  }
  if (state > c.master_base) {  // the owned part of the sharded masters (loads fill it)
    MaybeCategoryScope as(*o_.alloc, MemoryCategory::Weights);
    c.masters = Tensor::empty(where, Shape{static_cast<std::int64_t>(state - c.master_base)});
  }
  c.final = o_.device->create_event();
  c.gathered = o_.device->create_event();
  chunks_.push_back(std::move(c));
}

// The parameter's segments: each owned bucket slice cut at parameter boundaries.
void DistributedOptimizer::add_segments(std::size_t i) {
  const ParamInfo& p = params_.list[i];
  const auto ci = static_cast<std::size_t>(params_.chunk[i]);
  STP_ASSERT(ci < chunks_.size(), "DistributedOptimizer: parameter ", p.name, " of chunk ", ci);
  Chunk& c = chunks_[ci];
  const std::int64_t off = p.grad.f32() - c.grads.f32();
  const auto split = static_cast<std::int64_t>(c.split);
  const bool viewed = off >= 0 && off + p.grad.numel() <= c.grads.numel() &&
                      (p.sharded_master ? off >= split && p.compute.as<bf16>() - c.copies.as<bf16>() == off - split
                                        : off + p.grad.numel() <= split && p.param.f32() - c.params.f32() == off);
  STP_ASSERT(viewed, "DistributedOptimizer: parameter ", p.name, " is not a view into its chunk's flat buffers");
  const auto lo = static_cast<std::size_t>(off), hi = lo + static_cast<std::size_t>(p.grad.numel());
  for (std::size_t b = 0; b < c.buckets.size(); ++b) {
    CommSlice s = comm_slice(c.buckets[b].second, o_.dp_rank, o_.dp);
    const std::size_t first = c.buckets[b].first + s.first, last = first + s.count;
    const std::size_t a = std::max(lo, first), z = std::min(hi, last);
    if (a < z) segments_.push_back(Segment{i, a - lo, z - a, ci, c.bucket_state[b] + (a - first)});
  }
  if (p.tied) c.delayed = true;
}

OptimizerHooks DistributedOptimizer::hooks() {
  OptimizerHooks h;
  if (comm_ || staging_) h.grads_final = [this](int chunk) { chunk_final(chunk); };
  h.params_needed = [this](int chunk) { params_needed(chunk); };
  return h;
}

std::size_t DistributedOptimizer::state_bytes() const {
  std::size_t n = 0;
  for (const Chunk& c : chunks_) n += c.state[0].bytes() + c.state[1].bytes();
  return n;
}

std::size_t DistributedOptimizer::master_bytes(bool on_host) const {
  std::size_t n = 0;
  for (std::size_t c = 0; c < chunks_.size(); ++c)
    if (on_host == this->on_host(c) && chunks_[c].masters.defined()) n += chunks_[c].masters.bytes();
  return n;
}

float* DistributedOptimizer::master(const Segment& s) const {
  const ParamInfo& p = params_.list[s.param];
  if (!p.sharded_master) return p.param.f32() + s.offset;
  const Chunk& c = chunks_[s.chunk];
  return c.masters.f32() + (s.state_at - c.master_base);
}

bf16* DistributedOptimizer::copy(const Segment& s) const { return params_.list[s.param].compute.as<bf16>() + s.offset; }

RankOptimizer::Speculation DistributedOptimizer::speculation() const { return speculation_of(host_.get()); }

std::size_t DistributedOptimizer::host_master_bytes() const {
  std::size_t n = master_bytes(/*on_host=*/true);
  for (const ParamInfo& p : params_.list)
    if (p.host_master) n += p.param.bytes();
  return n;
}

std::vector<Stream*> DistributedOptimizer::streams(bool except_in_flight) {
  std::vector<Stream*> out;
  if (dp_stream_ && !except_in_flight) out.push_back(dp_stream_.get());  // the all-gathers
  if (host_) add_host_streams(*host_, except_in_flight, out);
  return out;
}

std::size_t DistributedOptimizer::buckets() const {
  std::size_t n = 0;
  for (const Chunk& c : chunks_) n += c.buckets.size();
  return n;
}

void DistributedOptimizer::begin_step(float lr) {
  if (host_) host_->begin_step(lr, o_.hyper, static_cast<int>(step_count_ + 1));
  // The bf16 GEMM copies are refreshed chunk by chunk once the step waits for their all-gathers
  // (params_needed).
  for (Stage* s : params_.stages) s->zero_grads_keep_copies(*o_.compute);
  for (Chunk& c : chunks_) c.started = false;
  clipped_ = false;
}

void DistributedOptimizer::chunk_final(int chunk) {
  STP_ASSERT(chunk >= 0 && chunk < static_cast<int>(chunks_.size()), "chunk ", chunk, " of ", chunks_.size());
  Chunk& c = chunks_[static_cast<std::size_t>(chunk)];
  if (c.delayed) return;  // after the tied-gradient sum, in finish_gradients
  reduce(static_cast<std::size_t>(chunk));
}

void DistributedOptimizer::reduce(std::size_t chunk) {
  Chunk& c = chunks_[chunk];
  STP_ASSERT(!c.started, "chunk ", chunk, "'s gradients reported final twice in one step");
  c.started = true;
  if (!communicates(c)) return;
  o_.compute->record(*c.final);
  dp_stream_->wait(*c.final);
  for (std::size_t b = 0; b < c.buckets.size(); ++b) {
    auto [first, count] = c.buckets[b];
    if (o_.trace)
      dp_stream_->trace_begin(
          str("RS dp chunk ", chunk, " bucket ", b), trace::cat::kDpComm,
          TraceArgs().add(trace::arg::kChunk, chunk).add(trace::arg::kBytes, count * sizeof(float)));
    if (c.staged) staging_->reduce_scatter_sum(*dp_stream_, c.grads.f32() + first, count);
    else comm_->reduce_scatter_sum(*dp_stream_, c.grads.f32() + first, count);
    if (o_.trace) dp_stream_->trace_end();
  }
  // An early host chunk (speculation) downloads its owned slices once they hold the sums.
  if (host_ && on_host(chunk)) host_->grads_final(chunk, dp_stream_.get());
}

void DistributedOptimizer::finish_gradients(const std::function<void()>& sum_tied) {
  sum_tied();
  for (std::size_t c = 0; c < chunks_.size(); ++c)
    if (!chunks_[c].started) reduce(c);
  if (!comm_ && !staging_) return;
  dp_stream_->record(*done_);
  o_.compute->wait(*done_);
}

void DistributedOptimizer::order_gradient_writes(Stream& s) {
  if (host_) host_->order_after_downloads(s);
}

float* DistributedOptimizer::owned_gradient() {
  for (const Segment& seg : segments_)
    if (params_.own(seg.param)) return params_.list[seg.param].grad.f32() + seg.offset;
  STP_UNREACHABLE("this rank owns no gradient of its own");
}

float* DistributedOptimizer::grad_sumsq(Communicator& replica) {
  clipper_->local_sumsq(*o_.compute);
  replica.all_reduce_sum(*o_.compute, clipper_->sumsq(), 1);
  if (comm_) comm_->all_reduce_sum(*o_.compute, clipper_->sumsq(), 1);  // each dp rank owns a part
  return clipper_->sumsq();
}

void DistributedOptimizer::clip(float max_norm) {
  clip_gradients(*clipper_, *o_.compute, host_.get(), max_norm);
  clipped_ = true;
}

void DistributedOptimizer::gather(std::size_t chunk, float* data, bf16* copies, bool head) {
  Chunk& c = chunks_[chunk];
  for (std::size_t b = 0; b < c.buckets.size(); ++b) {
    auto [first, count] = c.buckets[b];
    const bool tail = first >= c.split;
    if (!tail && !head) continue;
    const bool as_bf16 = tail && copies;
    if (o_.trace)
      dp_stream_->trace_begin(str("AG dp chunk ", chunk, " bucket ", b), trace::cat::kDpComm,
                              TraceArgs()
                                  .add(trace::arg::kChunk, chunk)
                                  .add(trace::arg::kBytes, count * (as_bf16 ? sizeof(bf16) : sizeof(float))));
    if (as_bf16 && c.staged) staging_->all_gather_bf16(*dp_stream_, copies + (first - c.split), count);
    else if (as_bf16) comm_->all_gather_bf16(*dp_stream_, copies + (first - c.split), count);
    else if (c.staged) staging_->all_gather(*dp_stream_, data + first, count);
    else comm_->all_gather(*dp_stream_, data + first, count);
    if (o_.trace) dp_stream_->trace_end();
  }
}

void DistributedOptimizer::gather_parameters(std::size_t chunk) {
  Chunk& c = chunks_[chunk];
  gather(chunk, c.params.f32(), c.copies.defined() ? c.copies.as<bf16>() : nullptr, true);
  dp_stream_->record(*c.gathered);
  c.gather_pending = true;  // the next step's first op of this chunk waits for it
}

void DistributedOptimizer::step(float lr) {
  ++step_count_;
  const int step = static_cast<int>(step_count_);
  // The device chunks first: AdamW on compute, each chunk's all-gather after its update.
  const float* coef = clipped_ ? clipper_->coef() : nullptr;
  clipped_ = false;
  std::size_t next = 0;  // runs are in chunk order
  for (std::size_t ci = 0; ci < chunks_.size(); ++ci) {
    Chunk& c = chunks_[ci];
    const bool host = on_host(ci);
    for (; next < runs_.size() && segments_[runs_[next].first].chunk == ci; ++next) {
      const Run& r = runs_[next];
      const Segment& s = segments_[r.first];
      const ParamInfo& p = params_.list[s.param];
      adamw_flat_step(*o_.compute, master(s), p.grad.f32() + s.offset, c.state[0].f32() + s.state_at,
                      c.state[1].f32() + s.state_at, r.segments, lr, o_.hyper, step, coef);
      // The owned part of a copy: the convert kernel's rounding (what refresh_compute gives).
      if (p.sharded_master) convert(*o_.compute, copy(s), master(s), static_cast<std::int64_t>(r.count));
    }
    if (host || !comm_) continue;
    o_.compute->record(*c.final);  // this chunk's owned parameters are updated
    dp_stream_->wait(*c.final);
    gather_parameters(ci);
  }
  if (!host_) return;
  // The CPU updates the host chunks' owned segments; each gathers once uploaded.
  host_->step(lr, o_.hyper, step);
  for (std::size_t ci = 0; ci < chunks_.size(); ++ci) {
    if (!on_host(ci) || !communicates(chunks_[ci])) continue;
    dp_stream_->wait(host_->uploaded(ci));
    gather_parameters(ci);
  }
}

void DistributedOptimizer::params_needed(int chunk) {
  STP_ASSERT(chunk >= 0 && chunk < static_cast<int>(chunks_.size()), "chunk ", chunk, " of ", chunks_.size());
  if (host_) host_->params_needed(static_cast<std::size_t>(chunk));
  Chunk& c = chunks_[static_cast<std::size_t>(chunk)];
  if (c.gather_pending) {
    o_.compute->wait(*c.gathered);
    c.gather_pending = false;
  }
  params_.stages[static_cast<std::size_t>(chunk)]->refresh_compute(*o_.compute, true);
}

void DistributedOptimizer::settle() {
  if (host_) host_->settle();
  if (dp_stream_) dp_stream_->synchronize();
  for (Chunk& c : chunks_) c.gather_pending = false;
}

std::vector<Tensor> DistributedOptimizer::full_moments(int which) {
  STP_ASSERT(which == 0 || which == 1, "moment ", which);
  // Each chunk's gradient buffer has the chunk's element count, and between steps its contents are
  // dead (the next step zeroes it before any backward): the moment is assembled there, so saving
  // takes no device memory beyond the plan's.
  for (std::size_t ci = 0; ci < chunks_.size(); ++ci) {
    Chunk& c = chunks_[ci];
    Tensor& t = c.grads;
    o_.compute->zero(t.raw(), t.bytes());
    for (std::size_t b = 0; b < c.buckets.size(); ++b) {
      CommSlice s = comm_slice(c.buckets[b].second, o_.dp_rank, o_.dp);
      if (s.count)
        o_.compute->copy(t.f32() + c.buckets[b].first + s.first, c.state[which].f32() + c.bucket_state[b],
                         s.count * sizeof(float));
    }
    if (comm_) gather_into(ci, t.f32(), true);
  }
  std::vector<Tensor> out;
  for (const ParamInfo& p : params_.list) out.push_back(p.grad);
  return out;
}

void DistributedOptimizer::gather_into(std::size_t chunk, float* data, bool head) {
  Chunk& c = chunks_[chunk];
  o_.compute->record(*c.final);
  dp_stream_->wait(*c.final);
  gather(chunk, data, nullptr, head);
  dp_stream_->record(*done_);
  o_.compute->wait(*done_);
}

std::vector<Tensor> DistributedOptimizer::full_parameters() {
  // As full_moments: the owned parts of the sharded masters are all-gathered into the tail of the
  // chunks' gradient buffers (the other parameters are whole on every rank already).
  for (std::size_t ci = 0; ci < chunks_.size(); ++ci) {
    Chunk& c = chunks_[ci];
    if (!c.masters.defined()) continue;
    for (std::size_t b = 0; b < c.buckets.size(); ++b) {
      if (c.buckets[b].first < c.split) continue;
      CommSlice s = comm_slice(c.buckets[b].second, o_.dp_rank, o_.dp);
      if (s.count)
        o_.compute->copy(c.grads.f32() + c.buckets[b].first + s.first,
                         c.masters.f32() + (c.bucket_state[b] - c.master_base), s.count * sizeof(float));
    }
    if (comm_) gather_into(ci, c.grads.f32(), false);
  }
  std::vector<Tensor> out;
  for (const ParamInfo& p : params_.list) out.push_back(p.sharded_master ? p.grad : p.param);
  return out;
}

void DistributedOptimizer::parameters_loaded() {
  for (const Segment& s : segments_) {
    const ParamInfo& p = params_.list[s.param];
    if (p.sharded_master) o_.compute->copy(master(s), p.grad.f32() + s.offset, s.count * sizeof(float));
  }
}

void DistributedOptimizer::load_moment(int which, std::size_t param, const std::vector<float>& shard) {
  STP_ASSERT(which == 0 || which == 1, "moment ", which);
  STP_ASSERT(param < params_.list.size(), "load_moment: parameter ", param, " of ", params_.list.size());
  for (const Segment& s : segments_) {
    if (s.param != param) continue;
    STP_ASSERT(s.offset + s.count <= shard.size(), "load_moment: ", shard.size(), " values for a segment ending at ",
               s.offset + s.count);
    Tensor dst = chunks_[s.chunk].state[which].view(static_cast<std::int64_t>(s.state_at),
                                                    Shape{static_cast<std::int64_t>(s.count)});
    upload(dst, shard.data() + s.offset, *o_.compute);
  }
}

}  // namespace stp
