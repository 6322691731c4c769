// model.loss_chunk_tokens (docs/memory.md, Chunked loss head): the setting, and the chunk sizes
// `auto` tries. The memory planner (train/memory_planning.cpp) resolves it into
// RankPlan::loss_chunk_tokens, which the trainer hands to its last stages
// (Stage::set_loss_chunk_tokens).
#pragma once

#include <cstdint>
#include <vector>

#include "config/config.h"

namespace stp {

// The setting: automatic (auto: the planner decides), or a fixed number of tokens per chunk (0 =
// none: the unchunked head). The config is validated (config/config_validate.cpp).
struct LossChunkSetting {
  bool automatic = false;
  std::int64_t tokens = 0;
};
LossChunkSetting loss_chunk_setting(const Config& config);

// The chunks `auto` tries, largest first, when the unchunked plan does not fit the budget: T·B/2,
// T·B/4, ... (integer division) while at least kMinAutoLossChunk tokens; empty when a microbatch
// has fewer than twice that many (a smaller chunk saves too little against its smaller GEMMs).
constexpr std::int64_t kMinAutoLossChunk = 128;
std::vector<std::int64_t> auto_loss_chunks(std::int64_t microbatch_tokens);

}  // namespace stp
