// Loading a state into the ranks (model.init_from, train.resume), into any dp × tp × pp layout,
// one full tensor at a time: each stp tensor is read (its Hugging Face tensors one by one,
// formats/tensor_source.h), checked, and handed to every local rank that holds a shard of it
// before the next is read, so the process holds one full tensor with one HF tensor or one shard
// (train/host_needs.h, HostPageable).
#include "base/error.h"
#include "formats/checkpoint.h"
#include "formats/hf_folder.h"
#include "formats/tensor_values.h"
#include "models/hf_names.h"
#include "train/hf_convert.h"
#include "train/stage_layout.h"
#include "train/trainer_impl.h"

namespace stp {

// Every parameter of every stage must be one of the model's tensors with its full shape; the
// source's other tensors (e.g. HF's attention bias buffers) are ignored.
void Trainer::Impl::check_loadable(const std::vector<HfTensorRule>& rules, const std::string& source) {
  std::map<std::string, const Shape*> shapes;
  for (const HfTensorRule& r : rules) shapes.emplace(r.name, &r.shape);
  for (auto& r : ranks)
    for (auto& s : r->stages)
      for (const ParamInfo& p : s->params()) {
        auto it = shapes.find(p.name);
        STP_CHECK(it != shapes.end(), source, ": tensor '", p.name, "' is missing");
        STP_CHECK(*it->second == p.full_shape, source, ": tensor '", p.name, "' has shape ", to_string(*it->second),
                  ", the model needs ", to_string(p.full_shape));
      }
}

void Trainer::Impl::load_each(const TensorSource& tensors, const std::string& source, ValueRule rule,
                              const std::function<void(const std::string&, const std::vector<float>&)>& each) {
  const auto rules = hf_tensor_rules(model_spec_of(config));
  check_loadable(rules, source);
  const bool stp_names = stp_named(rules, tensors);
  for (const HfTensorRule& r : rules) {
    const HostTensor full = from_hf_tensor(r, tensors, stp_names, source, rule, load_meter);
    each(r.name, full.data);
    load_meter.release(full.data.size() * sizeof(float));
  }
}

// The stages' parameters, one tensor at a time on this thread (each rank's streams order its own
// copies); ParamStore::load_full holds one shard of it beside the full tensor.
void Trainer::Impl::load_parameters(const TensorSource& tensors, const std::string& source) {
  run_on_ranks([](Rank& r) { r.optimizer->settle(); });  // an upload in flight would overwrite what is loaded
  struct Home {
    Rank* rank;
    Stage* stage;
    std::size_t shard_bytes;
  };
  std::map<std::string, std::vector<Home>> homes;  // a tied table: two stages
  for (auto& r : ranks)
    for (auto& s : r->stages)
      for (const ParamInfo& p : s->params())
        homes[p.name].push_back({r.get(), s.get(), static_cast<std::size_t>(p.grad.numel()) * sizeof(float)});
  load_each(tensors, source, ValueRule::Finite, [&](const std::string& name, const std::vector<float>& full) {
    for (auto [r, s, shard] : homes[name]) {
      load_meter.hold(shard);
      s->load_full(name, full, *r->compute);
      load_meter.release(shard);
    }
  });
  run_on_ranks([](Rank& r) { r.optimizer->parameters_loaded(); });  // e.g. the sharded masters' loads
}

// Each AdamW moment in turn, one tensor at a time: every local rank takes its shard of it.
void Trainer::Impl::load_moments(const CheckpointReader& ck, const std::string& dir) {
  run_on_ranks([](Rank& r) { r.optimizer->settle(); });
  std::map<std::string, std::vector<std::pair<Rank*, std::size_t>>> homes;  // params() indices
  for (auto& r : ranks)
    for (std::size_t i = 0; i < r->params().size(); ++i) homes[r->params()[i].name].emplace_back(r.get(), i);
  for (int which : {0, 1}) {
    const CheckpointTensor t = which == 0 ? CheckpointTensor::ExpAvg : CheckpointTensor::ExpAvgSq;
    const std::string source =
        dir + (which == 0 ? "/optimizer.safetensors (exp_avg)" : "/optimizer.safetensors (exp_avg_sq)");
    load_each(ck.tensors(t), source, which == 0 ? ValueRule::Finite : ValueRule::FiniteNonNegative,
              [&](const std::string& name, const std::vector<float>& full) {
                for (auto [r, i] : homes[name]) {
                  const ParamInfo& p = r->params()[i];
                  std::vector<float> shard(static_cast<std::size_t>(p.grad.numel()));
                  load_meter.hold(shard.size() * sizeof(float));
                  p.layout.scatter(full.data(), shard.data());
                  r->optimizer->load_moment(which, i, shard);
                  load_meter.release(shard.size() * sizeof(float));
                }
              });
  }
  run_on_ranks([&](Rank& r) { r.optimizer->set_step_count(ck.optimizer_step()); });
}

// model.init_from: a .safetensors file or an HF model folder, in HF or stp names.
void Trainer::Impl::load_init_from(const std::string& source) { load_parameters(ModelSource(source), source); }

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
  const CheckpointReader ck(dir);
  std::string want = config_fingerprint(config);
  STP_CHECK(ck.state().config_fingerprint.empty() || ck.state().config_fingerprint == want, "train.resume '", dir,
            "': the checkpoint was written for a different model shape (fingerprint ", ck.state().config_fingerprint,
            ", this config ", want, ")");
  if (config.data.sampling == "shuffle") check_shuffle_position(dir, ck.state());
  load_parameters(ck.tensors(CheckpointTensor::Model), dir + "/model.safetensors");
  load_moments(ck, dir);
  steps_done = ck.state().step;
  last_good_path = dir;
  last_good_step = ck.state().step;
  last_good_resumed = true;
}

std::size_t Trainer::load_pageable_peak_bytes() const { return impl_->load_meter.peak; }

}  // namespace stp
