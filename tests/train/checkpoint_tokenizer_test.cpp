// The tokenizer travels with the model (data/tokenizer_files.h, Trainer::tokenizer_source): a
// checkpoint carries the files of the run's tokenizer byte for byte (data.tokenizer, else
// model.init_from's folder, else train.resume's checkpoint), so the folder is a tokenizer folder
// itself; byte-level runs carry none; a tokenizer with more ids than the model is refused, one stp
// cannot read travels with a warning.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "data/bpe_tokenizer.h"
#include "data/byte_unicode.h"
#include "tests/support/files.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

namespace {

namespace fs = std::filesystem;
using stp::testing::fresh_dir;
using stp::testing::read_bytes;

// A byte-level BPE tokenizer.json of `ids` ids (the 256 bytes, then added tokens) and no merges,
// with a tokenizer_config.json beside it, in `dir`.
void write_tokenizer(const std::string& dir, int ids = 256,
                     const std::string& settings = R"({"model_max_length": 16, "eos_token": null})") {
  fs::create_directories(dir);
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (int b = 0; b < 256; ++b) vocab[stp::byte_unicode::from_bytes(std::string(1, char(b)))] = b;
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (int id = 256; id < ids; ++id) added.push_back({{"id", id}, {"content", "<|extra_" + std::to_string(id) + "|>"}});
  nlohmann::ordered_json j = {{"version", "1.0"},
                              {"added_tokens", added},
                              {"normalizer", nullptr},
                              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  std::ofstream(dir + "/tokenizer.json") << j.dump(1);
  std::ofstream(dir + "/tokenizer_config.json") << settings;
}

// A one-layer run on the u16 token file (ids below 64, vocabulary 256) with `overrides`, one step,
// its checkpoint saved; returns the checkpoint and the trainer's tokenizer source.
std::pair<std::string, std::string> train_one_step(const std::string& name, std::vector<std::string> overrides) {
  std::vector<std::string> set = {"data.path=" + stp::testing::tokens64_file(), "data.format=u16", "model.n_layer=1",
                                  "train.microbatches=2"};
  set.insert(set.end(), overrides.begin(), overrides.end());
  auto cfg = stp::testing::tiny_config(set);
  cfg.output.dir = fresh_dir(name);
  stp::Trainer t(cfg);
  t.step();
  return {t.save_checkpoint(), t.tokenizer_source()};
}

void expect_carries(const std::string& checkpoint, const std::string& tokenizer_dir) {
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    ASSERT_TRUE(fs::is_regular_file(fs::path(checkpoint) / f)) << checkpoint << " lacks " << f;
    EXPECT_EQ(read_bytes(checkpoint + "/" + f), read_bytes(tokenizer_dir + "/" + f)) << f;
  }
  // The folder is a tokenizer folder: what `stp generate CHECKPOINT` loads without --tokenizer.
  EXPECT_EQ(stp::BpeTokenizer::load(checkpoint).decode({104, 105}), "hi");
}

TEST(CheckpointTokenizer, CheckpointCarriesDataTokenizerByteForByte) {
  const std::string tok = fresh_dir("ck_tok_source");
  write_tokenizer(tok);
  auto [ck, source] = train_one_step("ck_tok_run", {"data.tokenizer=" + tok});
  EXPECT_EQ(source, tok);
  expect_carries(ck, tok);
  auto [plain, none] = train_one_step("ck_tok_none", {});
  EXPECT_EQ(none, "");
  EXPECT_FALSE(fs::exists(fs::path(plain) / "tokenizer.json")) << "a run without a tokenizer carries none";
}

// An HF model folder with its tokenizer (config.json, model.safetensors, tokenizer files) as
// model.init_from: the run picks the tokenizer up and its checkpoints carry it; data.tokenizer,
// when given, wins; a byte-level run takes none.
TEST(CheckpointTokenizer, InitFromAnHfFolderPicksUpItsTokenizer) {
  const std::string tok = fresh_dir("init_tok_source");
  write_tokenizer(tok);
  const std::string hf = fresh_dir("init_tok_hf");
  {
    auto [ck, source] = train_one_step("init_tok_first", {});
    fs::create_directories(hf);
    for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(fs::path(ck) / f, fs::path(hf) / f);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(fs::path(tok) / f, fs::path(hf) / f);
  }
  auto [ck, source] = train_one_step("init_tok_run", {"model.init_from=" + hf});
  EXPECT_EQ(source, hf);
  expect_carries(ck, tok);
  // train.resume's checkpoint carries it on when nothing else names one.
  {
    auto cfg = stp::testing::tiny_config({"data.path=" + stp::testing::tokens64_file(), "data.format=u16",
                                          "model.n_layer=1", "train.microbatches=2", "train.steps=2"});
    cfg.output.dir = fs::path(ck).parent_path().string();
    cfg.train.resume = ck;
    stp::Trainer t(cfg);
    EXPECT_EQ(t.tokenizer_source(), ck);
    t.step();
    expect_carries(t.save_checkpoint(), tok);
  }
  const std::string other = fresh_dir("init_tok_other");
  write_tokenizer(other, 256, R"({"model_max_length": 8})");
  auto [ck2, explicit_source] =
      train_one_step("init_tok_explicit", {"model.init_from=" + hf, "data.tokenizer=" + other});
  EXPECT_EQ(explicit_source, other);
  EXPECT_EQ(read_bytes(ck2 + "/tokenizer_config.json"), R"({"model_max_length": 8})");
  auto cfg = stp::testing::tiny_config({"model.n_layer=1", "model.init_from=" + hf, "data.format=text"});
  cfg.output.dir = fresh_dir("init_tok_bytes");
  stp::Trainer bytes(cfg);
  EXPECT_EQ(bytes.tokenizer_source(), "") << "a byte-level run has no tokenizer";
}

// A tokenizer stp cannot read (here a Unigram model) still travels, with a warning: transformers
// reads what stp's byte-level BPE reader does not.
TEST(CheckpointTokenizer, TokenizerStpCannotReadTravelsWithAWarning) {
  const std::string tok = fresh_dir("unigram_tok_source");
  fs::create_directories(tok);
  std::ofstream(tok + "/tokenizer.json") << R"({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}})";
  auto cfg = stp::testing::tiny_config({"data.path=" + stp::testing::tokens64_file(), "data.format=u16",
                                        "model.n_layer=1", "train.microbatches=2", "data.tokenizer=" + tok});
  cfg.output.dir = fresh_dir("unigram_tok_run");
  stp::Trainer t(cfg);
  ASSERT_EQ(t.warnings().size(), 1u);
  EXPECT_NE(t.warnings()[0].find("stp cannot read it"), std::string::npos) << t.warnings()[0];
  EXPECT_NE(t.warnings()[0].find("Unigram"), std::string::npos) << t.warnings()[0];
  t.step();
  EXPECT_EQ(read_bytes(t.save_checkpoint() + "/tokenizer.json"), read_bytes(tok + "/tokenizer.json"));
}

TEST(CheckpointTokenizer, TokenizerLargerThanTheModelIsAnErrorBeforeTraining) {
  const std::string tok = fresh_dir("big_tok_source");
  write_tokenizer(tok, 300);
  auto cfg = stp::testing::tiny_config(
      {"data.path=" + stp::testing::tokens64_file(), "data.format=u16", "model.n_layer=1", "data.tokenizer=" + tok});
  cfg.output.dir = fresh_dir("big_tok_run");
  stp::testing::expect_error([&] { stp::Trainer t(cfg); },
                             {"data.tokenizer", tok, "300 ids", "model.vocab_size is 256"});
  stp::testing::expect_error([&] { stp::testing::tiny_config({"data.tokenizer=" + tok}); },
                             {"data.tokenizer", "data.format text"});
}

}  // namespace
