// A bounded, deterministic fuzz of the Hugging Face config.json reader (config/hf_config.h) through
// the path `stp train` takes (load_config with model.init_from naming the folder, then validation):
// seeded random mutations of a valid gpt2, llama and qwen2 config.json — a value replaced by one a
// reader must weigh (integers at and past every limit, zero, negatives, other types and names), a
// key removed or added, bytes flipped, the text cut or a slice spliced elsewhere — and random
// JSON-ish text, with and without model keys given in the YAML as well. Each case must either
// load or throw stp::Error; never crash, hang, overflow (UBSan builds check that), over-read (ASan)
// or throw anything else. A config that loads must write a config.json that parses (the export).
// A few thousand cases, a few seconds in a release build; tools/test.sh runs it under ASan too
// (tests/CMakeLists.txt, the readers' fuzz tests).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "config/config.h"
#include "config/hf_config.h"
#include "tests/support/files.h"
#include "tests/support/fuzz_text.h"

using namespace stp;
using nlohmann::json;
using stp::testing::mutate_bytes;
using stp::testing::random_fragments;
using stp::testing::ScratchDir;
using stp::testing::write_bytes;

namespace {

enum class Outcome { Loaded, Error };

Config default_model(const std::string& arch) {
  return load_config_from_string("", "<fuzz>",
                                 {"model.arch=" + arch, "model.n_layer=2", "model.n_head=4", "model.n_embd=32",
                                  "model.vocab_size=300", "model.seq_len=32", "model.intermediate_size=64"});
}

// The config.json stp writes for a small model of each kind (hf_config_json), the seeds; the llama
// and qwen2 ones with "head_dim" as well, as recent transformers releases write it.
std::vector<json> seeds() {
  Config gpt2 = default_model("gpt2"), llama = default_model("llama"), qwen2 = default_model("llama");
  llama.model.n_kv_head = 2;
  qwen2.model.n_kv_head = 2;
  qwen2.model.qkv_bias = true;
  std::vector<json> out = {json::parse(hf_config_json(gpt2)), json::parse(hf_config_json(llama)),
                           json::parse(hf_config_json(qwen2))};
  out[1]["head_dim"] = 8;
  out[2]["head_dim"] = 8;
  return out;
}

// The keys config.json may hold (those the reader maps or refuses), for added keys.
const char* const kKeys[] = {"model_type",
                             "n_layer",
                             "num_hidden_layers",
                             "n_head",
                             "num_attention_heads",
                             "n_embd",
                             "hidden_size",
                             "vocab_size",
                             "n_positions",
                             "n_ctx",
                             "max_position_embeddings",
                             "num_key_value_heads",
                             "intermediate_size",
                             "rope_theta",
                             "rope_parameters",
                             "rope_scaling",
                             "rms_norm_eps",
                             "tie_word_embeddings",
                             "head_dim",
                             "n_inner",
                             "activation_function",
                             "hidden_act",
                             "layer_norm_epsilon",
                             "scale_attn_weights",
                             "scale_attn_by_inverse_layer_idx",
                             "use_sliding_window",
                             "sliding_window",
                             "layer_types",
                             "attention_bias",
                             "mlp_bias",
                             "partial_rotary_factor",
                             "add_cross_attention",
                             "bos_token_id",
                             "eos_token_id"};

const char* const kValues[] = {"0",
                               "1",
                               "2",
                               "3",
                               "4",
                               "8",
                               "16",
                               "32",
                               "-1",
                               "-2147483648",
                               "65536",
                               "2147483647",
                               "2147483648",
                               "4294967296",
                               "9223372036854775807",
                               "-9223372036854775808",
                               "18446744073709551615",
                               "1.0",
                               "1.5",
                               "1e-5",
                               "1e-6",
                               "0.0",
                               "-0.0",
                               "1e300",
                               "-1e300",
                               "10000.0",
                               "\"\"",
                               "\"gpt2\"",
                               "\"llama\"",
                               "\"qwen2\"",
                               "\"mistral\"",
                               "\"silu\"",
                               "\"gelu_new\"",
                               "\"relu\"",
                               "\"default\"",
                               "\"linear\"",
                               "\"full_attention\"",
                               "\"sliding_attention\"",
                               "null",
                               "true",
                               "false",
                               "[]",
                               "{}",
                               "[\"full_attention\"]",
                               "[1, 2]",
                               "{\"rope_type\": \"default\", \"rope_theta\": 500000.0}",
                               "{\"rope_type\": \"yarn\", \"factor\": 4.0}",
                               "{\"rope_theta\": \"x\"}",
                               "{\"type\": \"linear\"}"};
constexpr std::size_t kNumValues = sizeof kValues / sizeof *kValues;

json random_value(std::mt19937& rng) { return json::parse(kValues[rng() % kNumValues]); }

// One to three edits of a copy of seed: a key's value replaced (most often), a key removed, a key
// added, or a value inside an object or list value replaced.
json mutate(json j, std::mt19937& rng) {
  for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
    if (!j.is_object() || j.empty()) break;
    auto it = j.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng() % j.size()));
    switch (rng() % 6) {
      case 0: j.erase(it.key()); break;
      case 1: j[kKeys[rng() % (sizeof kKeys / sizeof *kKeys)]] = random_value(rng); break;
      case 2:
        if ((it->is_object() || it->is_array()) && !it->empty()) {
          auto inner = it->begin();
          std::advance(inner, static_cast<std::ptrdiff_t>(rng() % it->size()));
          *inner = random_value(rng);
        } else {
          *it = random_value(rng);
        }
        break;
      default: *it = random_value(rng); break;
    }
  }
  return j;
}

std::string random_text(std::mt19937& rng) {
  static const char* const kTokens[] = {"{",
                                        "}",
                                        "[",
                                        "]",
                                        ",",
                                        ":",
                                        "\"model_type\"",
                                        "\"llama\"",
                                        "\"gpt2\"",
                                        "\"n_head\"",
                                        "\"num_attention_heads\"",
                                        "\"hidden_size\"",
                                        "\"head_dim\"",
                                        "\"rope_parameters\"",
                                        "0",
                                        "1",
                                        "-1",
                                        "2147483648",
                                        "1e300",
                                        "null",
                                        "true",
                                        "\"\\u0000\"",
                                        "\"x",
                                        "\xff"};
  return random_fragments(kTokens, rng);
}

// Sometimes a key the YAML gives next to config.json (they must agree).
std::vector<std::string> random_sets(std::mt19937& rng) {
  static const char* const kSets[] = {"model.n_layer=2",           "model.n_head=4",       "model.n_embd=32",
                                      "model.seq_len=16",          "model.vocab_size=300", "model.arch=llama",
                                      "model.tie_embeddings=true", "model.n_kv_head=2",    "model.rope_theta=10000"};
  if (rng() % 3 != 0) return {};
  return {kSets[rng() % (sizeof kSets / sizeof *kSets)]};
}

Outcome load_case(const std::string& folder, const std::string& text, std::vector<std::string> sets) {
  write_bytes(folder + "/config.json", text);
  sets.push_back("model.init_from=" + folder);
  try {
    const Config c = load_config_from_string("", "<fuzz>", sets);
    EXPECT_TRUE(json::parse(hf_config_json(c)).contains("model_type"));
    return Outcome::Loaded;
  } catch (const Error&) {
    return Outcome::Error;
  }  // anything else escapes and fails the test
}

}  // namespace

TEST(HfConfigFuzz, MutatedConfigJsonLoadsOrFailsCleanly) {
  ScratchDir dir;
  const std::string folder = dir.path().string();
  std::mt19937 rng(34);
  int cases = 0, loads = 0;
  auto run = [&](const std::string& text) {
    ++cases;
    loads += load_case(folder, text, random_sets(rng)) == Outcome::Loaded;
  };
  std::size_t sweep = 0;
  for (const json& seed : seeds()) {
    ASSERT_EQ(load_case(folder, seed.dump(), {}), Outcome::Loaded) << "the seed loads: " << seed.dump();
    for (const auto& [key, value] : seed.items())  // every key of the seed set to every value, alone
      for (const char* v : kValues) {
        json j = seed;
        j[key] = json::parse(v);
        run(j.dump());
        ++sweep;
      }
    for (int i = 0; i < 400; ++i) run(mutate(seed, rng).dump());
    for (int i = 0; i < 150; ++i) run(mutate_bytes(seed.dump(2), rng));
  }
  for (int i = 0; i < 200; ++i) run(random_text(rng));
  EXPECT_EQ(static_cast<std::size_t>(cases), sweep + 3 * 550 + 200);
  // Both outcomes occur: the mutations reach past the first checks, and some still load.
  EXPECT_GT(loads, 300);
  EXPECT_LT(loads, cases / 2);
}
