// The communicators of a training process: TP, the pipeline channels, the tied embedding's pair,
// DP, the replica and the world — in one process or across the job's processes, each group made on
// its own or split from the world.
#include <functional>

#include "base/error.h"
#include "core/backend.h"
#include "core/gpu_logic.h"
#include "train/trainer_impl.h"

namespace stp {

// One communicator group: members as global ranks (group rank = position) and where each member's
// communicator goes.
struct CommGroup {
  std::vector<int> members;
  bool tp_link = false;  // the CPU backend's emulated TP link applies
  // Every operation of the group is issued on the rank's compute stream, so it may share NCCL's
  // resources with the world (core/gpu_logic.h, SplitFamily).
  bool compute_only = false;
  std::function<void(Rank&, Communicator*)> assign;
};

// Groups (members as global ranks, group rank = position): TP (same dp and pp rank), the pipeline
// channels (same dp and tp rank; one per direction and message kind between two pp ranks, the
// source first: schedule/p2p_groups.h), the tied-embedding pair (ranks holding the first and the last stage, when
// those differ), DP (same pp and tp rank), the replica (grad norm, checkpoint gather) and the world
// (losses), and with vocab parallelism the TP groups once more (Rank::vocab). Every process lists them
// in this order. Each group is then made on its own (the CPU backend, NCCL older than 2.18: a HostComm or
// NCCL group over local devices, or across processes ProcessGroup::make_comm, every process taking
// part in every group in this order), or, on CUDA, split from the world (build_split_communicators).
std::vector<CommGroup> Trainer::Impl::comm_groups() const {
  const int dp = layout.dp, tp = layout.tp, pp = layout.pp;
  std::vector<CommGroup> groups;
  auto group = [&](const std::vector<int>& members, Communicator* Rank::*slot, bool compute_only) {
    groups.push_back({members, slot == &Rank::tp, compute_only, [slot](Rank& r, Communicator* c) { r.*slot = c; }});
  };
  auto members = [](int n, const std::function<int(int)>& global) {
    std::vector<int> out;
    for (int i = 0; i < n; ++i) out.push_back(global(i));
    return out;
  };
  for (int d = 0; d < dp; ++d)
    for (int p = 0; p < pp; ++p)
      if (tp > 1) group(members(tp, [&](int t) { return layout.global(d, p, t); }), &Rank::tp, false);
  for (int d = 0; d < dp; ++d)
    for (int p = 0; p < pp; ++p)
      if (tp > 1 && config.parallel.vocab_parallel)
        groups.push_back({members(tp, [&](int t) { return layout.global(d, p, t); }), true, false,
                          [](Rank& r, Communicator* c) { r.vocab = c; }});
  int first_rank = sched::rank_of_stage(schedule, 0);
  int last_rank = sched::rank_of_stage(schedule, schedule.n_stages() - 1);
  for (int d = 0; d < dp; ++d) {
    for (int t = 0; t < tp; ++t) {
      for (const sched::P2pChannel& c : sched::p2p_channels(schedule))
        groups.push_back(
            {{layout.global(d, c.src, t), layout.global(d, c.dst, t)}, false, false, [c](Rank& r, Communicator* comm) {
               r.pp_channels[c] = comm;
             }});
      if (first_rank != last_rank)  // the tied gradients' sum, on compute (Trainer::Impl::sum_tied_grads)
        group({layout.global(d, first_rank, t), layout.global(d, last_rank, t)}, &Rank::tied, true);
    }
  }
  for (int p = 0; p < pp; ++p)
    for (int t = 0; t < tp; ++t)
      if (dp > 1) group(members(dp, [&](int d) { return layout.global(d, p, t); }), &Rank::dp, false);
  for (int d = 0; d < dp; ++d)  // grad norm and checkpoint gather, on compute
    group(members(layout.replica_size(), [&](int i) { return layout.global(d, 0, 0) + i; }), &Rank::replica, true);
  group(members(layout.size(), [](int g) { return g; }), &Rank::world, true);  // losses, on compute
  return groups;
}

// Every group made on its own, or split from the world where NCCL can (build_split_communicators).
void Trainer::Impl::build_communicators() {
  const std::vector<CommGroup> groups = comm_groups();
  std::string why;
  const DeviceKind kind = devices.front()->kind();
  bool split = layout.size() > 1 && comm_split_available(kind, &why);
  if (multi_process()) split = !options.processes->any(!split);  // every process takes the same path
  if (kind == DeviceKind::Cuda && layout.size() > 1 && !split)
    warnings.push_back(str(why.empty() ? "a process cannot split NCCL communicators" : why,
                           "; every communicator group is created on its own"));
  if (split) {
    build_split_communicators(groups);
    return;
  }
  for (const CommGroup& g : groups) {
    if (multi_process()) {
      Rank& me = *ranks.front();
      if (auto made = options.processes->make_comm(g.members, *me.device)) {
        g.assign(me, made.get());
        comms.push_back(std::move(made));
      }
      continue;
    }
    std::vector<Device*> devs;
    for (int m : g.members) devs.push_back(local_rank(m)->device);
    HostCommOptions link;
    if (g.tp_link) link.all_reduce_bytes_per_s = config.parallel.tp_link_bandwidth;
    auto made = make_comms(devs, link);
    for (std::size_t i = 0; i < g.members.size(); ++i) {
      g.assign(*local_rank(g.members[i]), made[i].get());
      comms.push_back(std::move(made[i]));
    }
  }
}

// The world: the one communicator initialised from a unique id, as a split parent, assigned to
// every local rank (the last group). Returns it per local rank.
std::vector<Communicator*> Trainer::Impl::build_world_communicator(const std::vector<CommGroup>& groups) {
  const int n = layout.size();
  std::vector<int> everyone;
  for (int g = 0; g < n; ++g) everyone.push_back(g);
  std::vector<Communicator*> world(ranks.size(), nullptr);
  if (multi_process()) {
    auto made = options.processes->make_comm(everyone, *ranks.front()->device, /*split_parent=*/true);
    STP_ASSERT(made != nullptr, "this process is not in the world");
    world[0] = made.get();
    comms.push_back(std::move(made));
  } else {
    std::vector<Device*> devs;
    for (int g : everyone) devs.push_back(local_rank(g)->device);
    auto made = make_split_parent_comms(devs);
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      world[i] = made[static_cast<std::size_t>(ranks[i]->global)].get();
    }
    for (auto& c : made) comms.push_back(std::move(c));
  }
  const CommGroup& world_group = groups.back();
  STP_ASSERT(world_group.members == everyone, "the last communicator group is not the world");
  for (std::size_t i = 0; i < ranks.size(); ++i) world_group.assign(*ranks[i], world[i]);
  return world;
}

// CUDA with NCCL 2.18 or later: the world (the last group) is the one communicator initialised from a
// unique id, as a split parent; every other group of two or more ranks is split from it in the calls
// gpu::plan_splits lists, which every process computes from the same groups and makes in the same
// order, each call with all its local ranks (ncclCommSplit is collective over the parent). Groups on
// the compute stream share the world's resources; the others are split from a private parent
// (core/gpu_logic.h, SplitFamily, says why). Communicators are added to `comms` parents first, which
// destroys them in reverse (children before their parents).
void Trainer::Impl::build_split_communicators(const std::vector<CommGroup>& groups) {
  const int n = layout.size();
  std::vector<int> everyone;
  for (int g = 0; g < n; ++g) everyone.push_back(g);
  // [local rank index] this process's member of the world and of the private parent.
  const std::vector<Communicator*> world = build_world_communicator(groups);
  std::vector<Communicator*> priv(ranks.size(), nullptr);

  std::vector<gpu::SplitGroup> split_groups;
  for (std::size_t g = 0; g + 1 < groups.size(); ++g)
    split_groups.push_back(
        {groups[g].members, groups[g].compute_only ? gpu::SplitFamily::Shared : gpu::SplitFamily::Private});
  const std::vector<gpu::SplitCall> calls = gpu::plan_splits(split_groups, n);
  auto split = [&](const std::vector<Communicator*>& parents, const std::vector<int>& color,
                   const std::vector<int>& key) {
    std::vector<int> colors, keys;
    for (auto& r : ranks) {
      colors.push_back(color[static_cast<std::size_t>(r->global)]);
      keys.push_back(key[static_cast<std::size_t>(r->global)]);
    }
    return split_comms(parents, colors, keys, /*share=*/false);
  };
  if (gpu::needs_private_parent(calls)) {  // every rank in color 0, ordered as the world
    auto made = split(world, std::vector<int>(static_cast<std::size_t>(n), 0), everyone);
    for (std::size_t i = 0; i < ranks.size(); ++i) priv[i] = made[i].get();
    for (auto& c : made) comms.push_back(std::move(c));
  }
  for (const gpu::SplitCall& call : calls) {
    auto made = split(call.family == gpu::SplitFamily::Shared ? world : priv, call.color, call.key);
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      const int color = call.color[static_cast<std::size_t>(ranks[i]->global)];
      if (color == gpu::kSplitNoColor) continue;
      const CommGroup& g = groups[static_cast<std::size_t>(call.groups[static_cast<std::size_t>(color)])];
      const int key = call.key[static_cast<std::size_t>(ranks[i]->global)];
      STP_CHECK(made[i] && made[i]->rank() == key && made[i]->size() == static_cast<int>(g.members.size()),
                "ncclCommSplit gave global rank ", ranks[i]->global, " rank ", made[i] ? made[i]->rank() : -1, " of ",
                made[i] ? made[i]->size() : 0, " in a group where it is rank ", key, " of ", g.members.size());
      g.assign(*ranks[i], made[i].get());
      comms.push_back(std::move(made[i]));
    }
  }
  for (const CommGroup& g : groups)  // groups of one rank: the identity (core/backend.h)
    if (g.members.size() == 1)
      if (Rank* r = local_rank(g.members.front())) {
        auto self = make_self_comm();
        g.assign(*r, self.get());
        comms.push_back(std::move(self));
      }
}

}  // namespace stp
