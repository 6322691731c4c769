#include "train/memory_settings.h"

#include <algorithm>

#include "base/error.h"
#include "process/process.h"

namespace stp {
namespace {

std::size_t budget_bytes(const std::optional<std::uint64_t>& knob) {
  return knob ? static_cast<std::size_t>(*knob) : kNoBudget;
}

MachineMemory read_machine_memory() {
  MachineMemory m;
  try {
    m.memory = read_host_memory();
  } catch (const Error& e) {
    m.memory = {};
    m.problem = e.what();
  }
  m.processes = processes_on_this_host();
  return m;
}

template <Policy E>
E policy_of(const std::string& text, const char* key) {
  std::optional<E> p = parse_policy<E>(text);
  STP_ASSERT(p, key, " = '", text, "' is not one of ", policy_choices<E>(), " (configs are checked by load_config)");
  return *p;
}

}  // namespace

std::uint64_t host_reserve_bytes(std::uint64_t share) {
  return std::min(std::max(kHostReserveMinBytes, share / 100 * kHostReservePercent), share / 2);
}

std::uint64_t MachineMemory::share() const { return memory.available() / static_cast<std::uint64_t>(processes); }

std::string MachineMemory::describe(ByteStyle style) const {
  if (share() == 0) return str("an unknown amount (", problem, ")");
  std::string text = str(format_bytes(memory.available(), style), " (", memory.source(), ")");
  if (processes > 1)
    text += str(", ", format_bytes(share(), style), " for each of its ", processes, " processes of this job");
  return text;
}

const MachineMemory& this_machine_memory() {
  static const MachineMemory machine = read_machine_memory();
  return machine;
}

std::uint64_t auto_host_budget(const MachineMemory& machine) {
  const std::uint64_t share = machine.share();
  STP_CHECK(share > 0, "memory.host_budget: auto needs the machine's memory: ", machine.problem);
  return share - host_reserve_bytes(share);
}

MemorySettings memory_settings(const Config& config) { return memory_settings(config, this_machine_memory()); }

MemorySettings memory_settings(const Config& config, const MachineMemory& machine) {
  MemorySettings m;
  m.device_budget = budget_bytes(config.memory.device_budget);
  m.machine = machine;
  m.host_budget_auto = config.memory.host_budget == kAutoBytes;
  m.host_budget = m.host_budget_auto ? static_cast<std::size_t>(auto_host_budget(machine))
                                     : budget_bytes(config.memory.host_budget);
  m.offload = policy_of<OffloadPolicy>(config.memory.offload, "memory.offload");
  m.recompute = policy_of<RecomputePolicy>(config.memory.recompute, "memory.recompute");
  m.optimizer_offload = policy_of<OffloadPolicy>(config.memory.optimizer_offload, "memory.optimizer_offload");
  m.optimizer_overlap = policy_of<OffloadPolicy>(config.memory.optimizer_overlap, "memory.optimizer_overlap");
  m.param_offload = policy_of<OffloadPolicy>(config.memory.param_offload, "memory.param_offload");
  m.host_masters = m.optimizer_offload != OffloadPolicy::None && config.train.precision == "bf16" &&
                   !(config.parallel.distributed_optimizer && config.parallel.dp > 1);
  return m;
}

std::size_t attention_library_workspace_bytes(const Config& config) {
  const bool library =
      config.parallel.backend == "cuda" && config.model.attention == "fused" && config.train.precision == "bf16";
  return library ? attention_workspace_bytes(DeviceKind::Cuda) : 0;
}

ArenaOptions budgeted_arena_options(Device& device, std::size_t device_budget) {
  ArenaOptions arena = device_arena_options(device, device_budget);
  if (device_budget != kNoBudget) arena.segment_bytes = device_budget;
  return arena;
}

std::string host_budget_text(const MemorySettings& settings, ByteStyle style) {
  if (!settings.host_budget_auto) return str("memory.host_budget = ", format_budget(settings.host_budget, style));
  const std::uint64_t share = settings.machine.share();
  return str("memory.host_budget = auto = ", format_bytes(settings.host_budget, style), " (",
             settings.machine.describe(style), " less the ", format_bytes(host_reserve_bytes(share), style),
             " reserve)");
}

std::string format_budget(std::size_t bytes, ByteStyle style) {
  return bytes == kNoBudget ? "unlimited" : format_bytes(bytes, style);
}

}  // namespace stp
