// Reading a byte-level BPE tokenizer's files into one description (BpeSpec) that BpeTokenizer
// builds from. PATH is one of
//   * an HF tokenizer.json: model.type BPE (vocab, merges as "a b" strings or [a, b] pairs,
//     ignore_merges), added_tokens, and the pre-split pattern of pre_tokenizer: ByteLevel with
//     use_regex (GPT-2's pattern), or a Sequence of Split {Regex, behavior Isolated} and ByteLevel
//     without use_regex (Llama-3, Qwen2). normalizer null or NFC (NFC is not applied: the input
//     must already be NFC, as nearly all text is). Anything else is rejected by name. The
//     post_processor is not applied (no BOS token is added: token files are plain text streams).
//   * a folder holding tokenizer.json, or vocab.json + merges.txt, or encoder.json + vocab.bpe
//     (the GPT-2 release's names), tried in that order. The two vocab + merges forms split with
//     GPT-2's pattern and treat "<|endoftext|>", when in the vocabulary, as a special token.
// Token ids are integers in [0, kMaxVocabSize): a tokenizer holds one entry per id up to its
// largest, so the cap bounds what a file can make it allocate (2^22 ids, about 130 MB), 16 times
// the largest vocabularies in use (Gemma's 262144). A larger id is an error naming the file, the
// token and the id, raised while the file is read. Tokenizer files must be regular files
// (base/file_io.h): a device or FIFO is refused before it is read.
// Errors (stp::Error) name the file and what is wrong in it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace stp {

// Token ids, of the vocabulary and of the added tokens, are below this: 2^22, 16 times the largest
// vocabularies in use (Gemma's 262144), and a bound on what the tokenizer allocates per id (a string
// each, about 130 MB in all). A larger id is an stp::Error naming it, raised while the file is read
// (docs/config.md, Token files).
inline constexpr std::int32_t kMaxVocabSize = std::int32_t(1) << 22;

// GPT-2's pre-split pattern (PCRE2 syntax, compiled with UTF and UCP), and Llama-3's (also
// OpenAI's cl100k) and Qwen2's as their tokenizer.json files give them. A tokenizer with one of
// these patterns encodes a stream in chunks (BpeTokenizer::stream_cut).
extern const char* const kGpt2Pattern;
extern const char* const kLlama3Pattern;
extern const char* const kQwen2Pattern;

struct BpeSpec {
  struct Token {
    std::string bytes;  // what the token decodes to: raw bytes (vocabulary strings are mapped back,
                        // data/byte_unicode.h), or an added token's literal text
    std::int32_t id;
  };
  std::vector<Token> vocab;                                 // the model's vocabulary
  std::vector<std::pair<std::string, std::string>> merges;  // raw bytes of each pair, rank order
  std::vector<Token> specials;  // added tokens: matched literally in the input before the pre-split
  std::string pattern;          // pre-split regex; empty: no pre-split
  bool ignore_merges = false;   // a piece found whole in the vocabulary is one token
  std::string source;           // the file(s) read, for messages
};

BpeSpec read_bpe_files(const std::string& path);

}  // namespace stp
