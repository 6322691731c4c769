// The model registry: every architecture stp trains, by the name model.arch selects. train/, the
// planner and the tools build stages through it and then talk only to the Stage interface
// (models/stage.h); nothing outside models/ names an architecture. What depends on the shape of an
// architecture's blocks — model FLOPs, the planner's per-unit compute, parameter counts for the
// communication volume — is the architecture's own arithmetic, asked for here too.
//
// Adding an architecture (docs/model.md, Adding an architecture): its own files under models/
// (a Stage implementation, its parameter table, models/<arch>_arch.cpp with the entry and its
// arithmetic) and one line in registry.cpp's table.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "models/model_spec.h"
#include "models/stage.h"

namespace stp {

// Parameter elements one TP rank of a stage holds (models/param_store.h), vocab padding rows
// included: `all` of them, and the `movable` ones — the GEMM weights whose f32 master no device
// kernel reads, so that at bf16 precision only their bf16 copy stays on the device when masters go
// to the host (StageSpec::host_masters) or are sharded over the dp ranks (StageSpec::shard_masters).
struct StageParamCount {
  std::int64_t all = 0, movable = 0;
};

// Every function takes a model (and split) that validate accepts. The arithmetic is analytic (no
// stage is built) and must agree with the architecture's parameter table and units:
// tests/models/arch_arithmetic_test.cpp counts each one independently.
struct Architecture {
  const char* name;  // model.arch
  // The LM head is the token embedding unless the configuration says otherwise
  // (model.tie_embeddings: auto).
  bool tie_embeddings_default;
  // Throws stp::Error naming the keys when the model or the split is invalid (tp not dividing
  // the heads, ...).
  void (*validate)(const ModelSpec& model, const StageSpec& spec);
  // Name, full shape, flags and shard layout of every parameter of the stage, in a fixed order;
  // param/grad left undefined (what a checkpoint gather needs without building the stage).
  std::vector<ParamInfo> (*param_table)(const ModelSpec& model, const StageSpec& spec);
  // The stage on `alloc`'s device (alloc must outlive it).
  std::unique_ptr<Stage> (*make_stage)(const ModelSpec& model, const StageSpec& spec, Allocator& alloc);

  // ---- arithmetic ----------------------------------------------------------------------------------
  // N: the parameters one token's matrix multiplies use in the whole model — every parameter but
  // the lookup-only embeddings (positions, an untied token embedding); the LM head's weight counts
  // once, tied or not.
  double (*matmul_params)(const ModelSpec& model);
  // Forward FLOPs per token of attention's scores and weighted values, over the full T x T (the
  // causal mask's half not subtracted, as PaLM's MFU counts).
  double (*attention_flops_per_token)(const ModelSpec& model);
  // Forward FLOPs of one unit of kind `kind` of the stage, for one microbatch on one TP rank, the
  // planner's compute time (train/memory_planning.h): GEMMs at 2 FLOPs per multiply-add, the
  // attention core as the kernel of model.attention computes it, elementwise units at B·T·C.
  double (*unit_flops)(const ModelSpec& model, const StageSpec& spec, UnitKind kind);
  // Elements of the final norm's parameters: the head's weight-gradient partials that vocab
  // parallelism all-reduces.
  std::int64_t (*final_norm_params)(const ModelSpec& model);
  // The parameters one TP rank of the stage holds (StageParamCount).
  StageParamCount (*stage_params)(const ModelSpec& model, const StageSpec& spec);
};

// The architecture named `name`; throws stp::Error listing the known names when there is none.
const Architecture& find_architecture(const std::string& name);
std::vector<std::string> architecture_names();

// Shorthands through find_architecture(model.arch).
void validate_model(const ModelSpec& model, const StageSpec& spec);
std::vector<ParamInfo> model_param_table(const ModelSpec& model, const StageSpec& spec);
std::unique_ptr<Stage> make_stage(const ModelSpec& model, const StageSpec& spec, Allocator& alloc);

// Model FLOPs per token (the MFU metric's numerator): forward = 2·N + attention (2 FLOPs per
// multiply-add); training = 3 × forward (the forward GEMMs and the two of the backward).
// Recomputation is not counted: model FLOPs, not hardware FLOPs.
double model_forward_flops_per_token(const ModelSpec& model);
double model_training_flops_per_token(const ModelSpec& model);

// Each architecture's entry (defined in its models/<arch>_arch.cpp).
const Architecture& gpt2_architecture();
const Architecture& llama_architecture();

}  // namespace stp
