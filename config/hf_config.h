// Hugging Face config.json <-> the model keys of a Config (docs/model.md, Hugging Face models).
//
// Import (merge_hf_config): for model.init_from naming an HF model folder, every model key the
// YAML (or --set) leaves out is taken from FOLDER/config.json; a key given both ways must agree,
// else an stp::Error names the key, both values and both sources. The mapping:
//   model_type gpt2 -> model.arch gpt2; llama, qwen2 -> model.arch llama
//   n_layer | num_hidden_layers      -> model.n_layer
//   n_head | num_attention_heads     -> model.n_head
//   n_embd | hidden_size             -> model.n_embd
//   vocab_size                       -> model.vocab_size
//   num_key_value_heads              -> model.n_kv_head (absent or null: num_attention_heads)
//   intermediate_size, rope_theta    -> the same keys (rope_theta absent: 10000; transformers 5
//                                       writes it as rope_parameters.rope_theta, read too)
//   rms_norm_eps                     -> model.norm_eps
//   tie_word_embeddings              -> model.tie_embeddings (absent: false for llama/qwen2)
//   qwen2                            -> model.qkv_bias true; llama -> false
//   gpt2: n_positions (or n_ctx)     -> model.seq_len (GPT-2 learns seq_len positions)
//   llama: max_position_embeddings   -> model.seq_len when not given; a larger given seq_len is an error
// A config.json without "model_type" is an error naming the file and the key. A feature stp does
// not implement is an error naming it, never ignored: rope_scaling (non-null),
// a rope_parameters rope_type other than "default" (or another key in it), sliding-window
// attention (also as a layer_types entry other than "full_attention"), attention_bias on llama,
// mlp_bias, another hidden_act than silu (llama) or the tanh GELU (gpt2), head_dim !=
// hidden_size / num_attention_heads, partial_rotary_factor != 1, an untied gpt2, n_inner != 4
// n_embd, layer_norm_epsilon != 1e-5, scale_attn_weights false, scale_attn_by_inverse_layer_idx,
// cross-attention, an unknown model_type. Dropout probabilities are not applied (stp trains
// without dropout).
//
// bos_token_id and eos_token_id are not used by stp; import keeps them and export writes them back
// (absent on import: 50256 for a gpt2 model with GPT-2's 50257-token vocabulary, else null).
//
// Export (hf_config_json): the config.json of a checkpoint folder, read back by import and by
// transformers' AutoConfig (checked against transformers 5.17: docs/model.md).
#pragma once

#include <set>
#include <string>

#include "config/config.h"

namespace stp {

// Merges FOLDER/config.json into `cfg`; `given` holds the keys the YAML or --set set. The keys it
// fills are listed in cfg.model.init_from_keys.
void merge_hf_config(Config& cfg, const std::set<std::string>& given, const std::string& folder);

// `message` (about cfg's values), followed by the source of each key it names that
// model.init_from's config.json gave, which the user may never have read:
//   "config: model.n_embd (32) must be divisible by model.n_head (3); model.n_embd and
//    model.n_head come from hf/config.json (model.init_from)"
std::string with_init_from_sources(const Config& cfg, const std::string& message);

// config.json text for the model of `cfg` (resolved defaults).
std::string hf_config_json(const Config& cfg);

}  // namespace stp
