// Full tensors <-> per-rank shards: gathering the model and optimizer state for checkpoints (from
// replica 0, across processes when the job has several) and writing them into checkpoints; loading
// them back is train/trainer_load.cpp.
#include <set>

#include "base/error.h"
#include "config/hf_config.h"
#include "formats/checkpoint.h"
#include "formats/tensor_values.h"
#include "train/hf_convert.h"
#include "models/registry.h"
#include "train/stage_layout.h"
#include "train/trainer_impl.h"

namespace stp {

namespace {

// The problems of a state being written, named as when the whole state was gathered and scanned
// before any was written: the first bad tensor in the order of the files (model.safetensors, then
// optimizer.safetensors' exp_avg, then its exp_avg_sq, each by name), and how many are bad
// (formats/tensor_values.h).
class StateProblems {
 public:
  void check(CheckpointTensor which, const std::string& name, const std::vector<float>& values) {
    const std::string problem =
        value_problem(values, which == CheckpointTensor::ExpAvgSq ? ValueRule::FiniteNonNegative : ValueRule::Finite);
    if (problem.empty()) return;
    const std::pair<int, std::string> key{static_cast<int>(which), name};
    if (bad_++ > 0 && key >= first_key_) return;
    static const char* const kSuffix[] = {"", ".exp_avg", ".exp_avg_sq"};
    first_key_ = key;
    first_ = str(which == CheckpointTensor::Model ? "model.safetensors" : "optimizer.safetensors", ": tensor '", name,
                 kSuffix[key.first], "' ", problem);
  }
  bool clean() const { return bad_ == 0; }
  std::string message() const {
    if (bad_ <= 1) return first_;
    return str(first_, ", and ", bad_ - 1, " more tensor", bad_ == 2 ? "" : "s", " of the state hold such values");
  }

 private:
  int bad_ = 0;
  std::pair<int, std::string> first_key_;
  std::string first_;
};

// Every HF tensor's name and shape, in the files' order (by name).
std::vector<std::pair<std::string, Shape>> hf_file_tensors(const std::vector<HfTensorRule>& rules) {
  std::map<std::string, Shape> sorted;
  for (const HfTensorRule& r : rules)
    for (const HfPart& p : r.parts) sorted.emplace(p.name, hf_part_shape(r, p));
  return {sorted.begin(), sorted.end()};
}

}  // namespace

std::vector<float> Trainer::Impl::receive_shard(const ParamInfo& p, int src, std::uint32_t index,
                                                PageableMeter& meter) {
  Rank& r = *ranks.front();
  Tensor shard = Tensor::empty(*r.alloc, {p.layout.shard_rows * p.layout.shard_cols});
  r.replica->recv(*r.compute, shard.raw(), shard.bytes(), src, index);
  meter.hold(shard.bytes());
  return download(shard, *r.compute);
}

// Across processes, replica 0's ranks send their shards in parameter order over the replica
// communicator to global rank 0, which knows every rank's parameter table. It takes them one
// parameter at a time, from each TP rank in turn: in each sender's own order, so every receive
// meets a send that its sender issues without waiting on a later receive.
void Trainer::Impl::gather_each(const std::function<Tensor(Rank&, std::size_t)>& pick, int replica,
                                const FullTensorFn& each, PageableMeter& meter) {
  STP_CHECK(replica >= 0 && replica < layout.dp && (replica == 0 || !multi_process()), "replica ", replica,
            " cannot be gathered here (dp = ", layout.dp, multi_process() ? ", only replica 0 across processes)" : ")");
  for (auto& r : ranks) r->optimizer->settle();  // the last step's uploads
  for (auto& r : ranks) {
    if (r->dp_rank != replica || !multi_process() || r->global == 0) continue;
    for (std::size_t i = 0; i < r->params().size(); ++i) {  // a sender
      Tensor t = pick(*r, i);
      r->replica->send(*r->compute, t.raw(), t.bytes(), 0, static_cast<std::uint32_t>(i));
    }
    r->synchronize();
  }
  if (multi_process() && ranks.front()->global != 0) return;
  const ModelSpec model = model_spec_of(config);
  std::set<std::string> taken;  // a tied table lives in two stages under one name
  for (int pp = 0; pp < layout.pp; ++pp) {
    std::vector<std::uint32_t> base(static_cast<std::size_t>(layout.tp), 0);  // each TP rank's params() index
    for (int c = 0; c < schedule.chunks; ++c) {
      std::vector<std::vector<ParamInfo>> tables;  // [tp rank]: the chunk's parameter table
      for (int t = 0; t < layout.tp; ++t)
        tables.push_back(model_param_table(model, stage_spec_of(config, schedule, pp, c, t)));
      for (std::size_t j = 0; j < tables[0].size(); ++j) {
        const bool wanted = taken.insert(tables[0][j].name).second;
        std::vector<float> full;
        for (int t = 0; t < layout.tp; ++t) {
          const std::uint32_t i = base[static_cast<std::size_t>(t)] + static_cast<std::uint32_t>(j);
          Rank* local = multi_process() ? (pp == 0 && t == 0 ? ranks.front().get() : nullptr)
                                        : local_rank(layout.global(replica, pp, t));
          const ParamInfo& p = local ? local->params().at(i) : tables[static_cast<std::size_t>(t)][j];
          STP_ASSERT(p.name == tables[0][j].name, "checkpoint gather: ", p.name, " where ", tables[0][j].name);
          if (local && !wanted) continue;
          std::vector<float> shard;
          if (local) {
            shard = download(pick(*local, i), *local->compute);
            meter.hold(shard.size() * sizeof(float));
          } else {
            shard = receive_shard(p, layout.global(0, pp, t), i, meter);
          }
          if (wanted && full.empty()) {
            full.assign(static_cast<std::size_t>(numel(p.full_shape)), 0.0f);
            meter.hold(full.size() * sizeof(float));
          }
          if (wanted) p.layout.gather(shard.data(), full.data());
          meter.release(shard.size() * sizeof(float));
        }
        if (wanted) each(tables[0][j], full);
        meter.release(full.size() * sizeof(float));
      }
      for (int t = 0; t < layout.tp; ++t)
        base[static_cast<std::size_t>(t)] += static_cast<std::uint32_t>(tables[static_cast<std::size_t>(t)].size());
    }
  }
}

// Every rank's optimizer assembles what a checkpoint gathers as full per-rank shards (a collective
// where the state is sharded: the distributed optimizer all-gathers into the gradient buffers),
// then replica `replica`'s are gathered.
void Trainer::Impl::gather_views_each(const std::function<std::vector<Tensor>(RankOptimizer&)>& views, int replica,
                                      const FullTensorFn& each, PageableMeter& meter) {
  run_on_ranks([&](Rank& r) {
    r.optimizer->settle();
    r.checkpoint_views = views(*r.optimizer);
    r.synchronize();
  });
  gather_each([](Rank& r, std::size_t i) { return r.checkpoint_views.at(i); }, replica, each, meter);
  for (auto& r : ranks) r->checkpoint_views.clear();
}

std::map<std::string, HostTensor> Trainer::Impl::gather_views(
    const std::function<std::vector<Tensor>(RankOptimizer&)>& views, int replica) {
  std::map<std::string, HostTensor> out;
  PageableMeter meter;
  gather_views_each(
      views, replica,
      [&](const ParamInfo& p, std::vector<float>& full) {
        out[p.name] = HostTensor{p.full_shape, std::move(full)};
      },
      meter);
  return out;
}

std::map<std::string, HostTensor> Trainer::full_parameters(int replica) {
  return impl_->gather_views([](RankOptimizer& o) { return o.full_parameters(); }, replica);
}

std::map<std::string, HostTensor> Trainer::full_moments(int which, int replica) {
  return impl_->gather_views([which](RankOptimizer& o) { return o.full_moments(which); }, replica);
}

CheckpointData Trainer::Impl::checkpoint_info(const std::string& note) const {
  CheckpointData data;
  data.hf_config = hf_config_json(config);
  for (const TokenizerFile& f : tokenizer_files) data.files.emplace_back(f.name, f.bytes);
  data.optimizer_step = ranks.front()->optimizer->step_count();
  data.state.step = steps_done;
  data.state.data_position = sequence_index(steps_done + 1, 0, 0, config.parallel.dp, config.train.microbatches,
                                            config.train.micro_batch_size);
  if (config.data.sampling == "shuffle" && dataset) {
    const std::uint64_t windows = dataset->windows();
    data.state.shuffle = ShufflePosition{dataset->num_tokens(), std::uint64_t(config.model.seq_len), windows,
                                         data.state.data_position / windows, data.state.data_position % windows};
  }
  data.state.rng_seed = config.train.seed;
  data.state.config_fingerprint = config_fingerprint(config);
  data.state.note = note;
  return data;
}

// The state is checked where it is called good, on the tensors as they are written: nothing is
// kept to undo a step, no step pays for a check, and what is checked is exactly what a resume or
// `stp generate` would read (docs/memory.md, What is called good). It is written tensor by tensor
// into the checkpoint's temporary folder, in HF names and layouts (a permutation of the values:
// resume converts back bit for bit), and swapped in only when every value was good; process 0
// holds one full tensor at a time (train/host_needs.h).
CheckpointSave Trainer::try_save_checkpoint(const std::string& note) {
  Impl& m = *impl_;
  const bool writer = !m.multi_process() || m.options.processes->rank() == 0;  // process 0 gets the tensors
  const auto rules = hf_tensor_rules(model_spec_of(m.config));
  std::map<std::string, const HfTensorRule*> rule_of;
  for (const HfTensorRule& r : rules) rule_of[r.name] = &r;
  std::unique_ptr<CheckpointWriter> file;
  if (writer)
    file = std::make_unique<CheckpointWriter>(m.config.output.dir, m.checkpoint_info(note), hf_file_tensors(rules));
  StateProblems problems;
  PageableMeter meter;
  auto write = [&](CheckpointTensor which) {
    return [&, which](const ParamInfo& p, std::vector<float>& full) {
      auto r = rule_of.find(p.name);
      if (r == rule_of.end()) return;  // not exported (none today)
      for (const HfPart& part : r->second->parts) {
        const HostTensor t = to_hf_part(*r->second, part, full.data());
        meter.hold(t.data.size() * sizeof(float));
        problems.check(which, part.name, t.data);
        if (problems.clean()) file->write(which, part.name, t.data.data(), t.data.size());
        meter.release(t.data.size() * sizeof(float));
      }
    };
  };
  m.gather_views_each([](RankOptimizer& o) { return o.full_parameters(); }, 0, write(CheckpointTensor::Model), meter);
  // Each moment in turn: the gradient buffers, dead between steps, hold one moment at a time.
  for (CheckpointTensor w : {CheckpointTensor::ExpAvg, CheckpointTensor::ExpAvgSq})
    m.gather_views_each([w](RankOptimizer& o) { return o.full_moments(w == CheckpointTensor::ExpAvg ? 0 : 1); }, 0,
                        write(w), meter);
  CheckpointSave out;
  out.pageable_peak_bytes = meter.peak;
  if (!problems.clean())
    out.problem = str("the state after step ", last_update_step(), " is not finite: ", problems.message(),
                      "; it was not written. ", m.last_good_state());
  const bool bad = m.multi_process() ? m.options.processes->any(!out.problem.empty()) : !out.problem.empty();
  if (bad) return out;  // the writer's temporary folder goes with it
  out.written = true;
  m.last_good_step = m.steps_done;
  m.last_good_resumed = false;
  if (!writer) return out;
  out.path = file->commit();
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

}  // namespace stp
