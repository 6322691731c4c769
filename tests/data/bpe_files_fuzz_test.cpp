// A bounded, deterministic fuzz of the tokenizer readers (data/bpe_files.h) and the tokenizer built
// from what they read (data/bpe_tokenizer.h): seeded random mutations of small valid files — a
// tokenizer.json of each supported kind, and an encoder.json + vocab.bpe folder — at the JSON level
// (a value replaced by one of the values a reader must weigh: ids at and past every limit, wrong
// types, other pre-tokenizers; a key removed), at the byte level (flips, truncations, a slice
// spliced elsewhere) and as random JSON-ish text. Each case must either load or throw stp::Error;
// never crash, hang, over-read (ASan builds check that), allocate without bound or throw anything
// else. A tokenizer that loads must encode a short text into ids of its vocabulary and decode them
// without error. A few thousand cases, a few seconds in a release build; tools/test.sh runs it
// under ASan too (tests/CMakeLists.txt, the readers' fuzz tests).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "data/bpe_files.h"
#include "data/bpe_tokenizer.h"
#include "data/byte_unicode.h"
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

// Text with merges, an added token, digits, non-ASCII letters and whitespace runs.
const std::string kText = "hello world<|endoftext|> the hello, h\xC3\xA9llo 1234  \n\tworld!";

// The pieces the seeds merge, in rank order (each joins two tokens already in the vocabulary).
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"h", "e"}, {"l", "l"},     {"he", "ll"}, {"hell", "o"}, {" ", "w"},   {"o", "r"}, {" w", "or"},
    {"l", "d"}, {" wor", "ld"}, {" ", "t"},   {" t", "h"},   {" th", "e"}, {"1", "2"}, {"12", "3"}};

std::string mapped(const std::string& bytes) { return byte_unicode::from_bytes(bytes); }

// The vocabulary of the seeds: the 256 bytes (ids 0..255), then each merge's result.
json seed_vocab() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[mapped(std::string(1, static_cast<char>(b)))] = b;
  int id = 256;
  for (const auto& [a, b] : kMerges) vocab[mapped(a + b)] = id++;
  return vocab;
}

// A GPT-2 kind tokenizer.json ("a b" merges, ByteLevel with its regex), or a Llama-3 kind one
// ([a, b] merges, a Sequence of Split and ByteLevel, ignore_merges).
json seed_tokenizer_json(bool llama) {
  json merges = json::array();
  for (const auto& [a, b] : kMerges) {
    if (llama) merges.push_back({mapped(a), mapped(b)});
    else merges.push_back(mapped(a) + " " + mapped(b));
  }
  const json added = {
      {{"id", 256 + static_cast<int>(kMerges.size())}, {"content", "<|endoftext|>"}, {"special", true}}};
  json pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  if (llama)
    pre = {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"},
              {"pattern",
               {{"Regex", R"((?i:'s|'t)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"}}},
              {"behavior", "Isolated"},
              {"invert", false}},
             {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", llama ? json(nullptr) : json({{"type", "NFC"}})},
          {"pre_tokenizer", pre},
          {"model", {{"type", "BPE"}, {"vocab", seed_vocab()}, {"merges", merges}, {"ignore_merges", llama}}}};
}

// What the readers must weigh in place of any value: ids at and past every limit, in every JSON
// number form, and the other types and names a field could hold.
json random_value(std::mt19937& rng) {
  static const char* const kValues[] = {"0",
                                        "1",
                                        "-1",
                                        "255",
                                        "256",
                                        "269",
                                        "270",
                                        "65535",
                                        "65536",
                                        "16777216",
                                        "2147483647",
                                        "2147483648",
                                        "2000000000",
                                        "2e9",
                                        "4294967296",
                                        "9223372036854775807",
                                        "18446744073709551615",
                                        "-9223372036854775808",
                                        "1.5",
                                        "1e300",
                                        "-0.0",
                                        "\"\"",
                                        "\"a\"",
                                        "\"h e\"",
                                        "\"\\u0120\"",
                                        "\"<|endoftext|>\"",
                                        "\"\\u0000\"",
                                        "\"BPE\"",
                                        "\"WordPiece\"",
                                        "\"ByteLevel\"",
                                        "\"Split\"",
                                        "\"Sequence\"",
                                        "\"Isolated\"",
                                        "\"NFC\"",
                                        "\"NFKC\"",
                                        "null",
                                        "true",
                                        "false",
                                        "[]",
                                        "{}",
                                        "[\"a\", \"b\"]",
                                        "[\"a\"]",
                                        "[1, 2]",
                                        "{\"Regex\": \"(a\"}",
                                        "{\"Regex\": \"\\\\s+\"}",
                                        "{\"String\": \" \"}",
                                        "{\"type\": \"ByteLevel\"}",
                                        "{\"type\": \"Split\"}",
                                        "{\"id\": 3, \"content\": \"x\"}",
                                        "{\"id\": 2147483647, \"content\": \"x\"}"};
  return json::parse(kValues[rng() % (sizeof kValues / sizeof *kValues)]);
}

// A node of j reached by a random walk from the root (the root itself only when it is a leaf).
json* random_node(json& j, std::mt19937& rng) {
  json* at = &j;
  for (;;) {
    const bool container = (at->is_object() || at->is_array()) && !at->empty();
    if (!container || (at != &j && rng() % 3 == 0)) return at;
    auto it = at->begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng() % at->size()));
    at = &*it;
  }
}

// One to three edits of a copy of seed: replace a node, remove a key or element, or (most often,
// where the id defects live) give a vocabulary entry or an added token another id.
json mutate(json j, std::mt19937& rng) {
  for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
    switch (rng() % 4) {
      case 0: *random_node(j, rng) = random_value(rng); break;
      case 1: {
        json* parent = random_node(j, rng);
        if (parent->is_object() && !parent->empty()) {
          auto it = parent->begin();
          std::advance(it, static_cast<std::ptrdiff_t>(rng() % parent->size()));
          parent->erase(it.key());
        } else if (parent->is_array() && !parent->empty()) {
          parent->erase(rng() % parent->size());
        }
        break;
      }
      default: {
        json* ids = j.contains("model") && j["model"].is_object() && j["model"].contains("vocab") ? &j["model"]["vocab"]
                                                                                                  : nullptr;
        if (rng() % 3 == 0 && j.contains("added_tokens") && j["added_tokens"].is_array() &&
            !j["added_tokens"].empty() && j["added_tokens"][0].is_object())
          j["added_tokens"][0]["id"] = random_value(rng);
        else if (ids && ids->is_object() && !ids->empty()) *random_node(*ids, rng) = random_value(rng);
        break;
      }
    }
  }
  return j;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Random JSON-ish text from the fragments a tokenizer.json is made of.
std::string random_text(std::mt19937& rng) {
  static const char* const kTokens[] = {"{",
                                        "}",
                                        "[",
                                        "]",
                                        ",",
                                        ":",
                                        "\"model\"",
                                        "\"vocab\"",
                                        "\"merges\"",
                                        "\"type\"",
                                        "\"BPE\"",
                                        "\"a\"",
                                        "\"a b\"",
                                        "\"added_tokens\"",
                                        "\"id\"",
                                        "\"content\"",
                                        "\"pre_tokenizer\"",
                                        "\"ByteLevel\"",
                                        "\"Split\"",
                                        "\"Regex\"",
                                        "0",
                                        "1",
                                        "-1",
                                        "2147483647",
                                        "2e9",
                                        "1.5",
                                        "null",
                                        "true",
                                        "\"\\u0000\"",
                                        "\"\\ud800\"",
                                        "\"x",
                                        "\xff"};
  return random_fragments(kTokens, rng);
}

// Loads path (a file or a folder) and checks what a loaded tokenizer promises on kText.
Outcome load_case(const std::string& path) {
  try {
    const BpeTokenizer tok = BpeTokenizer::load(path);
    EXPECT_GT(tok.vocab_size(), 0);
    EXPECT_LE(tok.vocab_size(), kMaxVocabSize);
    const std::vector<std::int32_t> ids = tok.encode(kText);
    for (std::int32_t id : ids) EXPECT_TRUE(id >= 0 && id < tok.vocab_size()) << id;
    tok.decode(ids);
    return Outcome::Loaded;
  } catch (const Error&) {
    return Outcome::Error;
  }  // anything else escapes and fails the test
}

}  // namespace

TEST(BpeFilesFuzz, MutatedTokenizerJsonLoadsOrFailsCleanly) {
  ScratchDir dir;
  const std::string path = dir.file("tokenizer.json");
  int cases = 0, loads = 0;
  auto run = [&](const std::string& text) {
    write_bytes(path, text);
    ++cases;
    const bool loaded = load_case(path) == Outcome::Loaded;
    loads += loaded;
    return loaded;
  };
  std::mt19937 rng(34);
  for (bool llama : {false, true}) {
    const json seed = seed_tokenizer_json(llama);
    ASSERT_TRUE(run(dump(seed))) << "the seed loads (" << (llama ? "Llama-3" : "GPT-2") << " kind)";
    const std::string text = dump(seed);
    for (int i = 0; i < 700; ++i) run(dump(mutate(seed, rng)));
    for (int i = 0; i < 300; ++i) run(mutate_bytes(text, rng));
  }
  for (int i = 0; i < 300; ++i) run(random_text(rng));
  EXPECT_EQ(cases, 2302);
  // Both outcomes occur: the mutations reach past the first checks, and some still load.
  EXPECT_GT(loads, 100);
  EXPECT_LT(loads, cases / 2);
}

// The GPT-2 release's two files: a mutated encoder.json (JSON edits and bytes) or vocab.bpe (bytes).
TEST(BpeFilesFuzz, MutatedEncoderJsonAndVocabBpeLoadOrFailCleanly) {
  ScratchDir dir;
  const json vocab = seed_vocab();
  std::string merges = "#version: 0.2\n";
  for (const auto& [a, b] : kMerges) merges += mapped(a) + " " + mapped(b) + "\n";
  int cases = 0, loads = 0;
  auto run = [&](const std::string& encoder, const std::string& bpe) {
    write_bytes(dir.file("encoder.json"), encoder);
    write_bytes(dir.file("vocab.bpe"), bpe);
    ++cases;
    loads += load_case(dir.path().string()) == Outcome::Loaded;
  };
  std::mt19937 rng(35);
  run(dump(vocab), merges);
  ASSERT_EQ(loads, 1) << "the seed loads";
  for (int i = 0; i < 300; ++i) run(dump(mutate(vocab, rng)), merges);
  for (int i = 0; i < 150; ++i) run(mutate_bytes(dump(vocab), rng), merges);
  for (int i = 0; i < 250; ++i) run(dump(vocab), mutate_bytes(merges, rng));
  EXPECT_EQ(cases, 701);
  EXPECT_GT(loads, 100);
  EXPECT_LT(loads, cases);
}
