// memory.unit_tiles (docs/memory.md, Tiled unit backward): the setting, and the tilings `auto`
// tries. The memory planner (train/memory_planning.cpp) resolves it into RankPlan::unit_tiles,
// which the trainer hands to its stages (Stage::set_unit_tiles).
#pragma once

#include <vector>

#include "config/config.h"

namespace stp {

// The setting: automatic (auto: the planner decides), or a fixed number of sequence groups (1 =
// untiled). The config is validated (config/config_validate.cpp).
struct UnitTilesSetting {
  bool automatic = false;
  int tiles = 1;
};
UnitTilesSetting unit_tiles_setting(const Config& config);

// The tilings `auto` tries, fewest first, when the untiled plan does not fit the budget: 2, 4, 8,
// ... that divide micro_batch_size, and micro_batch_size itself (one sequence per group) last;
// empty when micro_batch_size is 1.
std::vector<int> auto_unit_tiles(int micro_batch_size);

}  // namespace stp
