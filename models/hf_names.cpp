#include "models/hf_names.h"

#include "base/error.h"
#include "models/registry.h"

namespace stp {
namespace {

// The full model's parameter table: one stage holding every layer, TP 1.
std::vector<ParamInfo> whole_model(const ModelSpec& model) {
  StageSpec spec;
  spec.layer_begin = 0;
  spec.layer_end = model.n_layer;
  return model_param_table(model, spec);
}

bool ends_with(const std::string& s, std::string_view suffix) { return std::string_view(s).ends_with(suffix); }

// "model.layers.0.self_attn.qkv_proj.weight" with "qkv_proj" -> "model.layers.0.self_attn.q_proj.weight"
std::string replace(const std::string& name, const std::string& from, const std::string& to) {
  std::size_t at = name.rfind(from);
  STP_ASSERT(at != std::string::npos, "hf_names: '", name, "' lacks '", from, "'");
  return name.substr(0, at) + to + name.substr(at + from.size());
}

HfTensorRule identity(const ParamInfo& p) {
  const std::int64_t cols = p.full_shape.back();
  return {p.name, p.full_shape, {{p.name, 0, cols, false}}};
}

// Splits the columns of `p` into sections named `names` of widths `widths`.
HfTensorRule split(const ParamInfo& p, const std::string& fused, const std::vector<std::string>& names,
                   const std::vector<std::int64_t>& widths, bool transpose) {
  HfTensorRule r{p.name, p.full_shape, {}};
  std::int64_t at = 0;
  for (std::size_t i = 0; i < names.size(); ++i) {
    r.parts.push_back({replace(p.name, fused, names[i]), at, at + widths[i], transpose});
    at += widths[i];
  }
  STP_ASSERT(at == p.full_shape.back(), "hf_names: sections of '", p.name, "' do not cover it");
  return r;
}

std::vector<HfTensorRule> llama_rules(const ModelSpec& m) {
  const std::int64_t D = m.n_embd / m.n_head, QW = m.n_head * D, KW = m.n_kv_head * D, I = m.intermediate_size;
  std::vector<HfTensorRule> out;
  for (const ParamInfo& p : whole_model(m)) {
    const bool weight = p.full_shape.size() == 2;
    if (ends_with(p.name, "qkv_proj.weight") || ends_with(p.name, "qkv_proj.bias"))
      out.push_back(split(p, "qkv_proj", {"q_proj", "k_proj", "v_proj"}, {QW, KW, KW}, weight));
    else if (ends_with(p.name, "gate_up_proj.weight"))
      out.push_back(split(p, "gate_up_proj", {"gate_proj", "up_proj"}, {I, I}, true));
    else if (ends_with(p.name, "o_proj.weight") || ends_with(p.name, "down_proj.weight"))
      out.push_back({p.name, p.full_shape, {{p.name, 0, p.full_shape.back(), true}}});
    else out.push_back(identity(p));
  }
  return out;
}

}  // namespace

std::vector<HfTensorRule> hf_tensor_rules(const ModelSpec& model) {
  if (model.arch == "llama") return llama_rules(model);
  std::vector<HfTensorRule> out;
  for (const ParamInfo& p : whole_model(model)) out.push_back(identity(p));
  return out;
}

}  // namespace stp
