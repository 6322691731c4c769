#include "models/registry.h"

#include "base/error.h"

namespace stp {
namespace {

// One line per architecture.
const std::vector<const Architecture*>& table() {
  static const std::vector<const Architecture*> t = {
      &gpt2_architecture(),
      &llama_architecture(),
  };
  return t;
}

}  // namespace

std::vector<std::string> architecture_names() {
  std::vector<std::string> out;
  for (const Architecture* a : table()) out.emplace_back(a->name);
  return out;
}

const Architecture& find_architecture(const std::string& name) {
  for (const Architecture* a : table())
    if (name == a->name) return *a;
  std::string known;
  for (const std::string& n : architecture_names()) known += (known.empty() ? "" : "|") + n;
  throw Error(str("model.arch: unknown architecture '", name, "' (known: ", known, ")"));
}

void validate_model(const ModelSpec& model, const StageSpec& spec) {
  find_architecture(model.arch).validate(model, spec);
}

std::vector<ParamInfo> model_param_table(const ModelSpec& model, const StageSpec& spec) {
  return find_architecture(model.arch).param_table(model, spec);
}

std::unique_ptr<Stage> make_stage(const ModelSpec& model, const StageSpec& spec, Allocator& alloc) {
  return find_architecture(model.arch).make_stage(model, spec, alloc);
}

double model_forward_flops_per_token(const ModelSpec& model) {
  const Architecture& a = find_architecture(model.arch);
  return 2 * a.matmul_params(model) + a.attention_flops_per_token(model);
}

double model_training_flops_per_token(const ModelSpec& model) { return 3 * model_forward_flops_per_token(model); }

}  // namespace stp
