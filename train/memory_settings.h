// The memory knobs in the terms of the layers below config/: the one place where
// memory.device_budget and memory.host_budget become bytes and memory.offload / memory.recompute
// become the planner's policies (memory/policy.h). The trainer, the memory planner and `stp plan`
// read the knobs through memory_settings(), nowhere else.
//
// Budgets (the rules, stated here once):
//   * memory.device_budget: B -> B bytes per device. The device is created with capacity B (a GPU:
//     min(B, its free memory at start-up)); its caching allocator reserves at most B, as one
//     segment of B (budgeted_arena_options); the planner plans for B, and plans again for 5% less
//     (up to 8 times) only when its plan's live bytes fit B but cannot be placed in it
//     (train/memory_planning.h).
//   * memory.device_budget: null -> kNoBudget. The device's capacity is the only limit (the CPU
//     backend's is unlimited, a GPU's is its free memory at start-up); the allocator grows in
//     32 MiB segments; the planner plans without a limit; `stp plan` prints "unlimited".
//   * memory.host_budget: B -> B bytes of pinned host memory for the whole process, the cap of
//     the pinned pools that offload copies into and of the host-placed model states; null ->
//     kNoBudget (unlimited).
//   * memory.host_budget: auto -> auto_host_budget(machine): this process's share of what the
//     machine has (MachineMemory::share: the smaller of MemTotal and the cgroup limit, divided by
//     the job's processes on this host) less host_reserve_bytes() of it. It depends on the machine
//     only, not on its free memory, so a plan (and `stp plan`) is the same on every run of one
//     machine. A machine whose memory cannot be read makes auto an error naming the file.
//
// Usage:
//   MemorySettings m = memory_settings(config);
//   if (m.offload == OffloadPolicy::None) ...; format_budget(m.device_budget);  // "256 MiB"
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/error.h"
#include "config/config.h"
#include "memory/block_arena.h"
#include "memory/host_memory.h"
#include "memory/policy.h"

namespace stp {

inline constexpr std::size_t kNoBudget = SIZE_MAX;

// The reserve memory.host_budget: auto leaves to everything that is not pinned: the operating
// system and the page cache of the token files, the process's pageable buffers (a checkpoint's
// gathered state, model.init_from's tensors: train/host_needs.h), the emulated devices of the CPU
// backend, other processes. 10% of the machine, at least 4 GiB, at most half of it (so that a
// small machine or container still pins something). docs/memory.md, Host memory.
inline constexpr std::uint64_t kHostReserveMinBytes = std::uint64_t{4} << 30;
inline constexpr std::uint64_t kHostReservePercent = 10;
std::uint64_t host_reserve_bytes(std::uint64_t share);

// What this machine has for this process.
struct MachineMemory {
  HostMemory memory;  // memory.mem_total == 0: unknown (`problem` says why)
  int processes = 1;  // the job's processes on this host (process/process.h), sharing it evenly
  std::string problem;
  // memory.available() / processes; 0 = unknown.
  std::uint64_t share() const;
  // "23.5 GiB (MemTotal)", "8.00 GiB (cgroup limit, FILE), 2.00 GiB for each of its 4 processes of
  // this job".
  std::string describe(ByteStyle style = ByteStyle::Human) const;
};

// The machine this process runs on: read once (memory/host_memory.h, the real /proc and cgroup
// files; processes_on_this_host()), then the same answer for the life of the process.
const MachineMemory& this_machine_memory();

// memory.host_budget: auto in bytes: share - host_reserve_bytes(share).
std::uint64_t auto_host_budget(const MachineMemory& machine);

struct MemorySettings {
  std::size_t device_budget = kNoBudget;  // bytes per device
  std::size_t host_budget = kNoBudget;    // pinned host bytes, whole process (auto resolved)
  bool host_budget_auto = false;          // memory.host_budget: auto
  MachineMemory machine;                  // what the budget was resolved against and is checked against
  OffloadPolicy offload = OffloadPolicy::Auto;
  RecomputePolicy recompute = RecomputePolicy::Auto;
  OffloadPolicy optimizer_offload = OffloadPolicy::None;  // memory.optimizer_offload
  OffloadPolicy param_offload = OffloadPolicy::None;      // memory.param_offload
  // A chunk whose optimizer goes to the host takes its f32 masters along (StageSpec::host_masters):
  // optimizer offload enabled, train.precision bf16 (only then are there bf16 copies for the device
  // to keep), and not the distributed optimizer with dp > 1 (its all-gather writes the flat device
  // masters).
  bool host_masters = false;
  // memory.optimizer_overlap: whether host chunks speculate (optim/host_update.h, Speculation);
  // auto is decided by the plan (MemoryPlan::optimizer_overlap).
  OffloadPolicy optimizer_overlap = OffloadPolicy::None;
};

// The settings of a loaded config. A policy string the registry's choices do not allow is an
// internal error (load_config reports bad values to users, naming the knob and its choices).
// memory.host_budget: auto is resolved against this_machine_memory(), or against `machine` (tests).
MemorySettings memory_settings(const Config& config);
MemorySettings memory_settings(const Config& config, const MachineMemory& machine);

// "memory.host_budget = 4.00 GiB", or with auto "memory.host_budget = auto = 17.5 GiB (23.5 GiB
// (MemTotal) less the 4.00 GiB reserve)": the knob and its bytes, for messages.
std::string host_budget_text(const MemorySettings& settings, ByteStyle style = ByteStyle::Human);

// Bytes of attention-library workspace each rank's compute stream gets (Stream::set_attention_
// workspace): attention_workspace_bytes(CUDA) where the library can run, model.attention fused with
// train.precision bf16 on parallel.backend cuda; 0 otherwise (every CPU plan, f32, naive). Decided
// by the config, not by the device, so the dry run that makes the memory plan counts what the GPU
// run allocates, whether or not cuDNN turns out to be usable there.
std::size_t attention_library_workspace_bytes(const Config& config);

// The caching device allocator's options for `device_budget` (bytes; kNoBudget = none): with a
// budget the arena takes it as one segment — carving one range, with coalescing, leaves far less
// fragmentation than 32 MiB segments once the budget is tight; without one it grows in 32 MiB
// segments (device_arena_options).
ArenaOptions budgeted_arena_options(Device& device, std::size_t device_budget);

// format_bytes(bytes, style) ("256 MiB"), or "unlimited" for kNoBudget.
std::string format_budget(std::size_t bytes, ByteStyle style = ByteStyle::Human);

}  // namespace stp
