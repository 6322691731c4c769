// Full tensors <-> per-rank shards: gathering the model and optimizer state for checkpoints, and
// loading them back (model.init_from, train.resume) into any tp × pp layout.
#include <set>

#include "core/error.h"
#include "models/checkpoint.h"
#include "train/trainer_impl.h"

namespace stp {

namespace {

// Gathers, for every parameter name, the full tensor from the shards of all ranks. `pick(r, i)`
// gives the device tensor of r.params[i] to read (the parameter, or an optimizer moment).
std::map<std::string, HostTensor> gather(std::vector<std::unique_ptr<Rank>>& ranks,
                                         const std::function<Tensor(Rank&, std::size_t)>& pick) {
  std::map<std::string, HostTensor> out;
  for (auto& r : ranks) {
    for (std::size_t i = 0; i < r->params.size(); ++i) {
      const ParamInfo& p = r->params[i];
      HostTensor& full = out[p.name];
      if (full.data.empty()) {
        full.shape = p.full_shape;
        full.data.assign(static_cast<std::size_t>(numel(p.full_shape)), 0.0f);
      }
      // Tied / replicated copies hold identical values: writing them again is harmless.
      p.layout.gather(download(pick(*r, i), *r->compute).data(), full.data.data());
    }
  }
  return out;
}

}  // namespace

std::map<std::string, HostTensor> Trainer::full_parameters() {
  return gather(impl_->ranks, [](Rank& r, std::size_t i) { return r.params[i].param; });
}

std::string Trainer::save_checkpoint() {
  Impl& m = *impl_;
  auto model = full_parameters();
  auto exp_avg = gather(m.ranks, [](Rank& r, std::size_t i) { return r.adamw->exp_avg(i); });
  auto exp_avg_sq = gather(m.ranks, [](Rank& r, std::size_t i) { return r.adamw->exp_avg_sq(i); });
  CheckpointData data;
  for (auto& [name, t] : model) {
    data.model.emplace_back(name, &t);
    data.optimizer.emplace_back(name, OptimizerMoments{&exp_avg.at(name), &exp_avg_sq.at(name)});
  }
  data.optimizer_step = m.ranks.front()->adamw->step_count();
  data.state.step = m.steps_done;
  data.state.data_position =
      sequence_index(m.steps_done + 1, 0, 0, m.config.parallel.dp, m.config.train.microbatches,
                     m.config.train.micro_batch_size);
  data.state.rng_seed = m.config.train.seed;
  data.state.config_fingerprint = config_fingerprint(m.config);
  return write_checkpoint(m.config.output.dir, data);
}

// Every parameter of every stage must be present with its full shape; extra tensors (e.g. HF's
// attention bias buffers) are ignored.
void Trainer::Impl::load_full_tensors(const std::map<std::string, HostTensor>& full, const std::string& source) {
  run_on_ranks([&](Rank& r) {
    for (auto& s : r.stages) {
      for (ParamInfo& p : s->params()) {
        auto it = full.find(p.name);
        STP_CHECK(it != full.end(), source, ": tensor '", p.name, "' is missing");
        STP_CHECK(it->second.shape == p.full_shape, source, ": tensor '", p.name, "' has shape ",
                  to_string(it->second.shape), ", the model needs ", to_string(p.full_shape));
        s->param_store().load_full(p.name, it->second.data, *r.compute);
      }
    }
  });
}

void Trainer::Impl::load_optimizer_state(const std::map<std::string, HostTensor>& exp_avg,
                                         const std::map<std::string, HostTensor>& exp_avg_sq, std::int64_t step) {
  run_on_ranks([&](Rank& r) {
    for (std::size_t i = 0; i < r.params.size(); ++i) {
      const ParamInfo& p = r.params[i];
      for (auto [moments, tensor] : {std::pair{&exp_avg, r.adamw->exp_avg(i)}, std::pair{&exp_avg_sq, r.adamw->exp_avg_sq(i)}}) {
        const HostTensor& full = moments->at(p.name);
        std::vector<float> shard(static_cast<std::size_t>(tensor.numel()));
        p.layout.scatter(full.data.data(), shard.data());
        upload(tensor, shard.data(), *r.compute);
      }
    }
    r.adamw->set_step_count(step);
  });
}

void Trainer::Impl::resume(const std::string& dir) {
  Checkpoint ck = read_checkpoint(dir);
  std::string want = config_fingerprint(config);
  STP_CHECK(ck.state.config_fingerprint.empty() || ck.state.config_fingerprint == want, "train.resume '", dir,
            "': the checkpoint was written for a different model shape (fingerprint ", ck.state.config_fingerprint,
            ", this config ", want, ")");
  load_full_tensors(ck.model, dir + "/model.safetensors");
  load_optimizer_state(ck.exp_avg, ck.exp_avg_sq, ck.optimizer_step);
  steps_done = ck.state.step;
}

}  // namespace stp
