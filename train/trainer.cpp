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
#include "optim/staged_comm.h"
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
  std::vector<Stream*> streams = {compute.get(), tp_comm.get()};
  for (auto& s : p2p) streams.push_back(s.get());
  if (offload) {
    streams.push_back(&offload->d2h());
    streams.push_back(&offload->h2d());
  }
  if (streamer) streams.push_back(&streamer->copy_stream());
  if (optimizer)
    for (Stream* s : optimizer->streams(leave_uploads)) streams.push_back(s);
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

// ---- Trainer -----------------------------------------------------------------------------------

Trainer::Trainer(const Config& config, TrainerOptions options) : impl_(std::make_unique<Impl>(config, options)) {}

const MemoryPlan& Trainer::memory_plan() const { return impl_->plan; }

std::vector<Trainer::DeviceMemory> Trainer::device_memory() const {
  std::vector<DeviceMemory> out;
  for (auto& r : impl_->ranks) {
    DeviceMemory d;
    d.device = r->alloc->stats();
    d.allocations = r->alloc->allocation_trace();
    d.communicator_bytes = r->communicator_bytes;
    if (r->pool) d.pinned = r->pool->stats();
    if (r->offload) {
      OffloadCounters c = r->offload->counters();
      d.d2h_bytes = c.d2h_bytes;
      d.h2d_bytes = c.h2d_bytes;
      d.late_prefetches = c.late_prefetches;
    }
    d.optimizer_host_bytes = r->optimizer->host_state_bytes();
    d.host_master_bytes = r->optimizer->host_master_bytes();
    d.optimizer_shadow_bytes = r->optimizer->host_shadow_bytes();
    for (const auto& st : r->stages) {
      const StreamedBytes b = st->streamed_bytes();
      d.streamed_weight_bytes += b.weights;
      d.streamed_grad_bytes += b.gradients;
    }
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
const std::string& Trainer::tokenizer_source() const { return impl_->tokenizer_source; }

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

// Test hook (train/fault_hook.h, nan_grad): one NaN in a gradient this rank's norm counts and this
// rank updates (RankOptimizer::owned_gradient).
void Trainer::Impl::poison_gradient(Rank& r) {
  static const float nan = std::numeric_limits<float>::quiet_NaN();
  r.optimizer->order_gradient_writes(*r.compute);  // an early download reads it
  r.compute->copy(r.optimizer->owned_gradient(), &nan, sizeof(float));
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
// A streamed chunk's gradient is in pinned host memory: where the communicator cannot read it
// (stages_host_collectives), the all-reduce goes through device pieces of at most parallel.dp_bucket
// (optim/staged_comm.h; in a dry run too, sending nothing, so the plan counts them).
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
  const bool staged = stages_host_collectives(config) && holder->streamed_bytes().gradients > 0;
  StagedComm staging(r.tied, *r.alloc, r.tied->rank(), r.tied->size());
  const std::size_t piece = config.parallel.dp_bucket.value_or(0) / sizeof(float);
  for (ParamInfo& w : holder->params()) {
    if (!w.tied) continue;
    const auto n = static_cast<std::size_t>(w.grad.numel());
    if (staged) staging.all_reduce_sum(*r.compute, w.grad.f32(), n, piece);
    else r.tied->all_reduce_sum(*r.compute, w.grad.f32(), n);
  }
}

// One step of one rank: its share of the batch through the schedule, then the optimizer's step
// unless the non-finite guard skips it.
void Trainer::Impl::rank_step(Rank& r, std::int64_t step, float lr) {
  if (trace)
    r.compute->trace_begin(trace::step_span(step), trace::cat::kStep);  // the step on this device (stp profile)
  begin_rank_step(r, step, lr);
  r.executor->run_step();
  r.optimizer->finish_gradients([&] { sum_tied_grads(r); });  // the tied sum where the reduction needs it
  if (fault.poisons(r.global, step)) poison_gradient(r);      // test hook: one NaN gradient on this rank
  Health mine = rank_health(r);
  if (mine.updated) apply_update(r, lr);
  if (trace) r.compute->trace_end();
  r.synchronize(/*leave_uploads=*/true);  // the next step waits for each chunk's upload / all-gather at its first op
  if (mine.updated && config.train.grad_clip > 0) mine.clip_coef = download(r.health, *r.compute)[2];
  for (std::size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i].get() == &r) health[i] = mine;
  r.staging.clear();
}

// The loss scale 1 / (microbatches · dp) · (P / C), P the global batch's target positions and C
// its counted targets, makes the sum of the replicas' gradients (the DP all-reduce) the gradient
// of the mean loss over the counted targets of the global batch: a stage's seed per counted
// target is scale / (B · T) = 1 / C (models/stage.h, loss). Without a mask C = P and the factor is
// exactly 1.
void Trainer::Impl::begin_rank_step(Rank& r, std::int64_t step, float lr) {
  const float counted =
      static_cast<float>(static_cast<double>(global_batch_positions()) / static_cast<double>(step_targets));
  const float scale = 1.0f / static_cast<float>(config.train.microbatches * config.parallel.dp) * counted;
  r.optimizer->begin_step(lr);  // zeroes the gradients
  for (auto& s : r.stages)
    if (s->is_last()) s->set_loss_scale(scale);
  r.compute->zero(r.losses.raw(), r.losses.bytes());
  upload_batch(r, step);
  fault.maybe_fail(r.global, step);
}

// The non-finite guard. After the DP reduction every replica holds the same gradients, so the
// grad norm is summed over one replica's ranks (the optimizer adds the dp ranks where each holds a
// disjoint part). That sum, summed again over every rank of the job, is finite only if every
// rank's is, and every rank holds the same losses, so every rank takes the same decision from the
// same numbers.
Trainer::Impl::Health Trainer::Impl::rank_health(Rank& r) {
  r.world->all_reduce_sum(*r.compute, r.losses.f32(), static_cast<std::size_t>(r.losses.numel()));
  float* h = r.health.f32();
  const float* sumsq = r.optimizer->grad_sumsq(*r.replica);
  r.compute->copy(h + 0, sumsq, sizeof(float));
  r.compute->copy(h + 1, sumsq, sizeof(float));
  r.world->all_reduce_sum(*r.compute, h + 1, 1);
  std::vector<float> losses = download(r.losses, *r.compute);  // waits for the reductions
  std::vector<float> sums = download(r.health, *r.compute);
  bool finite = options.dry_run || std::isfinite(sums[1]);  // a dry run computes nothing: it updates
  for (float x : losses) finite = finite && std::isfinite(x);
  Health mine;
  mine.updated = finite;
  mine.grad_norm = std::sqrt(static_cast<double>(sums[0]));
  return mine;
}

// Every replica computes the same norm, clip coefficient and AdamW step.
void Trainer::Impl::apply_update(Rank& r, float lr) {
  if (config.train.grad_clip > 0) {
    r.optimizer->clip(static_cast<float>(config.train.grad_clip));
    r.compute->copy(r.health.f32() + 2, r.optimizer->clip_coef(), sizeof(float));
  }
  r.optimizer->step(lr);
}

// Pass p of the eval set is global batch p of data.val_path read in order: G = dp · m · B sequences
// from p · G on, split over the replicas as a training step splits its batch (replica d's
// microbatch mb: rows p · G + (d · m + mb − 1) · B ..). So the sequences and their order depend
// on the global batch only, not on how dp, pp, tp and the schedule divide it.
void Trainer::Impl::rank_evaluate(Rank& r) {
  const int m = config.train.microbatches, B = config.train.micro_batch_size, dp = config.parallel.dp;
  const std::int64_t G = std::int64_t{dp} * m * B;
  r.optimizer->settle();  // the last step's uploads
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

// The validation loss is the mean over the counted targets of every pass, as a step's loss is
// over its global batch's: each microbatch's loss is its sum over B · T positions / (B · T)
// (models/stage.h, loss), so their mean times P / C is the sum over the C counted targets / C.
double Trainer::evaluate() {
  Impl& m = *impl_;
  STP_CHECK(!m.config.data.val_path.empty(), "evaluate: no held-out data (set data.val_path)");
  const std::uint64_t G = m.global_batch_positions() / static_cast<std::uint64_t>(m.config.model.seq_len);
  std::uint64_t counted = 0;
  for (std::int64_t p = 0; p < m.config.train.eval_batches; ++p)
    counted += m.global_batch_targets(m.val_dataset.get(), static_cast<std::uint64_t>(p) * G,
                                      str("validation batch ", p + 1, " of ", m.config.train.eval_batches),
                                      "data.val_mask_path");
  m.run_on_ranks([&](Rank& r) { m.rank_evaluate(r); });
  if (m.options.dry_run) return 0;
  Rank& r = *m.ranks.front();
  std::vector<float> host = download(r.eval_losses, *r.compute);
  double sum = 0;
  for (float x : host) sum += x;
  const double positions =
      static_cast<double>(m.global_batch_positions()) * static_cast<double>(m.config.train.eval_batches);
  return sum / static_cast<double>(host.size()) * (positions / static_cast<double>(counted));
}

std::int64_t Trainer::last_update_step() const { return impl_->steps_done - impl_->consecutive_skips; }

// Every rank took the same skip decision; the run's skip counters follow it.
void Trainer::Impl::record_health(StepResult& out) {
  const Health& h = health.front();
  STP_ASSERT(std::all_of(health.begin(), health.end(), [&](const Health& x) { return x.updated == h.updated; }),
             "ranks disagree on skipping step ", out.step);
  out.skipped = !h.updated;
  if (out.skipped) {
    ++skipped_steps;
    ++consecutive_skips;
  } else {
    consecutive_skips = 0;
  }
  out.skipped_steps = skipped_steps;
  out.consecutive_skips = consecutive_skips;
  out.grad_norm = h.grad_norm;
  out.clip_coef = h.clip_coef;
}

// Per device: the step's memory peaks, its kernel launches and (when any device offloads) its
// offload traffic.
void Trainer::Impl::record_device_stats(StepResult& out, const std::vector<std::uint64_t>& launches_before) {
  for (auto& r : ranks) {
    ArenaStats a = r->alloc->stats();
    out.peak_device_bytes.push_back(a.peak_allocated);
    out.peak_device_reserved_bytes.push_back(a.peak_reserved);
  }
  for (auto& d : devices) out.peak_host_pinned_bytes += d->pinned_host_stats().peak;
  for (auto& r : ranks) {
    const RankOptimizer::Speculation s = r->optimizer->speculation();
    out.speculation.committed += s.committed;
    out.speculation.discarded += s.discarded;
    out.speculation.hidden_s += s.hidden_s - r->speculation_hidden_before;
    r->speculation_hidden_before = s.hidden_s;
  }
  for (std::size_t i = 0; i < ranks.size(); ++i)
    out.launches.push_back(ranks[i]->device->launch_count() - launches_before[i]);
  for (auto& r : ranks) {
    const std::uint64_t now = r->device->late_gemm_choices();
    out.late_gemm_choices.push_back(now - r->late_gemm_choices_before);
    r->late_gemm_choices_before = now;
  }
  // Per device this step's offload (empty when no device offloads): the step synchronized the copy
  // streams, so the counters' times are complete.
  if (std::any_of(ranks.begin(), ranks.end(), [](auto& r) { return r->offload != nullptr; })) {
    for (auto& r : ranks) {
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
  record_param_stream(out);
}

// Per device this step's parameter streaming (empty when no device streams).
void Trainer::Impl::record_param_stream(StepResult& out) {
  if (std::none_of(ranks.begin(), ranks.end(), [](auto& r) { return r->streamer != nullptr; })) return;
  for (auto& r : ranks) {
    ParamStreamCounters o;
    if (r->streamer) {
      const ParamStreamCounters now = r->streamer->counters();
      ParamStreamCounters& was = r->param_stream_before;
      o = {now.h2d_bytes - was.h2d_bytes, now.d2h_bytes - was.d2h_bytes, now.h2d_copies - was.h2d_copies,
           now.d2h_copies - was.d2h_copies, now.zeroed_bytes - was.zeroed_bytes};
      was = now;
    }
    out.param_stream.push_back(o);
  }
}

StepResult Trainer::step() {
  Impl& m = *impl_;
  for (auto& r : m.ranks) r->alloc->begin_step();  // a planned placement's step starts here
  std::int64_t step = m.steps_done + 1;
  float lr = static_cast<float>(m.lr_schedule.at(step));
  const int mb = m.config.train.microbatches, B = m.config.train.micro_batch_size;
  m.step_targets = m.global_batch_targets(m.dataset.get(), sequence_index(step, 0, 0, m.config.parallel.dp, mb, B),
                                          str("step ", step), "data.mask_path");
  std::vector<std::uint64_t> launches_before;
  for (auto& r : m.ranks) launches_before.push_back(r->device->launch_count());
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
  out.counted_targets = m.step_targets;
  const std::int64_t tokens = std::int64_t{m.config.train.microbatches} * m.config.train.micro_batch_size *
                              m.config.model.seq_len * m.config.parallel.dp;
  out.tokens_per_s = static_cast<double>(tokens) / (ms / 1e3);
  m.record_health(out);
  out.tokens_seen = step * tokens;  // every step has the same global batch
  m.record_device_stats(out, launches_before);
  return out;
}

// The loss of a step: the mean over every replica's microbatches, in replica then microbatch order
// (the same sum as one replica running all of them), times P / C: the mean over the counted
// targets (begin_rank_step). Every rank holds every loss after the step.
double Trainer::Impl::read_step_loss() {
  Rank& r = *ranks.front();
  std::vector<float> host = download(r.losses, *r.compute);
  double sum = 0;
  for (float x : host) sum += x;
  return sum / static_cast<double>(host.size()) *
         (static_cast<double>(global_batch_positions()) / static_cast<double>(step_targets));
}

std::uint64_t Trainer::Impl::global_batch_positions() const {
  return static_cast<std::uint64_t>(config.parallel.dp) * static_cast<std::uint64_t>(config.train.microbatches) *
         static_cast<std::uint64_t>(config.train.micro_batch_size) * static_cast<std::uint64_t>(config.model.seq_len);
}

// Every process counts from the data itself, without a collective: each holds the same data and
// mask and computes the same count, before the step starts (the backward seeds need it) and at the
// cost of reading G · T mask bytes, nothing next to the step.
std::uint64_t Trainer::Impl::global_batch_targets(const TokenDataset* data, std::uint64_t b0, const std::string& what,
                                                  const char* mask_key) const {
  const std::uint64_t T = static_cast<std::uint64_t>(config.model.seq_len);
  if (!data) return global_batch_positions();  // a dry run reads no data
  const std::uint64_t n = data->counted_targets(b0, global_batch_positions() / T);
  const bool train = std::string(mask_key) == "data.mask_path";
  STP_CHECK(n > 0, what, ": the loss mask ", mask_key, " '", train ? config.data.mask_path : config.data.val_mask_path,
            "' leaves out every one of the global batch's ", global_batch_positions(), " targets (sequences ", b0,
            " to ", b0 + global_batch_positions() / T - 1,
            "), so its mean loss is undefined; mask fewer tokens, or make the global batch larger "
            "(train.micro_batch_size, train.microbatches)");
  return n;
}

}  // namespace stp
