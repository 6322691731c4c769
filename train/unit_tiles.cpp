#include "train/unit_tiles.h"

#include <string>

namespace stp {

UnitTilesSetting unit_tiles_setting(const Config& config) {
  const std::string& v = config.memory.unit_tiles;
  if (v == "auto") return {true, 1};
  return {false, v.empty() ? 1 : std::stoi(v)};
}

std::vector<int> auto_unit_tiles(int micro_batch_size) {
  std::vector<int> out;
  for (int k = 2; k < micro_batch_size; k *= 2)
    if (micro_batch_size % k == 0) out.push_back(k);
  if (micro_batch_size > 1) out.push_back(micro_batch_size);
  return out;
}

}  // namespace stp
