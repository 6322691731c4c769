#include "offload/param_streamer.h"

#include <algorithm>

#include "base/error.h"
#include "base/trace_names.h"
#include "memory/block_arena.h"

namespace stp {
namespace {

// The distinct parameters of a pass, in the order the stage names them (a tied table can be named
// by two units of one stage; it is bound once).
std::vector<ParamInfo*> pass_params(Stage& stage, int u, StreamedPass kind) {
  std::vector<ParamInfo*> out = stage.unit_params(u);
  const bool backward = kind == StreamedPass::Backward || kind == StreamedPass::BackwardWeight;
  if (backward && u + 1 < stage.num_units())
    for (ParamInfo* p : stage.unit_params(u + 1)) out.push_back(p);
  std::vector<ParamInfo*> distinct;
  for (ParamInfo* p : out)
    if (std::find(distinct.begin(), distinct.end(), p) == distinct.end()) distinct.push_back(p);
  return distinct;
}

// Whether a pass reads the f32 parameter: not a host master (no device kernel reads those, only
// their bf16 copies: ParamStore) and not a sharded one (none here).
bool streams_master(const ParamInfo& p) { return p.param.defined() && !p.host_master; }

// A GEMM weight's bf16 copy is storage of its own; elsewhere `compute` is the parameter itself.
bool has_copy(const ParamInfo& p) {
  return p.compute.defined() && (!p.param.defined() || p.compute.raw() != p.param.raw());
}

}  // namespace

ParamStreamer::ParamStreamer(Device& device, Stream& compute, Allocator& arena, std::vector<bool> streamed)
    : compute_(compute),
      arena_(arena),
      streamed_(std::move(streamed)),
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

void ParamStreamer::begin_pass(int chunk, Stage& stage, int u, StreamedPass kind) {
  STP_ASSERT(!active_, "ParamStreamer: begin_pass while another pass is bound");
  if (!streams(chunk)) return;
  active_ = true;
  grads_ = kind != StreamedPass::Forward;
  std::int64_t n_param = 0, n_copy = 0, n_grad = 0;
  for (ParamInfo* p : pass_params(stage, u, kind)) {
    bound_.push_back({p, p->param, p->compute, p->grad});
    if (streams_master(*p)) n_param += p->param.numel();
    if (has_copy(*p)) n_copy += p->compute.numel();
    n_grad += p->grad.numel();
  }
  if (bound_.empty()) return;
  copy_stream_waits_for_compute();
  {
    MaybeCategoryScope weights(arena_, MemoryCategory::Weights);
    if (n_param > 0) weights_ = Tensor::empty_on(arena_, *copy_, {n_param});
    if (n_copy > 0) copies_ = Tensor::empty_on(arena_, *copy_, {n_copy}, DType::Bf16);
  }
  if (grads_) {
    MaybeCategoryScope gradients(arena_, MemoryCategory::Gradients);
    grads_dev_ = Tensor::empty_on(arena_, *copy_, {n_grad});
  }
  copy_->trace_begin(str("params up ", chunk, " u", u), trace::stream::kParamCopy);
  std::int64_t at_param = 0, at_copy = 0, at_grad = 0;
  auto up = [&](Tensor& view, const Tensor& into, std::int64_t& at) {
    Tensor dev = into.view(at, view.shape());
    at += view.numel();
    copy_->copy(dev.raw(), view.raw(), view.bytes());
    counters_.h2d_bytes += view.bytes();
    ++counters_.h2d_copies;
    view = dev;
  };
  for (Bound& b : bound_) {
    ParamInfo& p = *b.p;
    const bool copy = has_copy(p);
    if (streams_master(p)) up(p.param, weights_, at_param);
    p.compute = copy ? p.compute : p.param;
    if (copy) up(p.compute, copies_, at_copy);
    if (grads_) up(p.grad, grads_dev_, at_grad);
  }
  copy_->trace_end();
  for (const Tensor* t : {&weights_, &copies_, &grads_dev_}) t->record_use(*copy_);
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
  for (const Tensor* t : {&weights_, &copies_, &grads_dev_}) t->record_use(compute_);
  for (const Bound& b : bound_) {
    b.p->param = b.param;
    b.p->compute = b.compute;
    b.p->grad = b.grad;
  }
  bound_.clear();
  weights_ = copies_ = grads_dev_ = Tensor();
}

void ParamStreamer::host_ready(Stream& s) {
  if (!pending_d2h_) return;
  pending_d2h_ = false;
  copy_->record(*copied_);
  s.wait(*copied_);
}

}  // namespace stp
