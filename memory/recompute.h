// Activation recomputation (checkpointing) levels of one unit, chosen by the planner
// (memory/planner.h) and carried out by the model (models/stage.h: Stage::set_recompute).
#pragma once

#include <cstdint>

namespace stp {

enum class Recompute : std::uint8_t {
  None,       // keep every record between F and B
  Selective,  // drop what no GEMM with the unit's weights regenerates: LayerNorm output, attention
              // output and core records (probabilities or log-sum-exp), GELU output
  Full,       // keep only the unit's input; re-run its forward before B
};

inline const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "?";
}

}  // namespace stp
