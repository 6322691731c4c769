// The files a checkpoint carries of a tokenizer (data/tokenizer_files.h): each folder form under
// Hugging Face's names, byte for byte, with the settings beside it; clear errors otherwise.
#include "data/tokenizer_files.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "tests/support/files.h"

using namespace stp;
using stp::testing::ScratchDir;
using stp::testing::write_bytes;

namespace {

std::map<std::string, std::string> as_map(const std::vector<TokenizerFile>& files) {
  std::map<std::string, std::string> m;
  for (const auto& f : files) EXPECT_TRUE(m.emplace(f.name, f.bytes).second) << f.name << " twice";
  return m;
}

}  // namespace

TEST(TokenizerFiles, EachFormUnderHuggingFaceNames) {
  const std::string gpt2 = std::string(STP_SOURCE_DIR) + "/tests/data/tokenizer/gpt2";
  // The GPT-2 release's names become the ones transformers' GPT-2 tokenizer reads.
  auto release = as_map(read_tokenizer_files(gpt2, "data.tokenizer"));
  ASSERT_EQ(release.size(), 2u);
  EXPECT_EQ(release["vocab.json"], stp::testing::read_bytes(gpt2 + "/encoder.json"));
  EXPECT_EQ(release["merges.txt"], stp::testing::read_bytes(gpt2 + "/vocab.bpe"));
  EXPECT_TRUE(holds_tokenizer(gpt2));

  ScratchDir dir;
  std::filesystem::create_directories(dir.path() / "vm");
  write_bytes(dir.file("vm/vocab.json"), "{\"a\": 0}");
  write_bytes(dir.file("vm/merges.txt"), "#version: 0.2\n");
  write_bytes(dir.file("vm/tokenizer_config.json"), "{}");
  write_bytes(dir.file("vm/special_tokens_map.json"), "{\"eos_token\": \"x\"}");
  write_bytes(dir.file("vm/README.md"), "not a tokenizer file");
  auto vm = as_map(read_tokenizer_files(dir.file("vm"), "data.tokenizer"));
  EXPECT_EQ(vm, (std::map<std::string, std::string>{{"vocab.json", "{\"a\": 0}"},
                                                    {"merges.txt", "#version: 0.2\n"},
                                                    {"tokenizer_config.json", "{}"},
                                                    {"special_tokens_map.json", "{\"eos_token\": \"x\"}"}}));
  // tokenizer.json wins over vocab.json + merges.txt, as read_bpe_files reads it.
  write_bytes(dir.file("vm/tokenizer.json"), "{\"model\": {}}");
  write_bytes(dir.file("vm/chat_template.jinja"), "{{ messages }}");
  auto tj = as_map(read_tokenizer_files(dir.file("vm"), "data.tokenizer"));
  EXPECT_EQ(tj.count("vocab.json"), 0u);
  EXPECT_EQ(tj["tokenizer.json"], "{\"model\": {}}");
  EXPECT_EQ(tj["chat_template.jinja"], "{{ messages }}");
  EXPECT_EQ(tj.size(), 4u);
  // A file is a tokenizer.json, whatever its name.
  auto one = as_map(read_tokenizer_files(dir.file("vm/tokenizer.json"), "data.tokenizer"));
  EXPECT_EQ(one, (std::map<std::string, std::string>{{"tokenizer.json", "{\"model\": {}}"}}));
}

TEST(TokenizerFiles, NoTokenizerIsAClearError) {
  ScratchDir dir;
  std::filesystem::create_directories(dir.path() / "empty");
  write_bytes(dir.file("empty/vocab.json"), "{}");  // half of a form
  EXPECT_FALSE(holds_tokenizer(dir.file("empty")));
  EXPECT_FALSE(holds_tokenizer(dir.file("missing")));
  EXPECT_FALSE(holds_tokenizer(""));
  stp::testing::expect_error([&] { read_tokenizer_files(dir.file("empty"), "data.tokenizer"); },
                             {"data.tokenizer", dir.file("empty"), "holding none of tokenizer.json"});
  stp::testing::expect_error([&] { read_tokenizer_files(dir.file("missing"), "data.tokenizer"); },
                             {"data.tokenizer", "does not exist"});
  stp::testing::expect_error([&] { read_tokenizer_files("/dev/zero", "data.tokenizer"); },
                             {"data.tokenizer", "/dev/zero"});
}
