#include "config/hf_config.h"

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "base/error.h"
#include "base/json_fields.h"

namespace stp {
namespace {

using nlohmann::json;

struct Source {
  const json& j;
  std::string file;  // FOLDER/config.json
};

bool present(const json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

std::optional<std::int64_t> get_int(const Source& s, std::initializer_list<const char*> keys, const char** which) {
  for (const char* k : keys) {
    if (!present(s.j, k)) continue;
    const json& v = s.j[k];
    STP_CHECK(v.is_number_integer(), s.file, ": \"", k, "\" must be an integer, not ", v.dump());
    *which = k;
    return v.get<std::int64_t>();
  }
  return std::nullopt;
}

std::optional<double> get_number(const Source& s, const char* key) {
  if (!present(s.j, key)) return std::nullopt;
  const json& v = s.j[key];
  STP_CHECK(v.is_number(), s.file, ": \"", key, "\" must be a number, not ", v.dump());
  return v.get<double>();
}

std::optional<bool> get_bool(const Source& s, const char* key) {
  if (!present(s.j, key)) return std::nullopt;
  const json& v = s.j[key];
  STP_CHECK(v.is_boolean(), s.file, ": \"", key, "\" must be true or false, not ", v.dump());
  return v.get<bool>();
}

std::string get_string(const Source& s, const char* key) {
  if (!present(s.j, key)) return "";
  const json& v = s.j[key];
  STP_CHECK(v.is_string(), s.file, ": \"", key, "\" must be a string, not ", v.dump());
  return v.get<std::string>();
}

[[noreturn]] void unsupported(const Source& s, const std::string& feature, const std::string& why) {
  throw Error(str(s.file, ": ", feature, " is not supported by stp (", why, ")"));
}

// Sets or checks one key. `text` is the config.json value as written in messages.
class Merger {
 public:
  Merger(Config& cfg, const std::set<std::string>& given, const Source& s) : cfg_(cfg), given_(given), s_(s) {}

  void integer(const char* key, int* field, std::int64_t value, const std::string& hf_key) {
    STP_CHECK(value >= 0 && value <= INT32_MAX, s_.file, ": \"", hf_key, "\" ", value, " is out of range for ", key);
    if (!given(key)) take(key, field, static_cast<int>(value));
    else if (*field != value) contradiction(key, std::to_string(*field), hf_key, std::to_string(value));
  }
  void number(const char* key, double* field, double value, const std::string& hf_key) {
    if (!given(key)) take(key, field, value);
    else if (*field != value) contradiction(key, num(*field), hf_key, num(value));
  }
  void boolean(const char* key, bool* field, bool value, const std::string& hf_key) {
    if (!given(key)) take(key, field, value);
    else if (*field != value) contradiction(key, *field ? "true" : "false", hf_key, value ? "true" : "false");
  }
  // tie_embeddings: "auto" given counts as not given.
  void choice(const char* key, std::string* field, const std::string& value, const std::string& hf_key) {
    if (!given(key) || *field == "auto") take(key, field, value);
    else if (*field != value) contradiction(key, *field, hf_key, value);
  }
  bool given(const char* key) const { return given_.count(key) != 0; }
  // Sets `key` from config.json and records it as the key's source.
  template <typename T>
  void take(const char* key, T* field, const T& value) {
    *field = value;
    cfg_.model.init_from_keys.insert(key);
  }

  [[noreturn]] void contradiction(const char* key, const std::string& yaml, const std::string& hf_key,
                                  const std::string& hf) const {
    throw Error(str("config: ", key, " is ", yaml, " in the YAML / --set but ", s_.file, " has \"", hf_key, "\": ", hf,
                    "; remove the key or make them agree"));
  }

 private:
  static std::string num(double v) {
    std::ostringstream o;
    o.precision(17);
    o << v;
    return o.str();
  }
  Config& cfg_;
  const std::set<std::string>& given_;
  const Source& s_;
};

void check_common(const Source& s) {
  if (present(s.j, "rope_scaling")) unsupported(s, "\"rope_scaling\"", "rotary positions are unscaled");
  if (get_bool(s, "use_sliding_window").value_or(false))
    unsupported(s, "\"use_sliding_window\": true", "attention is full causal");
  if (get_bool(s, "add_cross_attention").value_or(false))
    unsupported(s, "\"add_cross_attention\": true", "decoder-only models");
  if (present(s.j, "partial_rotary_factor") && *get_number(s, "partial_rotary_factor") != 1.0)
    unsupported(s, "\"partial_rotary_factor\" other than 1", "rotary positions cover the whole head");
}

// Where the RoPE base comes from: transformers up to 4.x writes "rope_theta" at the top level;
// 5.x writes "rope_parameters": {"rope_theta": ..., "rope_type": "default"} and reads either.
// Only the unscaled "default" type is implemented; any other type or key is named.
struct RopeSource {
  double theta = 10000.0;
  std::string key = "rope_theta";
};

RopeSource rope_theta_of(const Source& s) {
  RopeSource r;
  const std::optional<double> top = get_number(s, "rope_theta");
  if (top) r.theta = *top;
  if (!present(s.j, "rope_parameters")) return r;
  const json& p = s.j["rope_parameters"];
  STP_CHECK(p.is_object(), s.file, ": \"rope_parameters\" must be an object, not ", p.dump());
  for (const auto& [key, value] : p.items()) {
    if (key == "rope_type") {
      STP_CHECK(value.is_string(), s.file, ": \"rope_parameters\".\"rope_type\" must be a string, not ", value.dump());
      if (value.get<std::string>() != "default")
        unsupported(s, str("\"rope_parameters\" with \"rope_type\": ", value.dump()), "rotary positions are unscaled");
    } else if (key == "rope_theta") {
      STP_CHECK(value.is_number(), s.file, ": \"rope_parameters\".\"rope_theta\" must be a number, not ", value.dump());
      const double theta = value.get<double>();
      STP_CHECK(!top || *top == theta, s.file, ": \"rope_theta\" (", *top, ") and \"rope_parameters\".\"rope_theta\" (",
                theta, ") disagree");
      r.theta = theta;
      r.key = "rope_parameters.rope_theta";
    } else if (!value.is_null()) {
      unsupported(s, str("\"rope_parameters\" key \"", key, "\""),
                  "rotary positions are unscaled and cover the whole head");
    }
  }
  return r;
}

// transformers 5.x lists each layer's attention kind; stp implements full causal attention only.
void check_layer_types(const Source& s) {
  if (!present(s.j, "layer_types")) return;
  const json& types = s.j["layer_types"];
  STP_CHECK(types.is_array(), s.file, ": \"layer_types\" must be a list, not ", types.dump());
  for (const json& t : types)
    if (t != "full_attention") unsupported(s, str("\"layer_types\" entry ", t.dump()), "attention is full causal");
}

// The special-token ids stp does not use but an exported folder should keep (transformers'
// generate() stops at eos_token_id): kept as the JSON text of the source folder's values (an id,
// a list of ids or null).
void keep_special_tokens(Config& c, const Source& s) {
  for (auto [key, field] :
       {std::pair{"bos_token_id", &c.model.hf_bos_token_id}, std::pair{"eos_token_id", &c.model.hf_eos_token_id}})
    if (s.j.contains(key)) *field = s.j[key].dump();
}

void merge_gpt2(Merger& m, Config& c, const Source& s) {
  const char* k = nullptr;
  if (auto v = get_int(s, {"n_layer", "num_hidden_layers"}, &k)) m.integer("model.n_layer", &c.model.n_layer, *v, k);
  if (auto v = get_int(s, {"n_head", "num_attention_heads"}, &k)) m.integer("model.n_head", &c.model.n_head, *v, k);
  if (auto v = get_int(s, {"n_embd", "hidden_size"}, &k)) m.integer("model.n_embd", &c.model.n_embd, *v, k);
  if (auto v = get_int(s, {"vocab_size"}, &k)) m.integer("model.vocab_size", &c.model.vocab_size, *v, k);
  if (auto v = get_int(s, {"n_positions", "n_ctx", "max_position_embeddings"}, &k))
    m.integer("model.seq_len", &c.model.seq_len, *v, k);
  if (auto v = get_int(s, {"n_inner"}, &k); v && *v != 4 * static_cast<std::int64_t>(c.model.n_embd))
    unsupported(s, str("\"n_inner\": ", *v), "the GPT-2 MLP is 4 n_embd wide");
  const std::string act = get_string(s, "activation_function");
  if (!act.empty() && act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast")
    unsupported(s, str("\"activation_function\": \"", act, "\""), "GPT-2 uses the tanh GELU: gelu_new");
  if (auto eps = get_number(s, "layer_norm_epsilon"); eps && *eps != 1e-5)
    unsupported(s, str("\"layer_norm_epsilon\": ", *eps), "GPT-2's LayerNorm epsilon is 1e-5");
  if (!get_bool(s, "scale_attn_weights").value_or(true))
    unsupported(s, "\"scale_attn_weights\": false", "attention scores are scaled by 1/sqrt(head dim)");
  if (get_bool(s, "scale_attn_by_inverse_layer_idx").value_or(false))
    unsupported(s, "\"scale_attn_by_inverse_layer_idx\": true", "attention scores are scaled by 1/sqrt(head dim) only");
  if (!get_bool(s, "tie_word_embeddings").value_or(true))
    unsupported(s, "\"tie_word_embeddings\": false", "the GPT-2 head is the token embedding");
}

void merge_llama(Merger& m, Config& c, const Source& s, bool qwen2) {
  const char* k = nullptr;
  if (auto v = get_int(s, {"num_hidden_layers"}, &k)) m.integer("model.n_layer", &c.model.n_layer, *v, k);
  const char* heads_key = nullptr;
  auto heads = get_int(s, {"num_attention_heads"}, &heads_key);
  if (heads) m.integer("model.n_head", &c.model.n_head, *heads, heads_key);
  auto hidden = get_int(s, {"hidden_size"}, &k);
  if (hidden) m.integer("model.n_embd", &c.model.n_embd, *hidden, k);
  if (auto v = get_int(s, {"vocab_size"}, &k)) m.integer("model.vocab_size", &c.model.vocab_size, *v, k);
  if (auto v = get_int(s, {"intermediate_size"}, &k))
    m.integer("model.intermediate_size", &c.model.intermediate_size, *v, k);
  if (auto v = get_int(s, {"num_key_value_heads"}, &k)) m.integer("model.n_kv_head", &c.model.n_kv_head, *v, k);
  else if (heads) m.integer("model.n_kv_head", &c.model.n_kv_head, *heads, "num_attention_heads");
  const RopeSource rope = rope_theta_of(s);
  m.number("model.rope_theta", &c.model.rope_theta, rope.theta, rope.key);
  if (auto v = get_number(s, "rms_norm_eps")) m.number("model.norm_eps", &c.model.norm_eps, *v, "rms_norm_eps");
  m.choice("model.tie_embeddings", &c.model.tie_embeddings,
           get_bool(s, "tie_word_embeddings").value_or(false) ? "true" : "false", "tie_word_embeddings");
  m.boolean("model.qkv_bias", &c.model.qkv_bias, qwen2, "model_type");
  if (auto v = get_int(s, {"max_position_embeddings"}, &k)) {
    if (!m.given("model.seq_len")) m.take("model.seq_len", &c.model.seq_len, static_cast<int>(*v));
    else
      STP_CHECK(c.model.seq_len <= *v, "config: model.seq_len ", c.model.seq_len, " exceeds ", s.file,
                "'s \"max_position_embeddings\": ", *v);
  }
  const std::string act = get_string(s, "hidden_act");
  if (!act.empty() && act != "silu") unsupported(s, str("\"hidden_act\": \"", act, "\""), "the gated MLP uses silu");
  if (get_bool(s, "attention_bias").value_or(false))
    unsupported(s, "\"attention_bias\": true",
                "llama's attention projections have no biases (Qwen2: model_type qwen2)");
  if (get_bool(s, "mlp_bias").value_or(false)) unsupported(s, "\"mlp_bias\": true", "MLP projections have no biases");
  if (!qwen2 && present(s.j, "sliding_window")) unsupported(s, "\"sliding_window\"", "attention is full causal");
  // No heads: validation refuses model.n_head 0. Compared by division, not head_dim * heads, which
  // can overflow.
  if (auto hd = get_int(s, {"head_dim"}, &k);
      hd && heads && hidden && *heads > 0 && (*hidden % *heads != 0 || *hd != *hidden / *heads))
    unsupported(s, str("\"head_dim\": ", *hd, " (hidden_size / num_attention_heads = ", *hidden / *heads, ")"),
                "the head dimension is hidden_size / num_attention_heads");
}

}  // namespace

void merge_hf_config(Config& cfg, const std::set<std::string>& given, const std::string& folder) {
  const std::string file = (std::filesystem::path(folder) / "config.json").string();
  std::error_code ec;
  STP_CHECK(std::filesystem::is_regular_file(file, ec), "model.init_from: the folder '", folder,
            "' is not a Hugging Face model folder: config.json is missing");
  std::ifstream f(file, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(str(file, " is not valid JSON: ", json_error_text(e)));
  }
  STP_CHECK(j.is_object(), file, " must hold a JSON object");
  Source s{j, file};
  STP_CHECK(present(j, "model_type"), file,
            " has no \"model_type\": stp reads the other keys by it; add the one the model is (supported: gpt2, "
            "llama, qwen2)");
  const std::string type = get_string(s, "model_type");
  STP_CHECK(type == "gpt2" || type == "llama" || type == "qwen2", file, ": model_type \"", type,
            "\" is not supported by stp (supported: gpt2, llama, qwen2)");
  Merger m(cfg, given, s);
  m.choice("model.arch", &cfg.model.arch, type == "gpt2" ? "gpt2" : "llama", "model_type");
  check_common(s);
  check_layer_types(s);
  keep_special_tokens(cfg, s);
  if (type == "gpt2") merge_gpt2(m, cfg, s);
  else merge_llama(m, cfg, s, type == "qwen2");
}

std::string with_init_from_sources(const Config& cfg, const std::string& message) {
  // A key is named when it stands in the message as a whole word ("model.n_head", not a part of
  // a longer name).
  auto names = [&](const std::string& key) {
    auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; };
    for (std::size_t at = message.find(key); at != std::string::npos; at = message.find(key, at + 1)) {
      const std::size_t end = at + key.size();
      if ((at == 0 || !word(message[at - 1])) &&
          (end == message.size() || !word(message[end]) ||
           (message[end] == '.' && (end + 1 == message.size() || !word(message[end + 1])))))
        return true;
    }
    return false;
  };
  std::vector<std::string> named;
  for (const std::string& key : cfg.model.init_from_keys)
    if (names(key)) named.push_back(key);
  if (named.empty()) return message;
  std::string list;
  for (std::size_t i = 0; i < named.size(); ++i)
    list += (i == 0 ? "" : i + 1 == named.size() ? " and " : ", ") + named[i];
  return str(message, "; ", list, named.size() == 1 ? " comes" : " come", " from ",
             (std::filesystem::path(cfg.model.init_from) / "config.json").string(), " (model.init_from)");
}

std::string hf_config_json(const Config& cfg) {
  const ModelConfig& m = cfg.model;
  nlohmann::ordered_json j;
  if (m.arch == "gpt2") {
    j = {{"architectures", {"GPT2LMHeadModel"}},
         {"model_type", "gpt2"},
         {"n_layer", m.n_layer},
         {"n_head", m.n_head},
         {"n_embd", m.n_embd},
         {"n_positions", m.seq_len},
         {"n_ctx", m.seq_len},
         {"vocab_size", m.vocab_size},
         {"n_inner", nullptr},
         {"activation_function", "gelu_new"},
         {"layer_norm_epsilon", 1e-5},
         {"resid_pdrop", 0.0},
         {"embd_pdrop", 0.0},
         {"attn_pdrop", 0.0},
         {"tie_word_embeddings", true},
         {"torch_dtype", "float32"}};
  } else {
    const bool qwen2 = m.qkv_bias;
    j = {{"architectures", {qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
         {"model_type", qwen2 ? "qwen2" : "llama"},
         {"num_hidden_layers", m.n_layer},
         {"num_attention_heads", m.n_head},
         {"num_key_value_heads", m.n_kv_head > 0 ? m.n_kv_head : m.n_head},
         {"hidden_size", m.n_embd},
         {"intermediate_size", m.intermediate_size},
         {"vocab_size", m.vocab_size},
         {"max_position_embeddings", m.seq_len},
         {"rope_theta", m.rope_theta},
         {"rope_scaling", nullptr},
         {"rms_norm_eps", m.norm_eps},
         {"hidden_act", "silu"},
         {"tie_word_embeddings", m.tie_embeddings == "true"},
         {"attention_dropout", 0.0},
         {"torch_dtype", "float32"}};
    if (qwen2) j["use_sliding_window"] = false;
    else {
      j["attention_bias"] = false;
      j["mlp_bias"] = false;
    }
  }
  // Without ids from an imported folder: GPT-2's <|endoftext|> for its 50257-token vocabulary,
  // else null, so that transformers' defaults (50256 for gpt2, 1 and 2 for llama) are not read as
  // ids of a vocabulary stp trained without them.
  const bool gpt2_vocab = m.arch == "gpt2" && m.vocab_size == 50257;
  const json fallback = gpt2_vocab ? json(50256) : json(nullptr);
  j["bos_token_id"] = m.hf_bos_token_id.empty() ? fallback : json::parse(m.hf_bos_token_id);
  j["eos_token_id"] = m.hf_eos_token_id.empty() ? fallback : json::parse(m.hf_eos_token_id);
  return j.dump(2) + "\n";
}

}  // namespace stp
