#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>

#include "core/backend.h"
#include "base/error.h"
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

GPT2Stage* Rank::first_stage() const {
  for (auto& s : stages)
    if (s->is_first()) return s.get();
  return nullptr;
}

GPT2Stage* Rank::last_stage() const {
  for (auto& s : stages)
    if (s->is_last()) return s.get();
  return nullptr;
}

void Rank::synchronize() {
  // All of them, even when one fails, so no stream work outlives the step; first error wins.
  std::exception_ptr first;
  std::vector<Stream*> streams = {compute.get(), tp_comm.get(), p2p.get(), dp_comm.get()};
  if (offload) {
    streams.push_back(&offload->d2h());
    streams.push_back(&offload->h2d());
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

// ---- Trainer -----------------------------------------------------------------------------------

Trainer::Trainer(const Config& config, TrainerOptions options) : impl_(std::make_unique<Impl>(config, options)) {}

const MemoryPlan& Trainer::memory_plan() const { return impl_->plan; }

std::vector<Trainer::DeviceMemory> Trainer::device_memory() const {
  std::vector<DeviceMemory> out;
  for (auto& r : impl_->ranks) {
    DeviceMemory d;
    d.device = r->alloc->stats();
    if (r->pool) d.pinned = r->pool->stats();
    if (r->offload) {
      OffloadCounters c = r->offload->counters();
      d.d2h_bytes = c.d2h_bytes;
      d.h2d_bytes = c.h2d_bytes;
      d.late_prefetches = c.late_prefetches;
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
  for (auto& r : impl_->ranks)
    out.push_back(CommBytes{r->global, sent(r->tp), sent(r->pp_act) + sent(r->pp_grad), sent(r->dp),
                            sent(r->tied) + sent(r->replica) + sent(r->world)});
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

// Uploads this step's inputs: tokens to the ranks with the first stage, targets to those with
// the last stage (docs/design.md, Sampling: replica d reads its own share of the global
// batch; every TP rank of a replica reads the same rows).
void Trainer::Impl::upload_batch(Rank& r, std::int64_t step) {
  const int m = config.train.microbatches, B = config.train.micro_batch_size, T = config.model.seq_len;
  r.staging.clear();
  for (int mb = 1; mb <= m; ++mb) {
    std::uint64_t b0 = sequence_index(step, r.dp_rank, mb - 1, config.parallel.dp, m, B);
    std::vector<std::int32_t> in(static_cast<std::size_t>(B) * T), tgt(in.size());
    if (dataset) dataset->fill_batch(b0, B, in.data(), tgt.data());  // a dry run reads no data
    if (GPT2Stage* s = r.first_stage()) r.compute->copy(s->tokens(mb).raw(), in.data(), in.size() * 4);
    if (GPT2Stage* s = r.last_stage()) r.compute->copy(s->targets(mb).raw(), tgt.data(), tgt.size() * 4);
    r.staging.push_back(std::move(in));
    r.staging.push_back(std::move(tgt));
  }
}

// Tied embedding: wte lives in the first and the last stage. Their grads are summed so both copies
// take the same update (on one rank: a local add; across ranks: the tied group's all-reduce).
void Trainer::Impl::sum_tied_grads(Rank& r) {
  GPT2Stage* first = r.first_stage();
  GPT2Stage* last = r.last_stage();
  if (first && last && first != last) {
    ParamInfo& a = first->param_store().at("wte.weight");
    ParamInfo& b = last->param_store().at("wte.weight");
    add(*r.compute, a.grad.f32(), a.grad.f32(), b.grad.f32(), a.grad.numel());
    r.compute->copy(b.grad.raw(), a.grad.raw(), a.grad.bytes());
    return;
  }
  if (!r.tied) return;
  GPT2Stage* holder = first ? first : last;
  ParamInfo& w = holder->param_store().at("wte.weight");
  r.tied->all_reduce_sum(*r.compute, w.grad.f32(), static_cast<std::size_t>(w.grad.numel()));
}

// The loss scale 1 / (microbatches · dp) makes the sum of the replicas' gradients (the DP
// all-reduce) the gradient of the mean loss over the global batch. After the DP reduction every
// replica holds the same gradients, so the grad norm is summed over one replica's ranks and
// every replica computes the same norm, clip coefficient and AdamW step.
void Trainer::Impl::rank_step(Rank& r, std::int64_t step, float lr) {
  const float scale = 1.0f / static_cast<float>(config.train.microbatches * config.parallel.dp);
  if (trace) r.compute->trace_begin(str("step ", step), "step");  // the step on this device (stp profile)
  for (auto& s : r.stages) {
    s->zero_grads(*r.compute);
    if (s->is_last()) s->set_loss_scale(scale);
  }
  r.compute->zero(r.losses.raw(), r.losses.bytes());
  upload_batch(r, step);
  fault.maybe_fail(r.global, step);
  if (r.sharded) r.sharded->begin_step();
  if (r.dp_grads) r.dp_grads->begin_step();
  r.executor->run_step();
  if (r.dp_grads) r.dp_grads->finish();
  if (r.sharded) r.sharded->finish([&] { sum_tied_grads(r); });  // tied sum before the reduce-scatter
  else sum_tied_grads(r);
  r.world->all_reduce_sum(*r.compute, r.losses.f32(), static_cast<std::size_t>(r.losses.numel()));
  if (config.train.grad_clip > 0) {
    GradClipper& clipper = r.sharded ? r.sharded->clipper() : *r.clipper;
    clipper.local_sumsq(*r.compute);
    r.replica->all_reduce_sum(*r.compute, clipper.sumsq(), 1);
    if (r.sharded && r.dp) r.dp->all_reduce_sum(*r.compute, clipper.sumsq(), 1);  // each replica: its shards
    clipper.clip(*r.compute, static_cast<float>(config.train.grad_clip));
  }
  if (r.sharded) r.sharded->step(lr);
  else r.adamw->step(*r.compute, lr);
  if (trace) r.compute->trace_end();
  r.synchronize();
  r.staging.clear();
}

StepResult Trainer::step() {
  Impl& m = *impl_;
  std::int64_t step = m.steps_done + 1;
  float lr = static_cast<float>(m.lr_schedule.at(step));
  auto t0 = std::chrono::steady_clock::now();
  m.run_on_ranks([&](Rank& r) { m.rank_step(r, step, lr); });
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  m.steps_done = step;

  StepResult out;
  out.step = step;
  out.lr = lr;
  out.step_ms = ms;
  out.loss = m.read_step_loss();
  double tokens = static_cast<double>(m.config.train.microbatches) * m.config.train.micro_batch_size *
                  m.config.model.seq_len * m.config.parallel.dp;
  out.tokens_per_s = tokens / (ms / 1e3);
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
