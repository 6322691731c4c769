#include "train/loss_chunk.h"

#include <string>

namespace stp {

LossChunkSetting loss_chunk_setting(const Config& config) {
  const std::string& v = config.model.loss_chunk_tokens;
  if (v == "auto") return {true, 0};
  if (v == "none" || v.empty()) return {false, 0};
  return {false, std::stoll(v)};
}

std::vector<std::int64_t> auto_loss_chunks(std::int64_t microbatch_tokens) {
  std::vector<std::int64_t> out;
  for (std::int64_t c = microbatch_tokens / 2; c >= kMinAutoLossChunk; c /= 2) out.push_back(c);
  return out;
}

}  // namespace stp
