#include "train/memory_settings.h"

#include "base/error.h"

namespace stp {
namespace {

std::size_t budget_bytes(const std::optional<std::uint64_t>& knob) {
  return knob ? static_cast<std::size_t>(*knob) : kNoBudget;
}

template <Policy E>
E policy_of(const std::string& text, const char* key) {
  std::optional<E> p = parse_policy<E>(text);
  STP_ASSERT(p, key, " = '", text, "' is not one of ", policy_choices<E>(), " (configs are checked by load_config)");
  return *p;
}

}  // namespace

MemorySettings memory_settings(const Config& config) {
  MemorySettings m;
  m.device_budget = budget_bytes(config.memory.device_budget);
  m.host_budget = budget_bytes(config.memory.host_budget);
  m.offload = policy_of<OffloadPolicy>(config.memory.offload, "memory.offload");
  m.recompute = policy_of<RecomputePolicy>(config.memory.recompute, "memory.recompute");
  m.optimizer_offload = policy_of<OffloadPolicy>(config.memory.optimizer_offload, "memory.optimizer_offload");
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

std::string format_budget(std::size_t bytes, ByteStyle style) {
  return bytes == kNoBudget ? "unlimited" : format_bytes(bytes, style);
}

}  // namespace stp
