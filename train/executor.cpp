#include "train/executor.h"

#include <optional>

#include "base/error.h"
#include "base/trace_names.h"
#include "schedule/op.h"

namespace stp {

using sched::Message;
using sched::Op;
using sched::Part;
using sched::Pass;

std::uint32_t p2p_tag(Pass pass, int from_stage, int mb) {
  STP_ASSERT(from_stage < (1 << 10) && mb < (1 << 20), "p2p tag overflow: stage ", from_stage, " mb ", mb);
  return (pass == Pass::F ? 0u : 1u) << 31 | static_cast<std::uint32_t>(from_stage) << 20 |
         static_cast<std::uint32_t>(mb);
}

// One part of the op being run: which unit comes next and which all-reduce it must wait for.
struct Executor::Cursor {
  Part part;
  Stage* stage = nullptr;
  int next = 0;              // next unit (F ascending; B and W descending)
  int end = 0;               // one past the last unit in walking order
  Event* pending = nullptr;  // all-reduce the next step of this part waits for
  std::string label;         // "F1.5", "B0.3*", "W1.2"
  bool done() const { return next == end; }
};

Executor::Executor(RankResources resources) : r_(std::move(resources)) {
  STP_ASSERT(r_.schedule && r_.compute && r_.tp_comm && r_.device, "incomplete rank resources");
  for (const PipelineChannel& c : r_.channels) {
    STP_ASSERT(c.comm && c.stream && c.comm->size() == 2, "incomplete pipeline channel ", sched::to_string(c.channel));
    const int me = c.channel.src == r_.pp_rank ? 0 : 1;
    STP_ASSERT((me == 0 || c.channel.dst == r_.pp_rank) && c.comm->rank() == me, "pipeline channel ",
               sched::to_string(c.channel), " given to pp rank ", r_.pp_rank, " as group rank ", c.comm->rank());
  }
  STP_ASSERT(!r_.plan || !r_.plan->offloads() || r_.offload, "the memory plan offloads but rank ", r_.pp_rank,
             " has no offload engine");
  STP_ASSERT(!r_.plan || !r_.plan->streams_any() || r_.params, "the memory plan streams parameters but rank ",
             r_.pp_rank, " has no parameter streamer");
  STP_ASSERT(static_cast<int>(r_.stages.size()) == r_.schedule->chunks, "rank ", r_.pp_rank, " has ", r_.stages.size(),
             " stages, the schedule places ", r_.schedule->chunks, " chunks per rank");
  const auto& ops = r_.schedule->ranks[static_cast<std::size_t>(r_.pp_rank)];
  last_backward_.assign(r_.stages.size(), ops.size());
  for (std::size_t k = 0; k < ops.size(); ++k)
    for (int i = 0; i < ops[k].n_parts(); ++i) {
      const Part& p = ops[k].part(i);
      if (p.pass != Pass::F) last_backward_[static_cast<std::size_t>(p.chunk)] = k;
      if (p.pass == Pass::B && p.defer_w) deferred_w_.insert({p.chunk, p.mb});
    }
}

Executor::~Executor() = default;

// Events are reused from op to op. A wait captures the record made before it (core/device.h), so
// re-recording after the waits of the previous op were enqueued is safe. Each event is only ever
// recorded on one stream, so its records complete in order.
Event& Executor::new_event(Stream& stream) {
  auto& pool = pools_[&stream];
  if (pool.used == pool.events.size()) pool.events.push_back(r_.device->create_event());
  return *pool.events[pool.used++];
}

Stage& Executor::stage_of_chunk(int chunk) const { return *r_.stages[static_cast<std::size_t>(chunk)]; }

int Executor::local_chunk_of_stage(int stage) const {
  for (int c = 0; c < r_.schedule->chunks; ++c)
    if (r_.schedule->stage(r_.pp_rank, c) == stage) return c;
  STP_UNREACHABLE("stage ", stage, " is not on rank ", r_.pp_rank);
  return -1;
}

void Executor::set_loss_output(Tensor losses) { losses_ = std::move(losses); }

namespace {

// The forward part of an op (an F or F+F as it is; the F of F&B and F&W), or nothing for B and W.
std::optional<Op> forward_part(const Op& op) {
  switch (op.kind) {
    case sched::OpKind::F: return Op::f(op.a.chunk, op.a.mb);
    case sched::OpKind::FF: return Op::ff(op.a.chunk, op.a.mb, op.b.mb);
    case sched::OpKind::FB:
    case sched::OpKind::FW: return Op::f(op.a.chunk, op.a.mb);
    case sched::OpKind::B:
    case sched::OpKind::W: return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

void Executor::run_step() { walk(false); }

void Executor::run_forward() { walk(true); }

void Executor::walk(bool forward_only) {
  const auto& ops = r_.schedule->ranks[static_cast<std::size_t>(r_.pp_rank)];
  params_needed_.assign(r_.stages.size(), false);
  for (std::size_t k = 0; k < ops.size(); ++k) {
    std::optional<Op> fwd = forward_only ? forward_part(ops[k]) : std::optional<Op>(ops[k]);
    if (!fwd) continue;
    const Op& op = *fwd;
    for (auto& [stream, pool] : pools_) pool.used = 0;
    if (forward_only) {
      const sched::OpMessages msgs = sched::op_messages(*r_.schedule, r_.pp_rank, op);
      post_receives(msgs.recv);
      run_parts(op);
      copy_losses(op);
      local_handoffs(op);
      post_sends(msgs.send);
      for (int i = 0; i < op.n_parts(); ++i)  // a part runs every unit: the chunk is done with mb
        stage_of_chunk(op.part(i).chunk).release_microbatch(op.part(i).mb, *r_.compute);
      continue;
    }
    if (r_.plan && k < r_.plan->prefetch.size())
      for (const PrefetchPoint& p : r_.plan->prefetch[k])  // a W point starts with the first unit W walks
        r_.offload->prefetch({p.chunk, p.mb, p.weight, p.weight ? stage_of_chunk(p.chunk).num_units() - 1 : -1});
    const sched::OpMessages msgs = sched::op_messages(*r_.schedule, r_.pp_rank, op);
    post_receives(msgs.recv);
    need_params(op);
    if (r_.trace) r_.compute->trace_begin(sched::to_string(op), trace::cat::kOp);
    run_parts(op);
    copy_losses(op);
    local_handoffs(op);
    if (r_.trace) r_.compute->trace_end();
    for (std::size_t c = 0; c < last_backward_.size(); ++c)
      if (last_backward_[c] == k) final_pending_.push_back(static_cast<int>(c));
    post_sends(msgs.send);
    release_finished(op);
    report_grads_final();
  }
  if (r_.params) r_.params->walk_done(*r_.compute);
}

// Chunks whose gradients became final are reported after the op's sends, so the pipeline's
// messages are enqueued before the data-parallel all-reduce the report starts.
void Executor::report_grads_final() {
  if (r_.params && !final_pending_.empty()) r_.params->host_ready(*r_.compute);
  for (int c : final_pending_)
    if (r_.grads_final) r_.grads_final(c);
  final_pending_.clear();
}

void Executor::need_params(const Op& op) {
  if (!r_.params_needed) return;
  for (int i = 0; i < op.n_parts(); ++i) {
    const int c = op.part(i).chunk;
    if (params_needed_[static_cast<std::size_t>(c)]) continue;
    params_needed_[static_cast<std::size_t>(c)] = true;
    if (r_.trace)
      r_.compute->trace_begin(str("params chunk ", c), trace::cat::kParams, TraceArgs().add(trace::arg::kChunk, c));
    r_.params_needed(c);
    if (r_.trace) r_.compute->trace_end();
  }
}

const PipelineChannel& Executor::channel(const Message& m) const {
  const sched::P2pChannel want = sched::channel_of(m);
  for (const PipelineChannel& c : r_.channels)
    if (c.channel == want) return c;
  STP_UNREACHABLE("rank ", r_.pp_rank, " has no pipeline channel ", sched::to_string(want));
  return r_.channels.front();
}

void Executor::Sink::p2p_waits_for_compute(const sched::P2pChannel& c) {
  Event& computed = e.new_event(*e.r_.compute);
  e.r_.compute->record(computed);
  for (const PipelineChannel& ch : e.r_.channels)
    if (ch.channel == c) ch.stream->wait(computed);
}

void Executor::Sink::compute_waits_for_p2p(const sched::P2pChannel& c) {
  for (const PipelineChannel& ch : e.r_.channels)
    if (ch.channel == c) {
      Event& landed = e.new_event(*ch.stream);
      ch.stream->record(landed);
      e.r_.compute->wait(landed);
    }
}

// ---- pipeline messages ------------------------------------------------------------------------

Tensor Executor::message_buffer(const Message& m, bool incoming, Stream* writer) {
  if (incoming) {
    Stage& st = stage_of_chunk(local_chunk_of_stage(m.to_stage));
    return m.pass == Pass::F ? st.input_activation(m.mb, writer) : st.grad_output(m.mb, writer);
  }
  Stage& st = stage_of_chunk(local_chunk_of_stage(m.from_stage));
  return m.pass == Pass::F ? st.output_activation(m.mb) : st.grad_input(m.mb);
}

// A receive buffer is taken on its channel's stream and kept by the operation; a send buffer is
// marked used by the channel's stream after the send is enqueued, so the stage may drop it.
void Executor::post_receives(const std::vector<Message>& recv) {
  std::vector<sched::P2pPending> ops;
  for (const Message& m : recv) {
    const PipelineChannel& ch = channel(m);
    Tensor buf = message_buffer(m, true, ch.stream);
    ops.push_back({m, false, [this, &ch, m, buf]() mutable {
                     if (r_.trace) ch.stream->trace_begin(trace::recv_span(sched::to_string(m)), trace::cat::kP2p);
                     ch.comm->recv(*ch.stream, buf.raw(), buf.bytes(), 0, p2p_tag(m.pass, m.from_stage, m.mb));
                     buf.record_use(*ch.stream);
                     if (r_.trace) ch.stream->trace_end();
                   }});
  }
  sched::post_receives(sink_, std::move(ops));
}

void Executor::post_sends(const std::vector<Message>& send) {
  std::vector<sched::P2pPending> ops;
  for (const Message& m : send) {
    const PipelineChannel& ch = channel(m);
    Tensor buf = message_buffer(m, false);
    ops.push_back({m, true, [this, &ch, m, buf]() mutable {
                     if (r_.trace) ch.stream->trace_begin(trace::send_span(sched::to_string(m)), trace::cat::kP2p);
                     ch.comm->send(*ch.stream, buf.raw(), buf.bytes(), 1, p2p_tag(m.pass, m.from_stage, m.mb));
                     if (r_.trace) ch.stream->trace_end();
                     buf.record_use(*ch.stream);  // the stage may drop it before the send runs
                   }});
  }
  sched::post_sends(sink_, std::move(ops));
}

// Stage-to-stage hand-over on this rank: the V's turn (chunk 0 -> chunk 1 forward, chunk 1 ->
// chunk 0 backward on rank p-1). Done when the producer finishes — after its op's last all-reduce
// and before the producing stage may release the microbatch — as a device copy on compute.
void Executor::local_handoffs(const Op& op) {
  for (int i = 0; i < op.n_parts(); ++i) {
    const Part& p = op.part(i);
    if (p.pass == Pass::W) continue;
    int to = sched::output_stage(*r_.schedule, r_.pp_rank, p);
    if (to < 0 || sched::rank_of_stage(*r_.schedule, to) != r_.pp_rank) continue;
    Message m{p.pass, r_.schedule->stage(r_.pp_rank, p.chunk), to, p.mb, r_.pp_rank, r_.pp_rank};
    Tensor from = message_buffer(m, false);
    Tensor into = message_buffer(m, true);
    STP_ASSERT(from.bytes() == into.bytes(), "hand-over size mismatch");
    r_.compute->copy(into.raw(), from.raw(), into.bytes());
  }
}

// ---- compute: braided and plain parts -----------------------------------------------------------

void Executor::run_parts(const Op& op) {
  std::vector<Cursor> cursors;
  for (int i = 0; i < op.n_parts(); ++i) {
    const Part& p = op.part(i);
    Cursor c;
    c.part = p;
    c.stage = &stage_of_chunk(p.chunk);
    int units = c.stage->num_units();
    c.next = p.pass == Pass::F ? 0 : units - 1;
    c.end = p.pass == Pass::F ? units : -1;
    c.label = sched::to_string(p);
    cursors.push_back(std::move(c));
  }
  // Alternate one step of each part (a one-part op simply runs its steps in order).
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (Cursor& c : cursors) {
      if (c.done()) continue;
      step(c);
      progressed = true;
    }
  }
  // The tail all-reduce of each part has nothing left to hide under: later work waits for it.
  for (Cursor& c : cursors)
    if (c.pending) r_.compute->wait(*c.pending);
}

void Executor::step(Cursor& c) {
  if (c.pending) {  // the previous unit of this part must be reduced first
    r_.compute->wait(*c.pending);
    c.pending = nullptr;
  }
  int u = c.next;
  c.next += c.part.pass == Pass::F ? 1 : -1;
  const int mb = c.part.mb;
  Stage& st = *c.stage;
  auto traced = [&](Pass pass, auto&& fn) {
    trace_unit(c, u, pass, true);
    fn();
    trace_unit(c, u, pass, false);
  };
  auto begin_pass = [&](StreamedPass kind) {  // and the weights of this part's next unit start coming
    if (!r_.params) return;
    r_.params->begin_pass(c.part.chunk, st, u, kind);
    if (!c.done()) r_.params->prefetch(c.part.chunk, st, c.next, kind);
  };
  auto end_pass = [&] {
    if (r_.params) r_.params->end_pass();
  };
  switch (c.part.pass) {
    case Pass::F: {
      Tensor t;
      begin_pass(StreamedPass::Forward);
      traced(Pass::F, [&] { t = st.forward(u, mb, *r_.compute); });
      end_pass();
      if (t.defined()) all_reduce_after(c, t, st.unit_name(u));
      offload_after_forward(c.part.chunk, u, mb);
      break;
    }
    case Pass::B: {
      // The whole set before the first unit B walks, or (late reloads) each unit's before its B.
      if (r_.offload && (u == st.num_units() - 1 || backward_key(c.part.chunk, u, mb).unit >= 0))
        r_.offload->make_ready(backward_key(c.part.chunk, u, mb), *r_.compute);
      Tensor t;
      begin_pass(c.part.defer_w ? StreamedPass::Backward : StreamedPass::BackwardWeight);
      traced(Pass::B, [&] { t = st.backward_input(u, mb, *r_.compute); });
      if (t.defined()) all_reduce_after(c, t, st.unit_name(u));
      if (!c.part.defer_w) traced(Pass::W, [&] { st.backward_weight(u, mb, *r_.compute); });  // hides the AR
      else offload_after_backward(c.part.chunk, u, mb);
      end_pass();
      break;
    }
    case Pass::W:
      if (r_.offload) {  // unit by unit: this unit's W records, and the next unit's start coming back
        r_.offload->make_ready({c.part.chunk, mb, true, u}, *r_.compute);
        if (!c.done()) r_.offload->prefetch({c.part.chunk, mb, true, c.next});
      }
      begin_pass(StreamedPass::Weight);
      traced(Pass::W, [&] { st.backward_weight(u, mb, *r_.compute); });
      end_pass();
      break;
  }
}

// With a trace: opens (begin) or closes the span of one unit pass on compute.
void Executor::trace_unit(const Cursor& c, int u, Pass pass, bool begin) {
  if (!r_.trace) return;
  if (!begin) {
    r_.compute->trace_end();
    return;
  }
  const char* cat = pass == Pass::F   ? trace::cat::kForward
                    : pass == Pass::B ? trace::cat::kBackward
                                      : trace::cat::kWeight;
  r_.compute->trace_begin(str(c.label, " ", c.stage->unit_name(u)), cat,
                          TraceArgs()
                              .add(trace::arg::kPart, c.label)
                              .add(trace::arg::kUnit, u)
                              .add(trace::arg::kMb, c.part.mb)
                              .add(trace::arg::kChunk, c.part.chunk)
                              .add(trace::arg::kPass, cat));
}

// The records of (chunk, unit u, mb) when the plan offloads that unit and it holds any; else null.
RecordSet* Executor::offloaded_records(int chunk, int u, int mb) {
  if (!r_.plan || !r_.plan->units[static_cast<std::size_t>(chunk)][static_cast<std::size_t>(u)].offload) return nullptr;
  return stage_of_chunk(chunk).record_set(u, mb);
}

OffloadEngine::Key Executor::backward_key(int chunk, int u, int mb) const {
  return {chunk, mb, false, r_.plan && r_.plan->late_reloads ? u : -1};
}

void Executor::offload_after_forward(int chunk, int u, int mb) {
  if (RecordSet* set = offloaded_records(chunk, u, mb))
    r_.offload->offload(backward_key(chunk, u, mb), u, *set, deferred_w_.count({chunk, mb}) != 0);
}

void Executor::offload_after_backward(int chunk, int u, int mb) {
  if (RecordSet* set = offloaded_records(chunk, u, mb))
    r_.offload->offload_for_weight(backward_key(chunk, u, mb), u, *set);
}

void Executor::all_reduce_after(Cursor& c, const Tensor& t, const std::string& unit) {
  STP_ASSERT(r_.tp && r_.tp->size() > 1, "unit ", unit, " returned a tensor to all-reduce but tp = 1");
  Event& produced = new_event(*r_.compute);
  r_.compute->record(produced);
  r_.tp_comm->wait(produced);
  if (r_.trace)
    r_.tp_comm->trace_begin(str("AR ", c.label, " ", unit), trace::cat::kTpComm,
                            TraceArgs().add(trace::arg::kPart, c.label).add(trace::arg::kBytes, t.bytes()));
  r_.tp->all_reduce_sum(*r_.tp_comm, t.f32(), static_cast<std::size_t>(t.numel()));
  t.record_use(*r_.tp_comm);
  if (r_.trace) r_.tp_comm->trace_end();
  Event& reduced = new_event(*r_.tp_comm);
  r_.tp_comm->record(reduced);
  c.pending = &reduced;
}

// ---- losses and release -------------------------------------------------------------------------

void Executor::copy_losses(const Op& op) {
  if (!losses_.defined()) return;
  for (int i = 0; i < op.n_parts(); ++i) {
    const Part& p = op.part(i);
    Stage& st = stage_of_chunk(p.chunk);
    if (p.pass != Pass::F || !st.is_last()) continue;
    STP_ASSERT(p.mb >= 1 && p.mb <= losses_.numel(), "microbatch ", p.mb, " outside the loss buffer");
    r_.compute->copy(losses_.f32() + (p.mb - 1), st.loss(p.mb).raw(), sizeof(float));
  }
}

// A chunk-microbatch is finished after its B with fused W, or after the W that consumes it.
void Executor::release_finished(const Op& op) {
  for (int i = 0; i < op.n_parts(); ++i) {
    const Part& p = op.part(i);
    bool finished = (p.pass == Pass::B && !p.defer_w) || p.pass == Pass::W;
    if (finished) stage_of_chunk(p.chunk).release_microbatch(p.mb, *r_.compute);
  }
}

}  // namespace stp
