// model.init_from naming a Hugging Face folder: the model keys the YAML leaves out come from its
// config.json; a key given both ways must agree; a config.json feature stp does not implement is
// an error naming it; hf_config_json() reads back as the same model.
#include "config/hf_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"

namespace {

namespace fs = std::filesystem;

const char* kQwen2 = R"({"model_type": "qwen2", "num_hidden_layers": 4, "num_attention_heads": 8,
  "num_key_value_heads": 2, "hidden_size": 64, "intermediate_size": 176, "vocab_size": 300,
  "max_position_embeddings": 32, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu",
  "tie_word_embeddings": true, "use_sliding_window": false, "sliding_window": 4096, "rope_scaling": null})";

std::string folder_with(const std::string& name, const std::string& json) {
  std::string d = std::string(STP_BINARY_DIR) + "/tests/hf_config/" + name;
  fs::create_directories(d);
  std::ofstream(d + "/config.json") << json;
  return d;
}

stp::Config load(const std::string& folder, std::vector<std::string> sets, const std::string& yaml = "") {
  sets.insert(sets.begin(), "parallel.tp=1");
  sets.push_back("model.init_from=" + folder);
  return stp::load_config_from_string(yaml, "<test>", sets);
}

std::string error_of(const std::string& folder, std::vector<std::string> sets, const std::string& yaml = "") {
  try {
    load(folder, std::move(sets), yaml);
  } catch (const stp::Error& e) {
    return e.what();
  }
  return "no error";
}

// qwen2 with `key: value` replacing or added to kQwen2's fields.
std::string qwen2_with(const std::string& key, const std::string& value) {
  std::string j = kQwen2;
  return j.substr(0, j.size() - 1) + ", \"" + key + "\": " + value + "}";
}

TEST(HfConfig, MissingKeysComeFromConfigJson) {
  stp::Config c = load(folder_with("qwen2", kQwen2), {});
  EXPECT_EQ(c.model.arch, "llama");
  EXPECT_EQ(c.model.n_layer, 4);
  EXPECT_EQ(c.model.n_head, 8);
  EXPECT_EQ(c.model.n_kv_head, 2);
  EXPECT_EQ(c.model.n_embd, 64);
  EXPECT_EQ(c.model.intermediate_size, 176);
  EXPECT_EQ(c.model.vocab_size, 300);
  EXPECT_EQ(c.model.seq_len, 32);
  EXPECT_EQ(c.model.rope_theta, 1e6);
  EXPECT_EQ(c.model.norm_eps, 1e-6);
  EXPECT_TRUE(c.model.qkv_bias);
  EXPECT_EQ(c.model.tie_embeddings, "true");
  // A YAML that agrees, and a shorter seq_len, are fine.
  stp::Config d =
      load(folder_with("qwen2", kQwen2), {"model.n_layer=4", "model.seq_len=16"}, "model: {arch: llama, n_kv_head: 2}");
  EXPECT_EQ(d.model.seq_len, 16);
  EXPECT_EQ(d.model.n_embd, 64);
}

TEST(HfConfig, Gpt2KeysComeFromConfigJson) {
  stp::Config c = load(folder_with("gpt2", R"({"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 32,
    "vocab_size": 260, "n_positions": 24, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
    "resid_pdrop": 0.1})"),
                       {});
  EXPECT_EQ(c.model.arch, "gpt2");
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.model.vocab_size, 260);
  EXPECT_EQ(c.model.seq_len, 24);
}

TEST(HfConfig, ContradictionNamesBothValuesAndSources) {
  const std::string q = folder_with("qwen2", kQwen2);
  std::string e = error_of(q, {"model.n_layer=6"});
  EXPECT_NE(e.find("model.n_layer is 6 in the YAML / --set"), std::string::npos) << e;
  EXPECT_NE(e.find("config.json has \"num_hidden_layers\": 4"), std::string::npos) << e;
  e = error_of(q, {}, "model: {arch: gpt2}");
  EXPECT_NE(e.find("model.arch is gpt2"), std::string::npos) << e;
  e = error_of(q, {"model.qkv_bias=false"});
  EXPECT_NE(e.find("model.qkv_bias is false"), std::string::npos) << e;
  e = error_of(q, {"model.rope_theta=10000"});
  EXPECT_NE(e.find("\"rope_theta\": 1000000"), std::string::npos) << e;
  e = error_of(q, {"model.tie_embeddings=false"});
  EXPECT_NE(e.find("\"tie_word_embeddings\": true"), std::string::npos) << e;
  e = error_of(q, {"model.seq_len=64"});
  EXPECT_NE(e.find("exceeds"), std::string::npos) << e;
}

// head_dim against hidden_size / num_attention_heads: no heads is validation's error (model.n_head),
// not a division by zero; a head_dim whose product with the heads overflows is refused as any other
// (found by HfConfigFuzz).
TEST(HfConfig, HeadDimWithNoHeadsOrAHugeValueIsAnError) {
  std::string e = error_of(folder_with("no_heads", R"({"model_type": "llama", "num_hidden_layers": 2,
    "num_attention_heads": 0, "hidden_size": 32, "head_dim": 8, "intermediate_size": 64, "vocab_size": 300})"),
                           {});
  EXPECT_NE(e.find("model.n_head"), std::string::npos) << e;
  e = error_of(folder_with("huge_head_dim", qwen2_with("head_dim", "4611686018427387904")), {});
  EXPECT_NE(e.find("\"head_dim\": 4611686018427387904"), std::string::npos) << e;
  EXPECT_NE(e.find("is not supported by stp"), std::string::npos) << e;
}

TEST(HfConfig, UnsupportedFeaturesAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"rope_scaling", R"({"type": "linear", "factor": 2.0})"},
      {"use_sliding_window", "true"},
      {"hidden_act", "\"gelu\""},
      {"mlp_bias", "true"},
      {"head_dim", "16"},
      {"partial_rotary_factor", "0.5"},
      {"rope_parameters", R"({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0})"},
      {"rope_parameters", R"({"rope_type": "default", "rope_theta": 1000000.0, "factor": 8.0})"},
      {"layer_types", R"(["full_attention", "sliding_attention", "full_attention", "full_attention"])"},
  };
  for (const auto& [key, value] : cases) {
    std::string e = error_of(folder_with("bad_" + key, qwen2_with(key, value)), {});
    EXPECT_NE(e.find("\"" + key + "\""), std::string::npos) << key << ": " << e;
    EXPECT_NE(e.find("is not supported by stp"), std::string::npos) << key << ": " << e;
  }
  std::string llama = R"({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4,
    "hidden_size": 32, "intermediate_size": 64, "vocab_size": 300)";
  for (const std::string extra : {"\"attention_bias\": true", "\"sliding_window\": 128"}) {
    std::string e = error_of(folder_with("bad_llama", llama + ", " + extra + "}"), {});
    EXPECT_NE(e.find(extra.substr(0, extra.find(':'))), std::string::npos) << e;
  }
  std::string e = error_of(folder_with("bad_type", R"({"model_type": "mistral"})"), {});
  EXPECT_NE(e.find("model_type \"mistral\" is not supported"), std::string::npos) << e;
  e = error_of(folder_with("bad_gpt2", R"({"model_type": "gpt2", "activation_function": "relu"})"), {});
  EXPECT_NE(e.find("\"activation_function\": \"relu\""), std::string::npos) << e;
  e = error_of(folder_with("no_config", "{}"), {});
  EXPECT_NE(e.find("config.json has no \"model_type\""), std::string::npos) << e;  // not read as ""
  fs::create_directories(std::string(STP_BINARY_DIR) + "/tests/hf_config/empty");
  e = error_of(std::string(STP_BINARY_DIR) + "/tests/hf_config/empty", {});
  EXPECT_NE(e.find("config.json is missing"), std::string::npos) << e;
}

// transformers 5.x writes the RoPE base inside "rope_parameters" (and no top-level rope_theta);
// reading only the top level would train a Llama 3 folder (500000) with 10000 without a word.
TEST(HfConfig, RopeThetaOfTransformers5IsRead) {
  std::string j = kQwen2;
  const std::string top = "\"rope_theta\": 1000000.0, ";
  j.erase(j.find(top), top.size());
  auto with_params = [&](const std::string& params) {
    return j.substr(0, j.size() - 1) + ", \"rope_parameters\": " + params + "}";
  };
  stp::Config c = load(folder_with("rope5", with_params(R"({"rope_theta": 500000.0, "rope_type": "default"})")), {});
  EXPECT_EQ(c.model.rope_theta, 500000.0);
  c = load(folder_with("rope5_untyped", with_params(R"({"rope_theta": 250000.0})")), {});
  EXPECT_EQ(c.model.rope_theta, 250000.0);
  // Both places, agreeing (what transformers 4.x readers and 5.x writers can leave behind) ...
  c = load(folder_with("rope_both", qwen2_with("rope_parameters", R"({"rope_theta": 1000000.0})")), {});
  EXPECT_EQ(c.model.rope_theta, 1000000.0);
  // ... or not.
  std::string e =
      error_of(folder_with("rope_disagree", qwen2_with("rope_parameters", R"({"rope_theta": 500000.0})")), {});
  EXPECT_NE(e.find("disagree"), std::string::npos) << e;
  e = error_of(folder_with("rope5", with_params(R"({"rope_theta": 500000.0, "rope_type": "default"})")),
               {"model.rope_theta=10000"});
  EXPECT_NE(e.find("\"rope_parameters.rope_theta\": 500000"), std::string::npos) << e;
  EXPECT_NE(e.find("model.rope_theta is 10000"), std::string::npos) << e;
  e = error_of(folder_with("rope5_yarn", with_params(R"({"rope_theta": 500000.0, "rope_type": "yarn"})")), {});
  EXPECT_NE(e.find("\"rope_type\": \"yarn\""), std::string::npos) << e;
  // An all-full-attention layer_types list (Qwen2 as transformers 5 saves it) is accepted.
  c = load(folder_with("layer_types", qwen2_with("layer_types", R"(["full_attention", "full_attention"])")), {});
  EXPECT_EQ(c.model.n_layer, 4);
}

// transformers' generate() stops at eos_token_id, and its config defaults (50256 for gpt2, 1 and
// 2 for llama) would name ordinary tokens of another vocabulary: an imported folder's ids are kept,
// and without them the export writes null (GPT-2's own vocabulary: its <|endoftext|>).
TEST(HfConfig, SpecialTokenIdsAreKeptOrNull) {
  stp::Config c = load(folder_with("tokens", qwen2_with("eos_token_id", "[151643, 151645]")), {});
  nlohmann::json out = nlohmann::json::parse(stp::hf_config_json(c));
  EXPECT_EQ(out["eos_token_id"], nlohmann::json::parse("[151643, 151645]"));
  EXPECT_TRUE(out["bos_token_id"].is_null());
  c = load(folder_with("tokens_bos", qwen2_with("bos_token_id", "7")), {});
  out = nlohmann::json::parse(stp::hf_config_json(c));
  EXPECT_EQ(out["bos_token_id"], 7);
  EXPECT_TRUE(out["eos_token_id"].is_null());
  for (const auto& [yaml, want] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"model: {arch: gpt2, n_layer: 1, n_head: 2, n_embd: 16, vocab_size: 50257, seq_len: 8}", 50256},
           {"model: {arch: gpt2, n_layer: 1, n_head: 2, n_embd: 16, vocab_size: 256, seq_len: 8}", nullptr},
           {"model: {arch: llama, n_layer: 1, n_head: 2, n_embd: 16, intermediate_size: 40, vocab_size: 256, "
            "seq_len: 8}",
            nullptr}}) {
    out = nlohmann::json::parse(stp::hf_config_json(stp::load_config_from_string(yaml, "<t>", {"parallel.tp=1"})));
    EXPECT_EQ(out["bos_token_id"], want) << yaml;
    EXPECT_EQ(out["eos_token_id"], want) << yaml;
  }
}

TEST(HfConfig, TpMustDivideKvHeadsOfTheFolder) {
  std::string e = error_of(folder_with("qwen2", kQwen2), {"parallel.tp=4"});
  EXPECT_NE(e.find("parallel.tp (4) must divide model.n_kv_head (2)"), std::string::npos) << e;
}

TEST(HfConfig, ExportedConfigReadsBackAsTheSameModel) {
  for (const std::string yaml :
       {"model: {arch: llama, n_layer: 3, n_head: 4, n_kv_head: 2, n_embd: 32, intermediate_size: 48, vocab_size: 300, "
        "seq_len: 16, rope_theta: 500000, norm_eps: 1.0e-6, qkv_bias: true, tie_embeddings: true}",
        "model: {arch: llama, n_layer: 2, n_head: 2, n_embd: 16, intermediate_size: 40, vocab_size: 256, seq_len: 8, "
        "tie_embeddings: false}",
        "model: {arch: gpt2, n_layer: 2, n_head: 2, n_embd: 16, vocab_size: 256, seq_len: 8}"}) {
    stp::Config a = stp::load_config_from_string(yaml, "<a>", {"parallel.tp=1"});
    const std::string dir = folder_with("export", stp::hf_config_json(a));
    stp::Config b = load(dir, {});
    b.model.init_from = "";
    if (a.model.n_kv_head == 0 && a.model.arch == "llama") a.model.n_kv_head = a.model.n_head;
    if (a.model.tie_embeddings == "auto" && a.model.arch == "gpt2") b.model.tie_embeddings = "auto";
    EXPECT_EQ(a.to_yaml(), b.to_yaml()) << yaml;
  }
}

}  // namespace

namespace {

// config.json's problems name the file and the key in stp's words, never the JSON library's.
TEST(HfConfig, InvalidJsonNamesTheFileAndPositionWithoutTheLibraryId) {
  const std::string f = folder_with("broken", R"({"model_type": gpt2})");
  std::string e = error_of(f, {});
  EXPECT_NE(e.find(f + "/config.json"), std::string::npos) << e;
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
  EXPECT_NE(e.find("line 1, column"), std::string::npos) << e;
  EXPECT_EQ(e.find("json.exception"), std::string::npos) << e;
}

TEST(HfConfig, MissingModelTypeNamesTheFileAndTheKey) {
  const std::string f = folder_with("no_type", R"({"n_layer": 2, "n_head": 2, "n_embd": 32})");
  std::string e = error_of(f, {});
  EXPECT_NE(e.find(f + "/config.json has no \"model_type\""), std::string::npos) << e;
  EXPECT_NE(e.find("gpt2, llama, qwen2"), std::string::npos) << e;
  EXPECT_EQ(e.find("\"\""), std::string::npos) << "an absent key is not an empty string: " << e;
}

// A value taken from config.json that fails a check is named with its source: the user did not
// write it in the YAML, so the message must say where it came from.
TEST(HfConfig, ChecksOnImportedValuesNameConfigJsonAsTheSource) {
  const std::string f = folder_with("gpt2_bad_heads", R"({"model_type": "gpt2", "n_layer": 2, "n_head": 3,
    "n_embd": 32, "vocab_size": 256, "n_positions": 16})");
  std::string e = error_of(f, {});
  EXPECT_NE(e.find("model.n_embd (32) must be divisible by model.n_head (3)"), std::string::npos) << e;
  EXPECT_NE(e.find("model.n_embd and model.n_head come from " + f + "/config.json (model.init_from)"),
            std::string::npos)
      << e;
  // A key the YAML gave is not attributed to config.json.
  e = error_of(f, {"parallel.tp=2"}, "model: {n_head: 3}");
  EXPECT_NE(e.find("model.n_head"), std::string::npos) << e;
  EXPECT_EQ(e.find("model.n_head comes from"), std::string::npos) << e;
  EXPECT_NE(e.find("model.n_embd comes from " + f + "/config.json"), std::string::npos) << e;
  // The loaded Config says which keys came from the folder.
  stp::Config c = load(folder_with("qwen2", kQwen2), {"model.n_layer=4"});
  EXPECT_EQ(c.model.init_from_keys.count("model.n_head"), 1u);
  EXPECT_EQ(c.model.init_from_keys.count("model.n_layer"), 0u) << "given by --set";
}

}  // namespace
