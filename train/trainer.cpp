#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <exception>
#include <thread>

#include "core/backend.h"
#include "base/error.h"
#include "base/trace_names.h"
#include "memory/numa.h"
#include "core/kernels/nn_kernels.h"
#include "data/data.h"
#include "optim/lr_schedule.h"
#include "train/rank.h"
#include "train/trainer_impl.h"

namespace stp {

// ---- Rank ------------------------------------------------------------------------------------

Rank::~Rank() {
  try {
    synchronize();
  } catch (...) {  // the step that failed already reported its error
  }
}

bool Rank::holds_first() const { return first_stage() != nullptr; }
bool Rank::holds_last() const { return last_stage() != nullptr; }

Stage* Rank::first_stage() const {
  for (auto& s : stages)
    if (s->is_first()) return s.get();
  return nullptr;
}

Stage* Rank::last_stage() const {
  for (auto& s : stages)
    if (s->is_last()) return s.get();
  return nullptr;
}

void Rank::synchronize(bool leave_uploads) {
  // All of them, even when one fails, so no stream work outlives the step; first error wins.
  std::exception_ptr first;
  leave_uploads = leave_uploads && (host_update || sharded);
  std::vector<Stream*> streams = {compute.get(), tp_comm.get()};
  if (!(leave_uploads && sharded)) streams.push_back(dp_comm.get());  // sharded: the all-gathers
  for (auto& s : p2p) streams.push_back(s.get());
  if (offload) {
    streams.push_back(&offload->d2h());
    streams.push_back(&offload->h2d());
  }
  if (host_update) {
    streams.push_back(&host_update->d2h());
    if (!leave_uploads) {
      streams.push_back(&host_update->cpu());
      streams.push_back(&host_update->h2d());
    }
  }
  for (Stream* s : streams) {
    if (!s) continue;  // a rank whose construction failed before its streams existed
    try {
      s->synchronize();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void Rank::params_needed(int chunk) {
  // A host master's bf16 copy came with the chunk's upload (optim/host_update.h); without one (the
  // first step, a skipped step, after a load or settle) it is rounded from the host master here.
  bool uploaded = false;
  if (sharded) {
    sharded->params_needed(chunk);
  } else if (host_update) {
    uploaded = host_update->pending(static_cast<std::size_t>(chunk));
    host_update->params_needed(static_cast<std::size_t>(chunk));
  }
  stages[static_cast<std::size_t>(chunk)]->refresh_compute(*compute, !uploaded);  // zero_grads left the copies
}

void Rank::settle_parameters() {
  if (sharded) sharded->settle();
  else if (host_update) host_update->settle();
}

// ---- Trainer -----------------------------------------------------------------------------------

Trainer::Trainer(const Config& config, TrainerOptions options) : impl_(std::make_unique<Impl>(config, options)) {}

const MemoryPlan& Trainer::memory_plan() const { return impl_->plan; }

std::vector<Trainer::DeviceMemory> Trainer::device_memory() const {
  std::vector<DeviceMemory> out;
  for (auto& r : impl_->ranks) {
    DeviceMemory d;
    d.device = r->alloc->stats();
    d.communicator_bytes = r->communicator_bytes;
    if (r->pool) d.pinned = r->pool->stats();
    if (r->offload) {
      OffloadCounters c = r->offload->counters();
      d.d2h_bytes = c.d2h_bytes;
      d.h2d_bytes = c.h2d_bytes;
      d.late_prefetches = c.late_prefetches;
    }
    if (r->host_update) d.optimizer_host_bytes = r->host_update->host_bytes();
    if (r->sharded) d.host_master_bytes = r->sharded->master_bytes(/*on_host=*/true);
    for (const ParamInfo& p : r->params)
      if (p.host_master) d.host_master_bytes += p.param.bytes();
    out.push_back(d);
  }
  return out;
}
Trainer::~Trainer() = default;

std::int64_t Trainer::steps_done() const { return impl_->steps_done; }
int Trainer::world_size() const { return impl_->layout.size(); }
const std::vector<std::string>& Trainer::warnings() const { return impl_->warnings; }

std::vector<CommBytes> Trainer::comm_bytes() const {
  auto sent = [](const Communicator* c) { return c ? c->bytes_sent() : 0; };
  std::vector<CommBytes> out;
  for (auto& r : impl_->ranks) {
    std::uint64_t pp = 0;
    for (const auto& [channel, comm] : r->pp_channels) pp += sent(comm);
    out.push_back(CommBytes{r->global, sent(r->tp) + sent(r->vocab), pp, sent(r->dp),
                            sent(r->tied) + sent(r->replica) + sent(r->world)});
  }
  return out;
}
const TraceRecorder* Trainer::trace() const { return impl_->trace.get(); }

void Trainer::Impl::run_on_ranks(const std::function<void(Rank&)>& fn) {
  std::vector<std::exception_ptr> errors(ranks.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        // Near its GPU (the GPU's NUMA node): the host thread that launches kernels and copies for this rank runs
        // on the GPU's socket. A fresh thread every step, so bound every step (one system call).
        if (ranks[i]->host_node >= 0) bind_current_thread_near(ranks[i]->host_node);
        fn(*ranks[i]);
      } catch (const std::exception& e) {
        errors[i] = std::current_exception();
        std::string why = str("rank ", ranks[i]->global, " failed: ", e.what());
        for (auto& c : comms) c->abort(why);
        if (multi_process()) options.processes->abort(why);  // every process of the job
      }
    });
  }
  for (auto& t : threads) t.join();
  // Prefer the error that caused the abort over the CommunicatorAborted echoes of it.
  std::exception_ptr echo;
  for (auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const CommunicatorAborted&) {
      if (!echo) echo = e;
    } catch (...) {
      std::rethrow_exception(e);
    }
  }
  if (echo) std::rethrow_exception(echo);
}

// Uploads microbatches 1..m: tokens to the ranks with the first stage, targets to those with the
// last stage. Training reads this step's share of the global batch (docs/design.md, Sampling:
// replica d reads its own share; every TP rank of a replica reads the same rows).
void Trainer::Impl::upload_rows(Rank& r, const TokenDataset* data, const std::function<std::uint64_t(int mb)>& b0) {
  const int m = config.train.microbatches, B = config.train.micro_batch_size, T = config.model.seq_len;
  r.staging.clear();
  for (int mb = 1; mb <= m; ++mb) {
    std::vector<std::int32_t> in(static_cast<std::size_t>(B) * T), tgt(in.size());
    if (data) data->fill_batch(b0(mb), B, in.data(), tgt.data());  // a dry run reads no data
    if (Stage* s = r.first_stage()) r.compute->copy(s->tokens(mb).raw(), in.data(), in.size() * 4);
    if (Stage* s = r.last_stage()) {
      r.compute->copy(s->targets(mb).raw(), tgt.data(), tgt.size() * 4);
      s->loss(mb);  // the loss slot too: the step's small buffers sit together, not between activations
    }
    r.staging.push_back(std::move(in));
    r.staging.push_back(std::move(tgt));
  }
}

void Trainer::Impl::upload_batch(Rank& r, std::int64_t step) {
  const int m = config.train.microbatches, B = config.train.micro_batch_size;
  upload_rows(r, dataset.get(),
              [&](int mb) { return sequence_index(step, r.dp_rank, mb - 1, config.parallel.dp, m, B); });
}

// Test hook (train/fault_hook.h, nan_grad): one NaN in a gradient this rank's norm counts: a
// parameter it owns (not a TP-replicated copy of another rank's, not the tied second copy); with
// the distributed optimizer, in the part of it this dp rank owns.
void Trainer::Impl::poison_gradient(Rank& r) {
  static const float nan = std::numeric_limits<float>::quiet_NaN();
  auto counted = [&](const ParamInfo& p) { return (!p.replicated || r.tp_rank == 0) && !p.tied; };
  if (r.sharded) {
    for (const ShardedOptimizer::Segment& seg : r.sharded->segments()) {
      const ParamInfo& p = r.params[seg.param];
      if (!counted(p)) continue;
      r.compute->copy(p.grad.f32() + seg.offset, &nan, sizeof(float));
      return;
    }
    STP_UNREACHABLE("rank ", r.global, " owns no gradient to poison");
  }
  auto own = std::find_if(r.params.begin(), r.params.end(), counted);
  STP_ASSERT(own != r.params.end(), "rank ", r.global, " holds no gradient of its own to poison");
  r.compute->copy(own->grad.raw(), &nan, sizeof(float));
}

// The tied parameter named `name` of a stage (ParamInfo::tied: it lives in the first and the last
// stage).
static ParamInfo& tied_copy(Stage& s, const std::string& name) {
  for (ParamInfo& p : s.params())
    if (p.tied && p.name == name) return p;
  STP_UNREACHABLE("tied parameter ", name, " missing from the last stage");
}

// Tied embedding (gpt2's wte, a tied llama's embed_tokens): it lives in the first and the last stage. Their grads are
// summed so both copies take the same update (on one rank: a local add; across ranks: the tied group's all-reduce).
void Trainer::Impl::sum_tied_grads(Rank& r) {
  Stage* first = r.first_stage();
  Stage* last = r.last_stage();
  if (first && last && first != last) {
    for (ParamInfo& a : first->params()) {
      if (!a.tied) continue;
      ParamInfo& b = tied_copy(*last, a.name);
      add(*r.compute, a.grad.f32(), a.grad.f32(), b.grad.f32(), a.grad.numel());
      r.compute->copy(b.grad.raw(), a.grad.raw(), a.grad.bytes());
    }
    return;
  }
  if (!r.tied) return;
  Stage* holder = first ? first : last;
  for (ParamInfo& w : holder->params())
    if (w.tied) r.tied->all_reduce_sum(*r.compute, w.grad.f32(), static_cast<std::size_t>(w.grad.numel()));
}

// The loss scale 1 / (microbatches · dp) makes the sum of the replicas' gradients (the DP
// all-reduce) the gradient of the mean loss over the global batch. After the DP reduction every
// replica holds the same gradients, so the grad norm is summed over one replica's ranks and
// every replica computes the same norm, clip coefficient and AdamW step.
void Trainer::Impl::rank_step(Rank& r, std::int64_t step, float lr) {
  const float scale = 1.0f / static_cast<float>(config.train.microbatches * config.parallel.dp);
  if (trace)
    r.compute->trace_begin(trace::step_span(step), trace::cat::kStep);  // the step on this device (stp profile)
  for (auto& s : r.stages) {
    // Offloaded or distributed optimizer: the last step's uploads or all-gathers may still be in
    // flight; each chunk's bf16 copies are refreshed once they are waited for
    // (Rank::params_needed, before its first op).
    if (r.host_update || r.sharded) s->zero_grads_keep_copies(*r.compute);
    else s->zero_grads(*r.compute);
    if (s->is_last()) s->set_loss_scale(scale);
  }
  r.compute->zero(r.losses.raw(), r.losses.bytes());
  upload_batch(r, step);
  fault.maybe_fail(r.global, step);
  if (r.sharded) r.sharded->begin_step();
  if (r.dp_grads) r.dp_grads->begin_step();
  if (r.host_update) r.host_update->begin_step();
  r.executor->run_step();
  if (r.dp_grads) r.dp_grads->finish();
  if (r.sharded) r.sharded->finish([&] { sum_tied_grads(r); });  // tied sum before the reduce-scatter
  else sum_tied_grads(r);
  if (fault.poisons(r.global, step)) {                                    // test hook: one NaN gradient on this rank
    if (r.host_update) r.host_update->order_after_downloads(*r.compute);  // an early download reads it
    poison_gradient(r);
  }
  r.world->all_reduce_sum(*r.compute, r.losses.f32(), static_cast<std::size_t>(r.losses.numel()));
  // The non-finite guard. The replica's sum of squares gives the global norm (with the distributed
  // optimizer each dp rank holds a disjoint part of every gradient: summed over dp too); its sum
  // over every rank of the job is finite only if every rank's is, and every rank holds the same
  // losses, so every rank takes the same decision from the same numbers.
  float* h = r.health.f32();
  GradClipper& clipper = r.sharded ? r.sharded->clipper() : *r.clipper;
  clipper.local_sumsq(*r.compute);
  r.replica->all_reduce_sum(*r.compute, clipper.sumsq(), 1);
  if (r.sharded && r.dp) r.dp->all_reduce_sum(*r.compute, clipper.sumsq(), 1);
  r.compute->copy(h + 0, clipper.sumsq(), sizeof(float));
  r.compute->copy(h + 1, clipper.sumsq(), sizeof(float));
  r.world->all_reduce_sum(*r.compute, h + 1, 1);
  std::vector<float> losses = download(r.losses, *r.compute);  // waits for the reductions
  std::vector<float> sums = download(r.health, *r.compute);
  bool finite = options.dry_run || std::isfinite(sums[1]);  // a dry run computes nothing: it updates
  for (float x : losses) finite = finite && std::isfinite(x);
  Health mine;
  mine.updated = finite;
  mine.grad_norm = std::sqrt(static_cast<double>(sums[0]));
  if (finite) {
    if (config.train.grad_clip > 0) {
      // The early downloads still read the unclipped gradients the clip scales in place.
      if (r.host_update) r.host_update->order_after_downloads(*r.compute);
      clipper.clip(*r.compute, static_cast<float>(config.train.grad_clip));
      r.compute->copy(h + 2, clipper.coef(), sizeof(float));
      // Offloaded: chunks downloaded during the backward hold unclipped copies (optim/host_update.h).
      if (r.host_update) r.host_update->set_clip_coefficient(download(r.health, *r.compute)[2]);
    }
    if (r.sharded) r.sharded->step(lr);
    else r.adamw->step(*r.compute, lr);
  }
  if (trace) r.compute->trace_end();
  r.synchronize(/*leave_uploads=*/true);  // the next step waits for each chunk's upload / all-gather at its first op
  if (finite && config.train.grad_clip > 0) mine.clip_coef = download(r.health, *r.compute)[2];
  for (std::size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i].get() == &r) health[i] = mine;
  r.staging.clear();
}

// Pass p of the eval set is global batch p of data.val_path read in order: G = dp · m · B sequences
// from p · G on, split over the replicas as a training step splits its batch (replica d's
// microbatch mb: rows p · G + (d · m + mb − 1) · B ..). So the sequences and their order depend
// on the global batch only, not on how dp, pp, tp and the schedule divide it.
void Trainer::Impl::rank_evaluate(Rank& r) {
  const int m = config.train.microbatches, B = config.train.micro_batch_size, dp = config.parallel.dp;
  const std::int64_t G = std::int64_t{dp} * m * B;
  r.settle_parameters();  // the last step's uploads
  r.compute->zero(r.eval_losses.raw(), r.eval_losses.bytes());
  for (auto& s : r.stages) {
    s->zero_grads(*r.compute);  // drops microbatch state and refreshes bf16 weight copies
    s->set_forward_only(true);
  }
  const bool writes_losses = r.holds_last() && r.tp_rank == 0;
  for (std::int64_t p = 0; p < config.train.eval_batches; ++p) {
    upload_rows(r, val_dataset.get(),
                [&](int mb) { return static_cast<std::uint64_t>(p * G + (std::int64_t{r.dp_rank} * m + mb - 1) * B); });
    if (writes_losses) r.executor->set_loss_output(r.eval_losses.view((p * dp + r.dp_rank) * m, {m}));
    r.executor->run_forward();
    r.synchronize();
  }
  if (writes_losses) r.executor->set_loss_output(r.losses.view(std::int64_t{r.dp_rank} * m, {m}));
  for (auto& s : r.stages) s->set_forward_only(false);
  r.world->all_reduce_sum(*r.compute, r.eval_losses.f32(), static_cast<std::size_t>(r.eval_losses.numel()));
  r.synchronize();
  r.staging.clear();
}

double Trainer::evaluate() {
  Impl& m = *impl_;
  STP_CHECK(!m.config.data.val_path.empty(), "evaluate: no held-out data (set data.val_path)");
  m.run_on_ranks([&](Rank& r) { m.rank_evaluate(r); });
  if (m.options.dry_run) return 0;
  Rank& r = *m.ranks.front();
  std::vector<float> host = download(r.eval_losses, *r.compute);
  double sum = 0;
  for (float x : host) sum += x;
  return sum / static_cast<double>(host.size());
}

std::int64_t Trainer::last_update_step() const { return impl_->steps_done - impl_->consecutive_skips; }

StepResult Trainer::step() {
  Impl& m = *impl_;
  std::int64_t step = m.steps_done + 1;
  float lr = static_cast<float>(m.lr_schedule.at(step));
  auto t0 = std::chrono::steady_clock::now();
  m.health.assign(m.ranks.size(), {});
  m.run_on_ranks([&](Rank& r) { m.rank_step(r, step, lr); });
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  m.steps_done = step;

  StepResult out;
  out.step = step;
  out.lr = lr;
  out.step_ms = ms;
  out.loss = m.read_step_loss();
  const std::int64_t tokens = std::int64_t{m.config.train.microbatches} * m.config.train.micro_batch_size *
                              m.config.model.seq_len * m.config.parallel.dp;
  out.tokens_per_s = static_cast<double>(tokens) / (ms / 1e3);
  const Impl::Health& h = m.health.front();  // every rank took the same decision
  STP_ASSERT(
      std::all_of(m.health.begin(), m.health.end(), [&](const Impl::Health& x) { return x.updated == h.updated; }),
      "ranks disagree on skipping step ", step);
  out.skipped = !h.updated;
  if (out.skipped) {
    ++m.skipped_steps;
    ++m.consecutive_skips;
  } else {
    m.consecutive_skips = 0;
  }
  out.skipped_steps = m.skipped_steps;
  out.consecutive_skips = m.consecutive_skips;
  out.grad_norm = h.grad_norm;
  out.clip_coef = h.clip_coef;
  out.tokens_seen = step * tokens;  // every step has the same global batch
  for (auto& r : m.ranks) {
    ArenaStats a = r->alloc->stats();
    out.peak_device_bytes.push_back(a.peak_allocated);
    out.peak_device_reserved_bytes.push_back(a.peak_reserved);
  }
  for (auto& d : m.devices) out.peak_host_pinned_bytes += d->pinned_host_stats().peak;
  // Per device this step's offload (empty when no device offloads): the step synchronized the copy
  // streams, so the counters' times are complete.
  if (std::any_of(m.ranks.begin(), m.ranks.end(), [](auto& r) { return r->offload != nullptr; })) {
    for (auto& r : m.ranks) {
      StepResult::Offload o;
      if (r->offload) {
        OffloadCounters now = r->offload->counters(), &was = r->offload_before;
        o = {now.d2h_bytes - was.d2h_bytes, now.h2d_bytes - was.h2d_bytes, now.d2h_busy_s - was.d2h_busy_s,
             now.h2d_busy_s - was.h2d_busy_s, now.compute_stall_s - was.compute_stall_s};
        was = now;
      }
      out.offload.push_back(o);
    }
  }
  return out;
}

// The loss of a step: the mean over every replica's microbatches, in replica then microbatch order
// (the same sum as one replica running all of them). Every rank holds every loss after the step.
double Trainer::Impl::read_step_loss() {
  Rank& r = *ranks.front();
  std::vector<float> host = download(r.losses, *r.compute);
  double sum = 0;
  for (float x : host) sum += x;
  return sum / static_cast<double>(host.size());
}

}  // namespace stp
