// Full tensors <-> per-rank shards: gathering the model and optimizer state for checkpoints (from
// replica 0, across processes when the job has several), and loading them back (model.init_from,
// train.resume) into any dp × tp × pp layout.
#include <set>

#include "base/error.h"
#include "config/hf_config.h"
#include "formats/checkpoint.h"
#include "formats/hf_folder.h"
#include "formats/tensor_values.h"
#include "train/hf_convert.h"
#include "models/registry.h"
#include "train/stage_layout.h"
#include "train/trainer_impl.h"

namespace stp {

namespace {

void place(const ParamInfo& p, const std::vector<float>& shard, std::map<std::string, HostTensor>& out) {
  HostTensor& full = out[p.name];
  if (full.data.empty()) {
    full.shape = p.full_shape;
    full.data.assign(static_cast<std::size_t>(numel(p.full_shape)), 0.0f);
  }
  // Tied / replicated copies hold identical values: writing them again is harmless.
  p.layout.gather(shard.data(), full.data.data());
}

// The first tensor of a state about to be written that is not good, named as in its file, and how
// many are; "" when every value is good (formats/tensor_values.h).
std::string state_problem(const std::map<std::string, HostTensor>& model,
                          const std::map<std::string, HostTensor>& exp_avg,
                          const std::map<std::string, HostTensor>& exp_avg_sq) {
  std::string first;
  int bad = 0;
  auto scan = [&](const std::map<std::string, HostTensor>& tensors, const char* file, const char* suffix,
                  ValueRule rule) {
    for (const auto& [name, t] : tensors) {
      const std::string problem = value_problem(t.data, rule);
      if (!problem.empty() && bad++ == 0) first = str(file, ": tensor '", name, suffix, "' ", problem);
    }
  };
  scan(model, "model.safetensors", "", ValueRule::Finite);
  scan(exp_avg, "optimizer.safetensors", ".exp_avg", ValueRule::Finite);
  scan(exp_avg_sq, "optimizer.safetensors", ".exp_avg_sq", ValueRule::FiniteNonNegative);
  if (bad > 1) first += str(", and ", bad - 1, " more tensor", bad == 2 ? "" : "s", " of the state hold such values");
  return first;
}

}  // namespace

// For every parameter name, the full tensor from the shards of one replica (every replica holds
// the same values; checkpoints read replica 0). `pick(r, i)` gives the device tensor of r.params()[i] to read (the
// parameter, or an optimizer moment). Across processes, replica 0's ranks send their shards in parameter order over the
// replica communicator to global rank 0, which knows every rank's parameter table.
std::map<std::string, HostTensor> Trainer::Impl::gather(const std::function<Tensor(Rank&, std::size_t)>& pick,
                                                        int replica) {
  STP_CHECK(replica >= 0 && replica < layout.dp && (replica == 0 || !multi_process()), "replica ", replica,
            " cannot be gathered here (dp = ", layout.dp, multi_process() ? ", only replica 0 across processes)" : ")");
  std::map<std::string, HostTensor> out;
  for (auto& r : ranks) r->optimizer->settle();  // the last step's uploads
  for (auto& r : ranks) {
    if (r->dp_rank != replica) continue;
    if (multi_process() && r->global != 0) {  // a sender
      for (std::size_t i = 0; i < r->params().size(); ++i) {
        Tensor t = pick(*r, i);
        r->replica->send(*r->compute, t.raw(), t.bytes(), 0, static_cast<std::uint32_t>(i));
      }
      r->synchronize();
      continue;
    }
    for (std::size_t i = 0; i < r->params().size(); ++i) place(r->params()[i], download(pick(*r, i), *r->compute), out);
  }
  if (!multi_process() || ranks.front()->global != 0) return out;
  Rank& r = *ranks.front();
  const ModelSpec model = model_spec_of(config);
  for (int src = 1; src < layout.replica_size(); ++src) {
    std::uint32_t i = 0;
    for (int c = 0; c < schedule.chunks; ++c) {
      for (const ParamInfo& p :
           model_param_table(model, stage_spec_of(config, schedule, layout.pp_rank(src), c, layout.tp_rank(src)))) {
        Tensor shard = Tensor::empty(*r.alloc, {p.layout.shard_rows * p.layout.shard_cols});
        r.replica->recv(*r.compute, shard.raw(), shard.bytes(), src, i++);
        place(p, download(shard, *r.compute), out);
      }
    }
  }
  return out;
}

// Every rank's optimizer assembles what a checkpoint gathers as full per-rank shards (a collective
// where the state is sharded: the distributed optimizer all-gathers into the gradient buffers),
// then replica `replica`'s are gathered.
std::map<std::string, HostTensor> Trainer::Impl::gather_views(
    const std::function<std::vector<Tensor>(RankOptimizer&)>& views, int replica) {
  run_on_ranks([&](Rank& r) {
    r.optimizer->settle();
    r.checkpoint_views = views(*r.optimizer);
    r.synchronize();
  });
  auto out = gather([](Rank& r, std::size_t i) { return r.checkpoint_views.at(i); }, replica);
  for (auto& r : ranks) r->checkpoint_views.clear();
  return out;
}

std::map<std::string, HostTensor> Trainer::full_parameters(int replica) {
  return impl_->gather_views([](RankOptimizer& o) { return o.full_parameters(); }, replica);
}

// The state is checked where it is called good, on the tensors about to be written: nothing is
// kept to undo a step, no step pays for a check, and what is checked is exactly what a resume or
// `stp generate` would read (docs/memory.md, What is called good).
CheckpointSave Trainer::try_save_checkpoint(const std::string& note) {
  Impl& m = *impl_;
  auto model = full_parameters();
  // Each moment in turn: the gradient buffers, dead between steps, hold one moment at a time.
  auto moment = [&m](int w) { return m.gather_views([w](RankOptimizer& o) { return o.full_moments(w); }); };
  auto exp_avg = moment(0);
  auto exp_avg_sq = moment(1);
  const bool writer = !m.multi_process() || m.options.processes->rank() == 0;  // process 0 holds the tensors
  CheckpointSave out;
  if (writer) {
    // HF names and layouts (a permutation of the values: resume converts back bit for bit).
    const auto rules = hf_tensor_rules(model_spec_of(m.config));
    model = to_hf(rules, model);
    exp_avg = to_hf(rules, exp_avg);
    exp_avg_sq = to_hf(rules, exp_avg_sq);
    if (std::string problem = state_problem(model, exp_avg, exp_avg_sq); !problem.empty())
      out.problem = str("the state after step ", last_update_step(), " is not finite: ", problem,
                        "; it was not written. ", m.last_good_state());
  }
  const bool bad = m.multi_process() ? m.options.processes->any(!out.problem.empty()) : !out.problem.empty();
  if (bad) return out;
  out.written = true;
  m.last_good_step = m.steps_done;
  m.last_good_resumed = false;
  if (!writer) return out;
  CheckpointData data;
  data.hf_config = hf_config_json(m.config);
  for (const TokenizerFile& f : m.tokenizer_files) data.files.emplace_back(f.name, f.bytes);
  for (auto& [name, t] : model) {
    data.model.emplace_back(name, &t);
    data.optimizer.emplace_back(name, OptimizerMoments{&exp_avg.at(name), &exp_avg_sq.at(name)});
  }
  Rank& first = *m.ranks.front();
  data.optimizer_step = first.optimizer->step_count();
  data.state.step = m.steps_done;
  data.state.data_position = sequence_index(m.steps_done + 1, 0, 0, m.config.parallel.dp, m.config.train.microbatches,
                                            m.config.train.micro_batch_size);
  if (m.config.data.sampling == "shuffle" && m.dataset) {
    const std::uint64_t windows = m.dataset->windows();
    data.state.shuffle = ShufflePosition{m.dataset->num_tokens(), std::uint64_t(m.config.model.seq_len), windows,
                                         data.state.data_position / windows, data.state.data_position % windows};
  }
  data.state.rng_seed = m.config.train.seed;
  data.state.config_fingerprint = config_fingerprint(m.config);
  data.state.note = note;
  out.path = write_checkpoint(m.config.output.dir, data);
  m.last_good_path = out.path;
  return out;
}

std::string Trainer::save_checkpoint(const std::string& note) {
  CheckpointSave s = try_save_checkpoint(note);
  if (!s.written)
    throw Error(s.problem.empty() ? str("the state after step ", last_update_step(),
                                        " is not finite (process 0 names the tensor); it was not written")
                                  : s.problem);
  return s.path;
}

std::string Trainer::Impl::last_good_state() const {
  if (!last_good_path.empty())
    return str("The last good state is ", last_good_resumed ? "the train.resume checkpoint " : "checkpoint ",
               last_good_path, " (after step ", last_good_step, ")");
  return str("No checkpoint holds a good state of this run: it started from ",
             config.model.init_from.empty() ? std::string("its seeded initialization")
                                            : str("model.init_from '", config.model.init_from, "'"),
             " and wrote none before (output.checkpoint_every sets how often it writes one)");
}

// model.init_from: a .safetensors file or an HF model folder, in HF or stp names.
void Trainer::Impl::load_init_from(const std::string& source) {
  load_full_tensors(from_hf(hf_tensor_rules(model_spec_of(config)), read_model_source(source), source), source);
}

// Every parameter of every stage must be present with its full shape; extra tensors (e.g. HF's
// attention bias buffers) are ignored.
void Trainer::Impl::load_full_tensors(const std::map<std::string, HostTensor>& full, const std::string& source) {
  run_on_ranks([&](Rank& r) {
    r.optimizer->settle();  // an upload in flight would overwrite what is loaded
    for (auto& s : r.stages) {
      for (ParamInfo& p : s->params()) {
        auto it = full.find(p.name);
        STP_CHECK(it != full.end(), source, ": tensor '", p.name, "' is missing");
        STP_CHECK(it->second.shape == p.full_shape, source, ": tensor '", p.name, "' has shape ",
                  to_string(it->second.shape), ", the model needs ", to_string(p.full_shape));
        s->load_full(p.name, it->second.data, *r.compute);
      }
    }
    r.optimizer->parameters_loaded();  // e.g. the sharded masters' loads wait in the gradients
  });
}

void Trainer::Impl::load_optimizer_state(const std::map<std::string, HostTensor>& exp_avg,
                                         const std::map<std::string, HostTensor>& exp_avg_sq, std::int64_t step) {
  run_on_ranks([&](Rank& r) {
    r.optimizer->settle();
    int w = 0;
    for (auto* moments : {&exp_avg, &exp_avg_sq}) {
      std::vector<std::vector<float>> shards;  // this rank's shard of every parameter's moment
      for (const ParamInfo& p : r.params()) {
        shards.emplace_back(static_cast<std::size_t>(p.grad.numel()));
        p.layout.scatter(moments->at(p.name).data.data(), shards.back().data());
      }
      r.optimizer->load_moments(w++, shards);
    }
    r.optimizer->set_step_count(step);
  });
}

// A shuffled order continues mid-epoch only if the resumed run reads the same windows in the same
// places: the same data (so the same W), the same seed (so the same order) and the same global
// batch (so the same next sequence after the checkpoint's step). The order itself is recomputed from b
// (data/window_shuffle.h); what the checkpoint recorded is checked against it, so a changed dataset is an error, not
// another order.
void Trainer::Impl::check_shuffle_position(const std::string& dir, const CheckpointState& state) const {
  const TrainConfig& t = config.train;
  const std::uint64_t next =
      sequence_index(state.step + 1, 0, 0, config.parallel.dp, t.microbatches, t.micro_batch_size);
  STP_CHECK(state.data_position == next, "train.resume '", dir, "': the checkpoint's next sequence is ",
            state.data_position, " (data_position), but step ", state.step + 1, " of this config starts at sequence ",
            next, " (global batch parallel.dp ", config.parallel.dp, " x train.microbatches ", t.microbatches,
            " x train.micro_batch_size ", t.micro_batch_size,
            "): data.sampling shuffle continues its epoch only with the global batch the checkpoint was trained with");
  if (!state.shuffle || !dataset) return;  // written under another data.sampling: the shuffle starts at b
  const ShufflePosition& s = *state.shuffle;
  const std::uint64_t windows = dataset->windows();
  STP_CHECK(s.windows >= 1 && s.epoch * s.windows + s.index == state.data_position && s.index < s.windows,
            "train.resume '", dir, "': state.json's shuffle position (epoch ", s.epoch, ", index ", s.index, " of ",
            s.windows, " windows) does not give its data_position ", state.data_position,
            "; the file was edited or damaged");
  STP_CHECK(
      s.tokens == dataset->num_tokens() && s.seq_len == std::uint64_t(config.model.seq_len) && s.windows == windows,
      "train.resume '", dir, "': the checkpoint stopped at window ", s.index, " of epoch ", s.epoch,
      " of a shuffle of ", s.windows, " windows (", s.tokens, " tokens, model.seq_len ", s.seq_len,
      "), but data.path '", config.data.path, "' now holds ", dataset->num_tokens(), " tokens, ", windows,
      " windows of model.seq_len ", config.model.seq_len,
      ": the data changed, so the epoch cannot be continued; resume with the data the checkpoint was "
      "trained on, or start a fresh run (model.init_from the checkpoint) on the new data");
  STP_CHECK(state.rng_seed == config.train.seed, "train.resume '", dir,
            "': the checkpoint's shuffle is seeded by train.seed ", state.rng_seed, " but this run's train.seed is ",
            config.train.seed,
            ": another seed orders the epoch otherwise, reading some windows again and others never; resume with "
            "train.seed ",
            state.rng_seed);
}

void Trainer::Impl::resume(const std::string& dir) {
  Checkpoint ck = read_checkpoint(dir);
  std::string want = config_fingerprint(config);
  STP_CHECK(ck.state.config_fingerprint.empty() || ck.state.config_fingerprint == want, "train.resume '", dir,
            "': the checkpoint was written for a different model shape (fingerprint ", ck.state.config_fingerprint,
            ", this config ", want, ")");
  if (config.data.sampling == "shuffle") check_shuffle_position(dir, ck.state);
  const auto rules = hf_tensor_rules(model_spec_of(config));
  load_full_tensors(from_hf(rules, ck.model, dir + "/model.safetensors"), dir + "/model.safetensors");
  load_optimizer_state(
      from_hf(rules, ck.exp_avg, dir + "/optimizer.safetensors (exp_avg)"),
      from_hf(rules, ck.exp_avg_sq, dir + "/optimizer.safetensors (exp_avg_sq)", ValueRule::FiniteNonNegative),
      ck.optimizer_step);
  steps_done = ck.state.step;
  last_good_path = dir;
  last_good_step = ck.state.step;
  last_good_resumed = true;
}

}  // namespace stp
