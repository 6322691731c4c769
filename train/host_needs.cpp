#include "train/host_needs.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "train/hf_convert.h"
#include "models/registry.h"
#include "process/process.h"
#include "schedule/schedule.h"
#include "train/stage_layout.h"

namespace stp {

std::size_t HostPageable::peak() const { return std::max({checkpoint_save, init_from, resume}); }

std::size_t HostNeeds::total() const { return pinned() + pageable.peak() + devices; }

std::int64_t full_parameter_count(const Config& config) {
  const sched::Schedule schedule =
      sched::generate(config.parallel.schedule, config.parallel.pp, config.train.microbatches);
  const ModelSpec model = model_spec_of(config);
  std::set<std::string> seen;  // a tied table lives in two stages under one name
  std::int64_t count = 0;
  for (int r = 0; r < config.parallel.pp; ++r)
    for (int c = 0; c < schedule.chunks; ++c)
      for (const ParamInfo& p : model_param_table(model, stage_spec_of(config, schedule, r, c, 0)))
        if (seen.insert(p.name).second) count += numel(p.full_shape);
  return count;
}

// The save holds, on process 0, one parameter's full f32 tensor with one of its shards while it is
// assembled, then with one of its Hugging Face parts while that is made and written
// (train/trainer_checkpoint.cpp); the peak is the largest such pair.
std::size_t checkpoint_save_bytes(const Config& config) {
  const sched::Schedule schedule =
      sched::generate(config.parallel.schedule, config.parallel.pp, config.train.microbatches);
  const ModelSpec model = model_spec_of(config);
  std::map<std::string, std::int64_t> largest_part;  // per stp name: its largest HF tensor's elements
  for (const HfTensorRule& r : hf_tensor_rules(model))
    for (const HfPart& p : r.parts) largest_part[r.name] = std::max(largest_part[r.name], numel(hf_part_shape(r, p)));
  std::set<std::string> earlier;  // taken from an earlier stage: a tied table's second copy is not
  std::int64_t peak = 0;          // assembled again
  for (int r = 0; r < config.parallel.pp; ++r)
    for (int c = 0; c < schedule.chunks; ++c) {
      std::map<std::string, std::int64_t> pair;  // full + the larger of a shard and a part
      for (int t = 0; t < config.parallel.tp; ++t)
        for (const ParamInfo& p : model_param_table(model, stage_spec_of(config, schedule, r, c, t))) {
          if (earlier.count(p.name)) continue;
          const std::int64_t shard = p.layout.shard_rows * p.layout.shard_cols;
          std::int64_t& n = pair[p.name];
          n = std::max(n, numel(p.full_shape) + std::max(shard, largest_part[p.name]));
        }
      for (const auto& [name, n] : pair) peak = std::max(peak, n), earlier.insert(name);
    }
  return static_cast<std::size_t>(peak) * sizeof(float);
}

HostPageable pageable_host_bytes(const Config& config) {
  const auto P = static_cast<std::size_t>(full_parameter_count(config)) * sizeof(float);  // one f32 state
  // The replicas whose ranks load their moment shards at once: all of them in one process; under
  // an MPI launcher one rank per process, less than one replica.
  const std::size_t replicas = launched_by_mpi() ? 1 : static_cast<std::size_t>(config.parallel.dp);
  HostPageable b;
  b.checkpoint_save = checkpoint_save_bytes(config);
  if (!config.model.init_from.empty()) b.init_from = 2 * P;
  if (!config.train.resume.empty()) b.resume = (5 + replicas) * P;
  return b;
}

// The plan lists the devices of one replica (see HostNeeds).
HostNeeds host_needs(const MemoryPlan& plan, const Config& config) {
  HostNeeds n;
  const bool cpu = config.parallel.backend == "cpu";
  const bool one_device = launched_by_mpi();
  const auto replicas = static_cast<std::size_t>(config.parallel.dp);
  std::size_t largest = 0;
  for (const RankPrediction& p : plan.predicted) {
    const std::size_t device = cpu ? p.peak_device_bytes : 0, states = p.host_states.total();
    if (one_device && p.host_pinned_bytes + states + device <= largest) continue;
    if (one_device) {
      largest = p.host_pinned_bytes + states + device;
      n.pinned_activations = p.host_pinned_bytes, n.pinned_states = states, n.devices = device;
    } else {
      n.pinned_activations += replicas * p.host_pinned_bytes;
      n.pinned_states += replicas * states;
      n.devices += replicas * device;
    }
  }
  n.pageable = pageable_host_bytes(config);
  return n;
}

}  // namespace stp
