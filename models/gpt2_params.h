// The parameters of one GPT-2 stage: HF names, full shapes, how each TP rank's shard maps into the
// full tensor, and one flat device buffer each for parameters and gradients (zeroing grads is one
// memset; views per tensor).
//
// Tensor parallelism (Megatron, no sequence parallelism), TP rank r of t, Cl = C/t, H = n_head/t:
//   c_attn.weight [C, 3C]  column-parallel per section: columns [r*Cl, (r+1)*Cl) of each of q, k, v
//                          -> local [C, 3*Cl] laid out [q_r | k_r | v_r] (local heads r*H..r*H+H-1)
//   c_attn.bias   [3C]     the same three slices
//   attn.c_proj.weight [C, C]   row-parallel: rows [r*Cl, (r+1)*Cl) -> [Cl, C]
//   mlp.c_fc.weight [C, 4C]     column-parallel: columns [r*4Cl, (r+1)*4Cl) -> [C, 4Cl]; bias alike
//   mlp.c_proj.weight [4C, C]   row-parallel: rows [r*4Cl, (r+1)*4Cl) -> [4Cl, C]
//   c_proj biases, LayerNorms, wte, wpe: replicated (every rank holds the full tensor).
// The embedding and the LM head are replicated and computed identically on every TP rank (see
// docs/model.md): exact, no vocab-parallel cross-entropy, at the price of duplicated head FLOPs.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/gpt2_config.h"
#include "models/stage.h"

namespace stp {

// Name, full shape, flags and shard layout of every parameter of the stage, in a fixed order
// (embedding, layers in order, ln_f). param/grad are left undefined.
std::vector<ParamInfo> gpt2_param_table(const GPT2Config& config, const GPT2StageSpec& spec);

// The parameters of a stage on one device.
class GPT2Params {
 public:
  GPT2Params(const GPT2Config& config, const GPT2StageSpec& spec, Allocator& alloc);

  std::vector<ParamInfo>& list() { return params_; }
  ParamInfo& at(const std::string& name);  // asserts the name exists
  bool has(const std::string& name) const;
  const Tensor& flat_params() const { return flat_params_; }
  const Tensor& flat_grads() const { return flat_grads_; }

  // Seeded GPT-2 init (normal(0, 0.02); c_proj weights 0.02/sqrt(2*n_layer); biases 0; LN 1/0).
  // Each full tensor is drawn from its own stream keyed by (seed, name) and then sharded, so
  // every TP and PP split sees the same model. Synchronizes s.
  void init_random(std::uint64_t seed, Stream& s);
  // Copies a full host tensor (HF layout) into this rank's shard. Synchronizes s.
  void load_full(const std::string& name, const std::vector<float>& full, Stream& s);
  // Rounds the f32 masters into their bf16 GEMM copies (ParamInfo::compute), in stream order on
  // s; no-op at f32 precision, where `compute` is the master itself. The stage calls it in
  // zero_grads, at the start of every step, so loads and optimizer steps before it are seen.
  void refresh_compute(Stream& s);

 private:
  std::vector<ParamInfo> params_;
  int n_layer_;
  std::map<std::string, std::size_t> index_;
  Tensor flat_params_, flat_grads_;
  Tensor flat_compute_;  // bf16 copies of the GEMM weights (bf16 precision only)
};

}  // namespace stp
