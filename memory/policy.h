// The memory planner's policies: how far each of its levers may go (memory/planner.h). One enum
// per lever and one name table per enum; the table gives to_string (what `stp plan`, metrics and
// error messages print), parse_policy and the choices text ("auto|none|all") that the knob of the
// lever lists in the config registry.
//
// Who parses: config/ cannot include memory/ (nor memory/ config/), so the knobs stay strings in
// Config, checked against the registry's choices when the config is loaded (that is where a bad
// value is reported); train/memory_settings.h turns them into these enums, once, for everyone
// below. tests/train/memory_settings_test.cpp checks that the registry's choices and these tables
// agree, so the two spellings cannot drift apart.
//
// Adding a lever: an enum, a `policy_names` overload returning its table, a knob whose choices are policy_choices<E>(),
// and a field in MemorySettings.
//
// Usage:
//   std::optional<OffloadPolicy> p = parse_policy<OffloadPolicy>("all");  // nullopt: not a name
//   to_string(RecomputePolicy::Selective);                                // "selective"
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace stp {

template <class E>
struct PolicyName {
  E value;
  const char* name;
};

// An offload lever: what may move to pinned host memory (today: activation records between a
// unit's forward and its backward).
enum class OffloadPolicy : std::uint8_t {
  Auto,  // the planner offloads what the budget needs, cheapest first
  None,  // never
  All,   // everything that can be offloaded
};

// The recompute lever (levels: memory/recompute.h).
enum class RecomputePolicy : std::uint8_t {
  Auto,       // the planner picks per unit (selective or full) what the budget needs, cheapest first
  None,       // never
  Selective,  // Selective on every unit that supports it
  Full,       // the strongest level every unit supports (Full, else Selective)
};

inline std::span<const PolicyName<OffloadPolicy>> policy_names(OffloadPolicy) {
  static constexpr PolicyName<OffloadPolicy> kNames[] = {
      {OffloadPolicy::Auto, "auto"}, {OffloadPolicy::None, "none"}, {OffloadPolicy::All, "all"}};
  return kNames;
}

inline std::span<const PolicyName<RecomputePolicy>> policy_names(RecomputePolicy) {
  static constexpr PolicyName<RecomputePolicy> kNames[] = {{RecomputePolicy::Auto, "auto"},
                                                           {RecomputePolicy::None, "none"},
                                                           {RecomputePolicy::Selective, "selective"},
                                                           {RecomputePolicy::Full, "full"}};
  return kNames;
}

template <class E>
concept Policy = requires(E e) {
  policy_names(e);
};

template <Policy E>
const char* to_string(E e) {
  for (const PolicyName<E>& n : policy_names(E{}))
    if (n.value == e) return n.name;
  return "?";
}

// The policy spelled `text` (exactly, as in the table); nullopt for any other text.
template <Policy E>
std::optional<E> parse_policy(std::string_view text) {
  for (const PolicyName<E>& n : policy_names(E{}))
    if (text == n.name) return n.value;
  return std::nullopt;
}

// "auto|none|all": the names in table order, as a knob's choices are written.
template <Policy E>
std::string policy_choices() {
  std::string out;
  for (const PolicyName<E>& n : policy_names(E{})) out += (out.empty() ? "" : "|") + std::string(n.name);
  return out;
}

}  // namespace stp
