// The model registry: every architecture stp trains, by the name model.arch selects. train/, the
// planner and the tools build stages through it and then talk only to the Stage interface
// (models/stage.h); nothing outside models/ names an architecture.
//
// Adding an architecture (docs/model.md, Adding an architecture): its own files under models/
// (a Stage implementation, its parameter table) and one line in registry.cpp's table.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "models/model_spec.h"
#include "models/stage.h"

namespace stp {

struct Architecture {
  const char* name;  // model.arch
  // Throws stp::Error naming the keys when the model or the split is invalid (tp not dividing
  // the heads, ...).
  void (*validate)(const ModelSpec& model, const StageSpec& spec);
  // Name, full shape, flags and shard layout of every parameter of the stage, in a fixed order;
  // param/grad left undefined (what a checkpoint gather needs without building the stage).
  std::vector<ParamInfo> (*param_table)(const ModelSpec& model, const StageSpec& spec);
  // The stage on `alloc`'s device (alloc must outlive it).
  std::unique_ptr<Stage> (*make_stage)(const ModelSpec& model, const StageSpec& spec, Allocator& alloc);
};

// The architecture named `name`; throws stp::Error listing the known names when there is none.
const Architecture& find_architecture(const std::string& name);
std::vector<std::string> architecture_names();

// Shorthands through find_architecture(model.arch).
void validate_model(const ModelSpec& model, const StageSpec& spec);
std::vector<ParamInfo> model_param_table(const ModelSpec& model, const StageSpec& spec);
std::unique_ptr<Stage> make_stage(const ModelSpec& model, const StageSpec& spec, Allocator& alloc);

// Each architecture's entry (defined in its own files).
const Architecture& gpt2_architecture();
const Architecture& llama_architecture();

}  // namespace stp
