#include "models/stage_base.h"

#include <algorithm>

#include "base/error.h"
#include "memory/block_arena.h"

namespace stp {
namespace {

// Every handle the stage drops goes through the call's scope: work already enqueued may still
// read or write the tensor, so its storage is released in stream order.
void replace(Tensor& slot, Tensor value, CallScope& cs) {
  cs.release(std::move(slot));
  slot = std::move(value);
}

}  // namespace

StageBase::StageBase(const StageSpec& spec, int n_layer, const UnitDims& dims, ParamStore params, Allocator& alloc)
    : alloc_(alloc), params_(std::move(params)), spec_(spec), n_layer_(n_layer), B_(dims.B), T_(dims.T), C_(dims.C) {
  units_.push_back(Unit{is_first() ? UnitKind::Embed : UnitKind::Input, is_first() ? "embed" : "input"});
  for (int i = spec.layer_begin; i < spec.layer_end; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    units_.push_back(Unit{UnitKind::Attn, h + "attn", i});
    units_.push_back(Unit{UnitKind::Mlp, h + "mlp", i});
  }
  if (is_last()) units_.push_back(Unit{UnitKind::Head, "head"});
  records_.resize(units_.size());
  unit_params_.resize(units_.size());
  unit_norm_.resize(units_.size());
  unit_backward_.resize(units_.size());
}

std::vector<ParamInfo*> StageBase::pass_grads(int u, bool weight) {
  STP_ASSERT(u >= 0 && u < num_units(), "unit ", u, " outside [0, ", num_units(), ")");
  const auto i = static_cast<std::size_t>(u);
  // The chunked head's F writes the head's gradients: its B and W add nothing.
  if (units_[i].kind == UnitKind::Head && loss_chunk_tokens_ > 0) return {};
  auto among = [](const std::vector<ParamInfo*>& list, const ParamInfo* p) {
    return std::find(list.begin(), list.end(), p) != list.end();
  };
  std::vector<ParamInfo*> out;
  // A tiled B runs its W inside (set_unit_tiles): it writes the W's gradients too, and W none.
  if (weight && tiled(u)) return out;
  if (weight || tiled(u))
    for (ParamInfo* p : unit_params_[i])
      if (!among(unit_norm_[i], p) && !among(unit_backward_[i], p)) out.push_back(p);
  if (weight) return out;
  for (ParamInfo* p : unit_backward_[i]) out.push_back(p);
  if (u + 1 < num_units() && is_branch(units_[i + 1].kind))
    for (ParamInfo* p : unit_norm_[i + 1])
      if (!among(out, p)) out.push_back(p);
  return out;
}

std::string StageBase::unit_name(int u) const {
  STP_ASSERT(u >= 0 && u < num_units(), "unit ", u, " outside [0, ", num_units(), ")");
  return units_[static_cast<std::size_t>(u)].name;
}

// ---- per-microbatch state -------------------------------------------------------------------------

StageBase::Microbatch& StageBase::mb_state(int mb) { return mbs_[mb]; }

RecordSet& StageBase::records(int u, int mb) {
  auto& per_mb = records_[static_cast<std::size_t>(u)];
  auto it = per_mb.find(mb);
  if (it == per_mb.end()) it = per_mb.emplace(mb, RecordSet(units_[static_cast<std::size_t>(u)].name + ".")).first;
  return it->second;
}

void StageBase::drop_empty_records(int u, int mb) {
  auto& per_mb = records_[static_cast<std::size_t>(u)];
  auto it = per_mb.find(mb);
  if (it != per_mb.end() && it->second.empty()) per_mb.erase(it);
}

Tensor StageBase::io_buffer(Tensor& slot, Shape shape, Stream* writer) {
  if (!slot.defined()) {
    MaybeCategoryScope as(alloc_, MemoryCategory::Buffers);
    slot = writer ? Tensor::empty_on(alloc_, *writer, std::move(shape)) : Tensor::empty(alloc_, std::move(shape));
  }
  return slot;
}

Tensor StageBase::tokens(int mb) {
  STP_ASSERT(is_first(), "tokens() of a stage without the embedding");
  return io_buffer(mb_state(mb).tokens, {B_, T_});
}

Tensor StageBase::targets(int mb) {
  STP_ASSERT(is_last(), "targets() of a stage without the head");
  return io_buffer(mb_state(mb).targets, {B_, T_});
}

Tensor StageBase::input_activation(int mb, Stream* writer) {
  Microbatch& m = mb_state(mb);
  STP_ASSERT(!is_first() && m.next_f == 0, "input_activation(", mb, ") of the first stage or after F(0)");
  return io_buffer(m.input, {B_, T_, C_}, writer);
}

Tensor StageBase::output_activation(int mb) {
  Microbatch& m = mb_state(mb);
  STP_ASSERT(!is_last() && m.output.defined(), "output_activation(", mb,
             ") of the last stage, before its last F or taken already");
  // Handed over: the stage keeps no handle, so the buffer is free once the executor's send (or
  // hand-over copy) is enqueued and dropped, not when this microbatch's backward starts.
  return std::move(m.output);
}

Tensor StageBase::grad_output(int mb, Stream* writer) {
  Microbatch& m = mb_state(mb);
  STP_ASSERT(!is_last() && m.next_b < 0, "grad_output(", mb, ") of the last stage or after B started");
  return io_buffer(m.grad_output, {B_, T_, C_}, writer);
}

Tensor StageBase::grad_input(int mb) {
  Microbatch& m = mb_state(mb);
  STP_ASSERT(!is_first() && m.grad_input.defined(), "grad_input(", mb,
             ") of the first stage, before B(0) or taken already");
  return std::move(m.grad_input);  // handed over, like output_activation
}

Tensor StageBase::loss(int mb) {
  STP_ASSERT(is_last(), "loss() of a stage without the head");
  return io_buffer(mb_state(mb).loss, {1});
}

// ---- passes ------------------------------------------------------------------------------------------

Tensor StageBase::forward(int u, int mb, Stream& s) {
  Microbatch& m = mb_state(mb);
  STP_ASSERT(m.next_f == u && u < num_units(), "F(", u, ", mb ", mb, ") out of order: next F is ", m.next_f);
  CallScope cs(alloc_, s);
  RecordSet& rec = records(u, mb);
  const Unit& unit = units_[static_cast<std::size_t>(u)];
  Tensor reduce;
  switch (unit.kind) {
    case UnitKind::Embed:
      STP_ASSERT(m.tokens.defined(), "F(embed, mb ", mb, ") before tokens(", mb, ") was filled");
      m.fwd_x = embed_forward(m.tokens, rec, cs);
      if (spec_.vocab_sharded()) reduce = m.fwd_x;  // this rank's rows' partial of x0
      break;
    case UnitKind::Input:
      STP_ASSERT(m.input.defined(), "F(input, mb ", mb, ") before input_activation(", mb, ") was filled");
      m.fwd_x = std::move(m.input);
      m.input = Tensor();
      break;
    case UnitKind::Attn:
    case UnitKind::Mlp:
      replace(m.fwd_x, branch_forward(u, m.fwd_x, rec, cs), cs);
      drop_recomputed(recomputed_records(u, unit.recompute), rec, cs);
      if (spec_.tp_size > 1) reduce = m.fwd_x;
      break;
    case UnitKind::Head:
      STP_ASSERT(m.targets.defined(), "F(head, mb ", mb, ") before targets(", mb, ") was filled");
      head_forward(m.fwd_x, m.targets, loss(mb), LossChunking{loss_chunk_tokens_, !forward_only_, loss_scale_}, rec,
                   cs);
      cs.release(std::move(m.fwd_x));
      break;
  }
  if (++m.next_f == num_units() && !is_last()) {
    m.output = std::move(m.fwd_x);
    m.fwd_x = Tensor();
  }
  if (forward_only_) {  // nothing is kept for a backward
    for (const ActivationRecord& r : rec.list()) cs.release(r.tensor);
    rec.mutable_list().clear();
  }
  drop_empty_records(u, mb);
  return reduce;
}

void StageBase::set_forward_only(bool on) {
  STP_CHECK(mbs_.empty(), "set_forward_only(", on, ") while microbatches are in flight: set it between steps");
  forward_only_ = on;
}

void StageBase::set_loss_chunk_tokens(std::int64_t tokens) {
  STP_CHECK(tokens >= 0, "loss chunk of ", tokens, " tokens: give a positive number of tokens, or 0 for none");
  STP_CHECK(mbs_.empty(), "set_loss_chunk_tokens(", tokens, ") while microbatches are in flight: set it between steps");
  loss_chunk_tokens_ = tokens;
}

void StageBase::set_unit_tiles(int tiles) {
  STP_CHECK(tiles >= 1 && B_ % tiles == 0, "unit tiles ", tiles, " with micro_batch_size ", B_,
            ": give a positive number of tiles that divides micro_batch_size");
  STP_CHECK(mbs_.empty(), "set_unit_tiles(", tiles, ") while microbatches are in flight: set it between steps");
  unit_tiles_ = tiles;
}

bool StageBase::tiled(int u) const {
  const Unit& unit = unit_at(u);
  return unit_tiles_ > 1 && is_branch(unit.kind) && unit.recompute == Recompute::Full;
}

// The gradient w.r.t. the output of unit u: the residual gradient plus, when unit u+1 is a branch,
// its norm backward on the all-reduced gradient (models/gpt2_units.h, Note [LayerNorm after the
// all-reduce]).
Tensor StageBase::finalize_next(int u, int mb, Microbatch& m, CallScope& cs) {
  if (!m.bwd_pending.defined()) return m.bwd_dy;
  Tensor dx = finalize_norm(u + 1, m.bwd_dy, m.bwd_pending, records(u + 1, mb), cs);
  drop_empty_records(u + 1, mb);
  cs.release(std::move(m.bwd_pending));
  m.bwd_pending = Tensor();
  return dx;
}

Tensor StageBase::backward_input(int u, int mb, Stream& s) {
  STP_ASSERT(!forward_only_, "B(", u, ", mb ", mb, ") in forward-only mode");
  Microbatch& m = mb_state(mb);
  if (m.next_b < 0) {  // B starts: take the gradient seed from the next stage (or the head's loss)
    STP_ASSERT(m.next_f == num_units(), "B(", u, ", mb ", mb, ") before the last F of mb");
    m.next_b = num_units() - 1;
    if (!is_last()) {
      STP_ASSERT(m.grad_output.defined(), "B(", u, ", mb ", mb, ") before grad_output(", mb, ") was filled");
      m.bwd_dy = std::move(m.grad_output);
      m.grad_output = Tensor();
    }
  }
  STP_ASSERT(m.next_b == u, "B(", u, ", mb ", mb, ") out of order: next B is ", m.next_b);
  CallScope cs(alloc_, s);
  cs.release(std::move(m.output));  // not taken (no executor: a stage driven alone)
  RecordSet& rec = records(u, mb);
  const Unit& unit = units_[static_cast<std::size_t>(u)];
  Tensor reduce;
  switch (unit.kind) {
    case UnitKind::Head:
      m.bwd_dy = head_backward_input(loss_scale_, rec, cs);
      if (spec_.vocab_sharded()) reduce = m.bwd_dy;  // a partial: whole before B(u-1) reads it
      break;
    case UnitKind::Attn:
    case UnitKind::Mlp: {
      if (tiled(u)) {  // the recompute, B and W group by group, after the gradient they start from
        Tensor dy = finalize_next(u, mb, m, cs);
        m.bwd_pending = branch_backward_tiled(u, dy, unit_tiles_, rec, cs);
        replace(m.bwd_dy, dy, cs);
        if (spec_.tp_size > 1) reduce = m.bwd_pending;
        break;
      }
      // Regenerate what F dropped first: B below, B(u-1) and W(u) read the records as usual.
      branch_recompute(u, unit.recompute, rec, cs);
      Tensor dy = finalize_next(u, mb, m, cs);
      m.bwd_pending = branch_backward_input(u, dy, rec, cs);
      replace(m.bwd_dy, dy, cs);
      if (spec_.tp_size > 1) reduce = m.bwd_pending;
      break;
    }
    case UnitKind::Embed:
      rec.save("dx", finalize_next(u, mb, m, cs), RecordReader::W, 'B');
      cs.release(std::move(m.bwd_dy));
      break;
    case UnitKind::Input:
      m.grad_input = finalize_next(u, mb, m, cs);
      cs.release(std::move(m.bwd_dy));
      break;
  }
  --m.next_b;
  drop_empty_records(u, mb);
  return reduce;
}

void StageBase::backward_weight(int u, int mb, Stream& s) {
  Microbatch& m = mb_state(mb);
  STP_ASSERT(m.next_b >= -1 && m.next_b < u && m.next_f == num_units() && u < num_units() && m.next_b != u, "W(", u,
             ", mb ", mb, ") before its B");
  CallScope cs(alloc_, s);
  RecordSet& rec = records(u, mb);
  switch (units_[static_cast<std::size_t>(u)].kind) {
    case UnitKind::Embed: embed_backward_weight(rec, cs); break;
    case UnitKind::Input: break;
    case UnitKind::Attn:
    case UnitKind::Mlp:
      if (!tiled(u)) branch_backward_weight(u, rec, cs);  // a tiled B ran it
      break;
    case UnitKind::Head: head_backward_weight(rec, cs); break;
  }
  drop_empty_records(u, mb);
}

// ---- records, grads, release ---------------------------------------------------------------------------

std::vector<ActivationRecord> StageBase::activation_records(int u, int mb) const {
  const auto& per_mb = records_.at(static_cast<std::size_t>(u));
  auto it = per_mb.find(mb);
  return it == per_mb.end() ? std::vector<ActivationRecord>{} : it->second.list();
}

RecordSet* StageBase::record_set(int u, int mb) {
  auto& per_mb = records_.at(static_cast<std::size_t>(u));
  auto it = per_mb.find(mb);
  return it == per_mb.end() ? nullptr : &it->second;
}

std::size_t StageBase::live_record_bytes() const {
  std::size_t total = 0;
  for (const auto& per_mb : records_)
    for (const auto& [mb, rec] : per_mb) total += rec.bytes();
  return total;
}

// ---- recompute -------------------------------------------------------------------------------------------

const StageBase::Unit& StageBase::unit_at(int u) const {
  STP_CHECK(u >= 0 && u < num_units(), "unit ", u, " outside [0, ", num_units(), ")");
  return units_[static_cast<std::size_t>(u)];
}

std::vector<RecomputedRecord> StageBase::recomputed_records(int u, Recompute r) const {
  return is_branch(unit_at(u).kind) ? branch_recomputed_records(u, r) : std::vector<RecomputedRecord>{};
}

void StageBase::set_recompute(int u, Recompute r) {
  STP_CHECK(u >= 0 && u < num_units(), "set_recompute: unit ", u, " outside [0, ", num_units(), ")");
  Unit& unit = units_[static_cast<std::size_t>(u)];
  STP_CHECK(r == Recompute::None || is_branch(unit.kind), "set_recompute(", unit.name, ", ", to_string(r),
            "): only attention and MLP units can recompute; ", unit.name, " accepts only none");
  // B regenerates what F dropped under the policy F ran with: no microbatch may be in between.
  STP_CHECK(records_[static_cast<std::size_t>(u)].empty(), "set_recompute(", unit.name, ", ", to_string(r),
            ") while a microbatch holds records of the unit: change the policy between steps");
  unit.recompute = r;
}

Recompute StageBase::recompute(int u) const { return unit_at(u).recompute; }

double StageBase::recompute_cost(int u, Recompute r) const {
  return is_branch(unit_at(u).kind) ? branch_recompute_cost(u, r) : 0.0;
}

std::size_t StageBase::recompute_saving(int u, Recompute r) const {
  std::size_t bytes = 0;
  for (const RecomputedRecord& rec : recomputed_records(u, r)) bytes += rec.bytes();
  return bytes;
}

void StageBase::zero_grads(Stream& s) {
  zero_grads_keep_copies(s);
  params_.refresh_compute(s);  // the optimizer (or a checkpoint) changed the masters since
}

void StageBase::zero_grads_keep_copies(Stream& s) {
  s.zero(params_.flat_grads().raw(), params_.flat_grads().bytes());
  CallScope cs(alloc_, s);
  for (auto& per_mb : records_) {
    for (auto& [mb, rec] : per_mb)
      for (const ActivationRecord& r : rec.list()) cs.release(r.tensor);
    per_mb.clear();
  }
  std::vector<int> ids;
  for (auto& [mb, m] : mbs_) ids.push_back(mb);
  for (int mb : ids) release_microbatch(mb, s);
}

void StageBase::release_microbatch(int mb, Stream& s) {
  for (const auto& per_mb : records_)
    STP_ASSERT(per_mb.count(mb) == 0, "release_microbatch(", mb, ") while it still holds activation records");
  auto it = mbs_.find(mb);
  if (it == mbs_.end()) return;
  CallScope cs(alloc_, s);
  Microbatch& m = it->second;
  for (Tensor* t : {&m.tokens, &m.targets, &m.input, &m.output, &m.grad_output, &m.grad_input, &m.loss, &m.fwd_x,
                    &m.bwd_dy, &m.bwd_pending})
    cs.release(std::move(*t));
  mbs_.erase(it);
}

}  // namespace stp
