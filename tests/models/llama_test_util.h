// Helpers of the Llama model tests: the reference files of tools/reference/gen_llama_reference.py (one per
// variant), their model and batch, and a stage of any architecture over emulated TP ranks
// (tests/models/model_test_util.h has the rest).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "models/registry.h"
#include "tests/models/model_test_util.h"

namespace stp::testing {

// tests/models/data/llama_<variant>_ref without the extension (.bin, .safetensors).
inline std::string llama_reference_path(const std::string& variant) {
  return std::string(STP_SOURCE_DIR) + "/tests/models/data/llama_" + variant + "_ref";
}

inline const RefFile& llama_reference(const std::string& variant) {
  static std::map<std::string, RefFile> cache;
  auto it = cache.find(variant);
  if (it == cache.end()) it = cache.emplace(variant, read_reference(llama_reference_path(variant) + ".bin")).first;
  return it->second;
}

// The model of a reference file (config tensor layout in tools/reference/gen_llama_reference.py).
inline ModelSpec llama_reference_model(const RefFile& ref, AttentionKernel attention = AttentionKernel::Naive) {
  const auto& c = ref.at("config").data;
  ModelSpec m;
  m.arch = "llama";
  m.n_layer = static_cast<int>(c[0]);
  m.n_head = static_cast<int>(c[1]);
  m.n_kv_head = static_cast<int>(c[2]);
  m.n_embd = static_cast<int>(c[3]);
  m.intermediate_size = static_cast<int>(c[4]);
  m.vocab_size = static_cast<int>(c[5]);
  m.seq_len = static_cast<int>(c[6]);
  m.rope_theta = c[9];
  m.norm_eps = c[10];
  m.qkv_bias = c[11] != 0;
  m.tie_embeddings = c[12] != 0;
  m.attention = attention;
  return m;
}
inline int llama_reference_batch(const RefFile& ref) { return static_cast<int>(ref.at("config").data[7]); }

// One stage (any architecture) on `tp` emulated TP ranks.
class TpGroup : public TpStages<Stage> {
 public:
  TpGroup(const ModelSpec& model, StageSpec spec, int tp)
      : TpStages(spec, tp, [model](const StageSpec& s, Allocator& a) { return make_stage(model, s, a); }) {}
};

}  // namespace stp::testing
