// Hugging Face interop through the trainer: every checkpoint folder is an HF model folder
// (config.json, HF names and layouts) that model.init_from loads back bit for bit, for gpt2 and
// llama (tied and untied heads, q/k/v biases) under different layouts; a sharded BF16 folder
// imports exactly; and broken folders (a missing tensor, a wrong shape, a vocab the data
// exceeds) are clear errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "formats/checkpoint.h"
#include "formats/hf_folder.h"
#include "tests/support/hf_fixture.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

namespace {

namespace fs = std::filesystem;
using Tensors = std::map<std::string, stp::HostTensor>;

std::string run_dir(const std::string& name) { return std::string(STP_BINARY_DIR) + "/tests/hf_interop/" + name; }

const std::vector<std::string> kLlama = {"model.arch=llama",        "model.n_layer=4",
                                         "model.n_head=4",          "model.n_kv_head=2",
                                         "model.n_embd=32",         "model.intermediate_size=48",
                                         "model.rope_theta=500000", "model.norm_eps=1.0e-6"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// tiny_config's run without its model keys: the shape comes from model.init_from's config.json.
stp::Config import_config(const std::vector<std::string>& overrides) {
  const std::string yaml = R"(
data: {format: text, sampling: sequential}
train: {steps: 3, micro_batch_size: 2, microbatches: 8, lr: 1.0e-3, lr_schedule: constant, warmup_steps: 0, seed: 7}
parallel: {backend: cpu, tp: 1, pp: 1, schedule: gpipe, cpu_threads: 1}
memory: {offload: none, recompute: none}
output: {dir: unused, log_every: 1}
)";
  return stp::load_config_from_string(yaml, "import test config",
                                      with({"data.path=" + stp::testing::tiny_text_file()}, overrides));
}

void expect_bitwise(const Tensors& a, const Tensors& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_EQ(t.shape, b.at(name).shape) << name;
    EXPECT_EQ(t.data, b.at(name).data) << name;
  }
}

// Trains a step under `model` at tp 2 x pp 2, saves, and loads the checkpoint folder as
// model.init_from (model keys from its config.json only) at tp 1 and at tp 2 x pp 2.
void export_import(const std::string& name, const std::vector<std::string>& model) {
  stp::Trainer t(stp::testing::tiny_config(
      with(model, {"parallel.tp=2", "parallel.pp=2", "train.seed=11", "output.dir=" + run_dir(name)})));
  t.step();
  const std::string ckpt = t.save_checkpoint();
  const Tensors live = t.full_parameters();
  ASSERT_TRUE(fs::is_regular_file(ckpt + "/config.json"));
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"parallel.tp=1", "parallel.pp=1"}, {"parallel.tp=2", "parallel.pp=2"}}) {
    // Only the architecture-free keys: the shape comes from the folder's config.json.
    stp::Trainer back(import_config(with(layout, {"model.init_from=" + ckpt})));
    expect_bitwise(live, back.full_parameters());
  }
}

TEST(HfInterop, Gpt2ExportImportIsBitwise) {
  export_import("gpt2", {"model.n_layer=4"});
  // HF GPT-2 names and Conv1D layout [in, out] as they are.
  auto saved = stp::read_model_source(stp::checkpoint_path(run_dir("gpt2"), 1));
  EXPECT_EQ(saved.at("h.0.attn.c_attn.weight").shape, (stp::Shape{32, 96}));
  EXPECT_TRUE(saved.count("wte.weight"));
}

TEST(HfInterop, LlamaExportImportIsBitwise) {
  export_import("llama_untied", with(kLlama, {"model.tie_embeddings=false"}));
  export_import("llama_tied", with(kLlama, {"model.tie_embeddings=true"}));
  export_import("qwen2", with(kLlama, {"model.qkv_bias=true", "model.tie_embeddings=true"}));
}

TEST(HfInterop, LlamaCheckpointHoldsHfNamesAndLayouts) {
  stp::Trainer t(stp::testing::tiny_config(
      with(kLlama, {"model.qkv_bias=true", "model.tie_embeddings=true", "output.dir=" + run_dir("layout")})));
  const Tensors live = t.full_parameters();
  const std::string ckpt = t.save_checkpoint();
  const Tensors hf = stp::read_model_source(ckpt);
  const auto& qkv = live.at("model.layers.1.self_attn.qkv_proj.weight");  // [C, (H + 2K) D] = [32, 64]
  const auto& k = hf.at("model.layers.1.self_attn.k_proj.weight");        // [K D, C] = [16, 32]
  ASSERT_EQ(k.shape, (stp::Shape{16, 32}));
  for (int o = 0; o < 16; ++o)
    for (int i = 0; i < 32; ++i) ASSERT_EQ(k.data[o * 32 + i], qkv.data[i * 64 + 32 + o]);
  const auto& up = hf.at("model.layers.0.mlp.up_proj.weight");              // [I, C]
  const auto& gate_up = live.at("model.layers.0.mlp.gate_up_proj.weight");  // [C, 2I]
  ASSERT_EQ(up.shape, (stp::Shape{48, 32}));
  EXPECT_EQ(up.data[5 * 32 + 7], gate_up.data[7 * 96 + 48 + 5]);
  EXPECT_EQ(hf.at("model.layers.0.self_attn.v_proj.bias").shape, (stp::Shape{16}));
  EXPECT_EQ(hf.at("model.layers.3.self_attn.o_proj.weight").shape, (stp::Shape{32, 32}));
  EXPECT_EQ(hf.at("model.layers.3.mlp.down_proj.weight").shape, (stp::Shape{32, 48}));
  EXPECT_FALSE(hf.count("lm_head.weight"));  // tied: HF ties lm_head to embed_tokens
  for (const auto& [name, tensor] : hf) EXPECT_EQ(name.find("qkv_proj"), std::string::npos) << name;
}

// A sharded BF16 Qwen2-style folder: known bf16 values land in the model exactly.
TEST(HfInterop, ShardedBf16FolderImportsExactly) {
  const std::string ckpt = [] {
    stp::Trainer t(stp::testing::tiny_config(
        with(kLlama, {"model.qkv_bias=true", "model.tie_embeddings=true", "output.dir=" + run_dir("bf16_src")})));
    return t.save_checkpoint();
  }();
  Tensors hf = stp::read_model_source(ckpt);
  for (auto& [name, t] : hf)
    for (float& v : t.data) v = stp::testing::bf16_round(v * 3.0f + 0.01f);
  const std::string dir = run_dir("bf16_folder");
  fs::remove_all(dir);
  stp::testing::write_sharded_folder(dir, hf, 3, "BF16");
  fs::copy_file(ckpt + "/config.json", dir + "/config.json");
  for (const std::string tp : {"1", "2"}) {
    stp::Trainer t(import_config({"parallel.tp=" + tp, "model.init_from=" + dir}));
    const Tensors live = t.full_parameters();
    const auto& qkv = live.at("model.layers.2.self_attn.qkv_proj.weight");
    const auto& q = hf.at("model.layers.2.self_attn.q_proj.weight");  // [H D, C] = [32, 32]
    for (int o = 0; o < 32; ++o)
      for (int i = 0; i < 32; ++i) ASSERT_EQ(qkv.data[i * 64 + o], q.data[o * 32 + i]);
    EXPECT_EQ(live.at("model.embed_tokens.weight").data, hf.at("model.embed_tokens.weight").data);
    EXPECT_EQ(live.at("model.norm.weight").data, hf.at("model.norm.weight").data);
  }
}

std::string init_error(const std::string& dir, const std::vector<std::string>& extra = {}) {
  try {
    stp::Trainer t(import_config(with({"model.init_from=" + dir}, extra)));
  } catch (const stp::Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(HfInterop, BrokenFoldersAreClearErrors) {
  stp::Trainer src(stp::testing::tiny_config(with(kLlama, {"output.dir=" + run_dir("broken_src")})));
  const std::string ckpt = src.save_checkpoint();
  const Tensors hf = stp::read_model_source(ckpt);
  auto folder = [&](const std::string& name, const Tensors& tensors) {
    const std::string dir = run_dir(name);
    fs::remove_all(dir);
    stp::testing::write_sharded_folder(dir, tensors, 2, "F32");
    fs::copy_file(ckpt + "/config.json", dir + "/config.json");
    return dir;
  };
  Tensors missing = hf;
  missing.erase("model.layers.1.mlp.gate_proj.weight");
  std::string e = init_error(folder("missing", missing));
  EXPECT_NE(e.find("tensor 'model.layers.1.mlp.gate_proj.weight' is missing"), std::string::npos) << e;

  Tensors wrong = hf;
  wrong["model.layers.0.self_attn.v_proj.weight"].shape = {32, 16};
  e = init_error(folder("wrong_shape", wrong));
  EXPECT_NE(e.find("'model.layers.0.self_attn.v_proj.weight' has shape [32, 16], the model needs [16, 32]"),
            std::string::npos)
      << e;

  // config.json says vocab 256, the YAML gives a u16 token file with ids up to 63 and vocab 32.
  e = init_error(ckpt, {"model.vocab_size=32"});
  EXPECT_NE(e.find("model.vocab_size is 32"), std::string::npos) << e;
  std::string cfg;
  {
    std::ifstream f(ckpt + "/config.json");
    cfg.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  Tensors cut = hf;  // the first 32 rows of the embedding and of the head
  for (const char* n : {"model.embed_tokens.weight", "lm_head.weight"}) {
    cut[n].shape = {32, 32};
    cut[n].data.resize(32 * 32);
  }
  const std::string small = folder("small_vocab", cut);
  fs::remove(small + "/config.json");
  std::ofstream(small + "/config.json") << cfg.replace(cfg.find("\"vocab_size\": 256"), 17, "\"vocab_size\": 32");
  e = init_error(small, {"data.format=u16", "data.path=" + stp::testing::tokens64_file()});
  EXPECT_NE(e.find("vocab_size 32"), std::string::npos) << e;
}

}  // namespace
