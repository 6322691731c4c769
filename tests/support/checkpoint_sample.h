// A small checkpoint for the formats tests: two model tensors (a (5, 2) table and a (2) norm) with
// both AdamW moments, and a state whose fields use the extremes of their types.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "formats/checkpoint.h"

namespace stp::testing {

struct CheckpointSample {
  HostTensor wte{{5, 2}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}};
  HostTensor ln{{2}, {1, 1}};
  HostTensor m_wte{{5, 2}, std::vector<float>(10, 0.5f)};
  HostTensor v_wte{{5, 2}, std::vector<float>(10, 0.25f)};
  HostTensor m_ln{{2}, {-1, 1}};
  HostTensor v_ln{{2}, {2, 3}};

  // What write_checkpoint takes for step `step` (views of the tensors above: keep the sample alive).
  CheckpointData data(std::int64_t step) const {
    CheckpointData d;
    d.model = {{"wte.weight", &wte}, {"ln_f.weight", &ln}};
    d.optimizer = {{"wte.weight", {&m_wte, &v_wte}}, {"ln_f.weight", {&m_ln, &v_ln}}};
    d.optimizer_step = step;
    d.state = CheckpointState{
        step, 4096 + std::uint64_t(step), 18446744073709551615ull, 77, "0123456789abcdef", "", std::nullopt};
    return d;
  }
};

}  // namespace stp::testing
