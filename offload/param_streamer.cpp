#include "offload/param_streamer.h"

#include <algorithm>

#include "base/error.h"
#include "base/trace_names.h"
#include "memory/block_arena.h"

namespace stp {
namespace {

void add_distinct(std::vector<ParamInfo*>& to, const std::vector<ParamInfo*>& from) {
  for (ParamInfo* p : from)
    if (std::find(to.begin(), to.end(), p) == to.end()) to.push_back(p);
}

// The distinct parameters whose weights a pass reads, in the order the stage names them (a tied
// table can be named by two units of one stage; it is bound once): F(u) and B(u) unit u's (B also
// re-runs F's kernels under recompute), B(u) also those of unit u+1 it finalizes (Stage::pass_grads:
// B reads the norm whose gradient it writes). W reads none: its GEMMs take the records B left.
std::vector<ParamInfo*> pass_params(Stage& stage, int u, bool backward) {
  std::vector<ParamInfo*> out;
  add_distinct(out, stage.unit_params(u));
  if (backward) add_distinct(out, stage.pass_grads(u, false));
  return out;
}

// Whether a pass reads the f32 parameter: not a host master (no device kernel reads those, only
// their bf16 copies: ParamStore) and not a sharded one (none here).
bool streams_master(const ParamInfo& p) { return p.param.defined() && !p.host_master; }

bool is_backward(StreamedPass kind) { return kind == StreamedPass::Backward || kind == StreamedPass::BackwardWeight; }

// The parameters whose gradients the pass writes (Stage::pass_grads; a fused B and W: both).
std::vector<ParamInfo*> pass_writes(Stage& stage, int u, StreamedPass kind) {
  std::vector<ParamInfo*> out;
  if (kind == StreamedPass::Forward) return out;
  if (kind != StreamedPass::Weight) add_distinct(out, stage.pass_grads(u, false));
  if (kind != StreamedPass::Backward) add_distinct(out, stage.pass_grads(u, true));
  return out;
}

// A GEMM weight's bf16 copy is storage of its own; elsewhere `compute` is the parameter itself.
bool has_copy(const ParamInfo& p) {
  return p.compute.defined() && (!p.param.defined() || p.compute.raw() != p.param.raw());
}

}  // namespace

ParamStreamer::ParamStreamer(Device& device, Stream& compute, Allocator& arena, std::vector<bool> streamed,
                             bool prefetch)
    : compute_(compute),
      arena_(arena),
      streamed_(std::move(streamed)),
      prefetch_(prefetch),
      copy_(device.create_stream(trace::stream::kParamCopy)),
      computed_(device.create_event()),
      copied_(device.create_event()) {}

ParamStreamer::~ParamStreamer() = default;

bool ParamStreamer::streams(int chunk) const {
  return chunk >= 0 && static_cast<std::size_t>(chunk) < streamed_.size() && streamed_[static_cast<std::size_t>(chunk)];
}

void ParamStreamer::copy_stream_waits_for_compute() {
  compute_.record(*computed_);
  copy_->wait(*computed_);
}

// The device copies of the pass's weights (f32 parameters and bf16 copies), enqueued on the copy
// stream after everything enqueued on compute so far.
ParamStreamer::Fetched ParamStreamer::fetch(int chunk, Stage& stage, int u, bool backward) {
  Fetched f{chunk, &stage, u, backward, pass_params(stage, u, backward), {}, {}, {}};
  std::int64_t n_param = 0, n_copy = 0;
  for (const ParamInfo* p : f.params) {
    if (streams_master(*p)) n_param += p->param.numel();
    if (has_copy(*p)) n_copy += p->compute.numel();
  }
  if (f.params.empty()) return f;
  copy_stream_waits_for_compute();
  {
    MaybeCategoryScope weights(arena_, MemoryCategory::Weights);
    if (n_param > 0) f.weights = Tensor::empty_on(arena_, *copy_, {n_param});
    if (n_copy > 0) f.copies = Tensor::empty_on(arena_, *copy_, {n_copy}, DType::Bf16);
  }
  copy_->trace_begin(str("weights up ", chunk, " u", u, backward ? " B" : ""), trace::stream::kParamCopy);
  std::int64_t at_param = 0, at_copy = 0;
  for (const ParamInfo* p : f.params) {
    Tensor param, compute;
    if (streams_master(*p)) param = up(p->param, f.weights, at_param);
    if (has_copy(*p)) compute = up(p->compute, f.copies, at_copy);
    f.views.push_back({param, compute});
  }
  copy_->trace_end();
  for (const Tensor* t : {&f.weights, &f.copies}) t->record_use(*copy_);
  return f;
}

// Copies `host` into the next slice of `into` on the copy stream; returns the slice.
Tensor ParamStreamer::up(const Tensor& host, const Tensor& into, std::int64_t& at) {
  Tensor dev = into.view(at, host.shape());
  at += host.numel();
  copy_->copy(dev.raw(), host.raw(), host.bytes());
  counters_.h2d_bytes += host.bytes();
  ++counters_.h2d_copies;
  return dev;
}

// The device slice of p's gradient for the bound pass: the host copy brought up, or, for the walk's
// first writer, zeros (the host copy is zero then, so the bits are the same without the copy).
Tensor ParamStreamer::grads_in(const ParamInfo& p, std::int64_t& at) {
  if (!written_.insert(&p).second) return up(p.grad, grads_dev_, at);
  Tensor dev = grads_dev_.view(at, p.grad.shape());
  at += p.grad.numel();
  copy_->zero(dev.raw(), dev.bytes());
  counters_.zeroed_bytes += dev.bytes();
  return dev;
}

void ParamStreamer::prefetch(int chunk, Stage& stage, int u, StreamedPass kind) {
  if (!prefetch_ || !streams(chunk) || kind == StreamedPass::Weight) return;
  if (prefetched_.size() == kMaxPrefetched) prefetched_.erase(prefetched_.begin());
  prefetched_.push_back(fetch(chunk, stage, u, is_backward(kind)));
}

void ParamStreamer::begin_pass(int chunk, Stage& stage, int u, StreamedPass kind) {
  STP_ASSERT(!active_, "ParamStreamer: begin_pass while another pass is bound");
  if (!streams(chunk)) return;
  active_ = true;
  grads_ = false;
  const bool backward = is_backward(kind);
  // A W pass reads no weights: it neither fetches nor takes a set prefetched for another pass.
  auto hit = kind == StreamedPass::Weight
                 ? prefetched_.end()
                 : std::find_if(prefetched_.begin(), prefetched_.end(), [&](const Fetched& f) {
                     return f.chunk == chunk && f.stage == &stage && f.u == u && f.backward == backward;
                   });
  if (hit != prefetched_.end()) {
    current_ = std::move(*hit);
    prefetched_.erase(hit);
  } else if (kind != StreamedPass::Weight) {
    current_ = fetch(chunk, stage, u, backward);
  } else {
    current_ = Fetched{chunk, &stage, u, false, {}, {}, {}, {}};
  }
  // Bound: the parameters whose weights the pass reads (current_.params, with their views), then
  // those whose gradients it writes and whose weights it does not read (a W pass's).
  const std::vector<ParamInfo*> writes = pass_writes(stage, u, kind);
  std::vector<ParamInfo*> bind = current_.params;
  add_distinct(bind, writes);
  if (bind.empty()) return;
  auto written = [&](const ParamInfo* p) { return std::find(writes.begin(), writes.end(), p) != writes.end(); };
  std::int64_t n_grad = 0;
  for (const ParamInfo* p : writes) n_grad += p->grad.numel();
  grads_ = n_grad > 0;
  if (grads_) {
    copy_stream_waits_for_compute();
    MaybeCategoryScope gradients(arena_, MemoryCategory::Gradients);
    grads_dev_ = Tensor::empty_on(arena_, *copy_, {n_grad});
    copy_->trace_begin(str("grads up ", chunk, " u", u), trace::stream::kParamCopy);
  }
  std::int64_t at_grad = 0;
  for (std::size_t i = 0; i < bind.size(); ++i) {
    ParamInfo& p = *bind[i];
    const bool writes_grad = written(&p);
    bound_.push_back({&p, p.param, p.compute, p.grad, writes_grad});
    if (i < current_.views.size()) {
      const Fetched::Views& v = current_.views[i];
      if (v.param.defined()) p.param = v.param;
      p.compute = v.compute.defined() ? v.compute : p.param;
    } else {  // weights the pass does not read: unbound as well, so a read fails loudly
      p.param = Tensor();
      p.compute = Tensor();
    }
    // A gradient the pass does not write is not bound at all: a write to it would fail loudly
    // (an undefined tensor) rather than land in host memory behind the copies' back.
    if (kind != StreamedPass::Forward) p.grad = writes_grad ? grads_in(p, at_grad) : Tensor();
  }
  if (grads_) {
    copy_->trace_end();
    grads_dev_.record_use(*copy_);
  }
  copy_->record(*copied_);
  compute_.wait(*copied_);
}

void ParamStreamer::end_pass() {
  if (!active_) return;
  active_ = false;
  if (grads_ && !bound_.empty()) {
    grads_dev_.record_use(compute_);
    copy_stream_waits_for_compute();
    copy_->trace_begin("grads down", trace::stream::kParamCopy);
    for (const Bound& b : bound_) {
      if (!b.grad_bound) continue;
      copy_->copy(b.grad.raw(), b.p->grad.raw(), b.grad.bytes());
      counters_.d2h_bytes += b.grad.bytes();
      ++counters_.d2h_copies;
    }
    copy_->trace_end();
    grads_dev_.record_use(*copy_);
    pending_d2h_ = true;
  }
  // Allocated for the copy stream, so the arena does not know compute read them: without this a
  // buffer reused for another stream (a pipeline receive) could be written under the pass.
  for (const Tensor* t : {&current_.weights, &current_.copies, &grads_dev_}) t->record_use(compute_);
  for (const Bound& b : bound_) {
    b.p->param = b.param;
    b.p->compute = b.compute;
    b.p->grad = b.grad;
  }
  bound_.clear();
  current_ = Fetched();
  grads_dev_ = Tensor();
}

void ParamStreamer::walk_done(Stream& s) {
  // A weight copy fetched for a pass that did not come (none in a whole walk): the next step's
  // optimizer may change the host weights before it would be used.
  prefetched_.clear();
  written_.clear();
  host_ready(s);
}

void ParamStreamer::host_ready(Stream& s) {
  if (!pending_d2h_) return;
  pending_d2h_ = false;
  copy_->record(*copied_);
  s.wait(*copied_);
}

}  // namespace stp
