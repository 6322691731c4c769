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

// One parameter's full f32 tensor with the larger of one of its shards and one of its Hugging Face
// tensors, the largest such pair over the distinct parameters, in bytes. The save (process 0)
// assembles a tied table once, from the stage that holds it first (`every_copy` false); a load
// hands it to every stage that holds it, whose shards are counted too (`every_copy` true).
std::size_t full_with_part_bytes(const Config& config, bool every_copy) {
  const sched::Schedule schedule =
      sched::generate(config.parallel.schedule, config.parallel.pp, config.train.microbatches);
  const ModelSpec model = model_spec_of(config);
  std::map<std::string, std::int64_t> largest_part;  // per stp name: its largest HF tensor's elements
  for (const HfTensorRule& r : hf_tensor_rules(model))
    for (const HfPart& p : r.parts) largest_part[r.name] = std::max(largest_part[r.name], numel(hf_part_shape(r, p)));
  std::set<std::string> earlier;  // taken from an earlier stage
  std::int64_t peak = 0;
  for (int r = 0; r < config.parallel.pp; ++r)
    for (int c = 0; c < schedule.chunks; ++c) {
      std::map<std::string, std::int64_t> pair;  // full + the larger of a shard and a part
      for (int t = 0; t < config.parallel.tp; ++t)
        for (const ParamInfo& p : model_param_table(model, stage_spec_of(config, schedule, r, c, t))) {
          if (!every_copy && earlier.count(p.name)) continue;
          const std::int64_t shard = p.layout.shard_rows * p.layout.shard_cols;
          std::int64_t& n = pair[p.name];
          n = std::max(n, numel(p.full_shape) + std::max(shard, largest_part[p.name]));
        }
      for (const auto& [name, n] : pair) peak = std::max(peak, n), earlier.insert(name);
    }
  return static_cast<std::size_t>(peak) * sizeof(float);
}

HostPageable pageable_host_bytes(const Config& config) {
  HostPageable b;
  b.checkpoint_save = full_with_part_bytes(config, false);
  // A load holds what the save holds, the other way round: a full tensor with one HF tensor while
  // it is made from them, then with one shard while a rank takes its part (each moment in turn).
  const std::size_t load =
      config.model.init_from.empty() && config.train.resume.empty() ? 0 : full_with_part_bytes(config, true);
  if (!config.model.init_from.empty()) b.init_from = load;
  if (!config.train.resume.empty()) b.resume = load;
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
