// Sampling text from a checkpoint (`stp generate`): the model is rebuilt from the run's stored
// config on one CPU device as a single stage (every layer, tp = 1), its parameters loaded from
// CHECKPOINT/model.safetensors, and driven through the Stage interface (models/stage.h): F of
// every unit in order, then the last unit's "logits" record (B = 1, T, V) is read.
//
// The stored config: CHECKPOINT/config.yaml, else the run's RUN_DIR/config.yaml next to the
// checkpoint (what `stp train` writes); its config_fingerprint must equal the checkpoint's.
// CHECKPOINT may end in '/' (as a shell completes a folder).
// Precision is f32 (the checkpoint holds the f32 masters) whatever the run trained in.
//
// No KV cache: each new token runs one forward over the window of the last min(n, T) tokens (T =
// model.seq_len, right-padded; causal attention makes the padding invisible to the positions
// read), so N new tokens cost N forwards of T positions, about 2 · N · (params + L · C · T) · T
// FLOPs. Past T tokens the window slides (the model never saw positions beyond T).
//
// Sampling of each token from the logits z at the last position: temperature 0 = argmax; else
// keep the top_k largest (0 = all; ties by lower id), p_i ∝ exp((z_i − max z) / temperature),
// draw u = (x >> 11) · 2^-53 from std::mt19937_64(seed) (one draw per token) and pick the first id
// whose cumulative probability (in id order over the kept ids) exceeds u · total. Same checkpoint,
// prompt and options: the same tokens (the CPU kernels are deterministic).
//
// Errors (stp::Error): unreadable checkpoint, missing or mismatched config, a parameter that is not
// finite (naming the tensor), an empty prompt, a prompt longer than T, a token id >= vocab_size,
// tokens < 1, temperature < 0, top_k < 0; and logits that are not finite (parameters that overflow
// in the forward), before a token is drawn from them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"

namespace stp {

struct SampleOptions {
  int tokens = 200;          // new tokens
  double temperature = 1.0;  // 0 = greedy
  int top_k = 0;             // 0 = the whole vocabulary
  std::uint64_t seed = 0;
};

class Generator {
 public:
  explicit Generator(const std::string& checkpoint_dir);
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  const Config& config() const;  // the run's config, as stored

  // Returns the new tokens (not the prompt); `on_token` sees each one as it is drawn.
  std::vector<std::int32_t> sample(const std::vector<std::int32_t>& prompt, const SampleOptions& options,
                                   const std::function<void(std::int32_t)>& on_token = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The sampling rule above, on one row of logits (exposed for tests).
std::int32_t sample_token(const std::vector<float>& logits, double temperature, int top_k, std::uint64_t draw);

}  // namespace stp
