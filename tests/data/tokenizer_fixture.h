// The GPT-2 tokenizer the data tests share (tests/data/tokenizer/gpt2: the GPT-2 release's
// encoder.json and vocab.bpe), and the same vocabulary with another pre-split pattern and
// ChatML's added tokens <|im_start|> (50257) and <|im_end|> (50258).
#pragma once

#include <string>

#include "data/bpe_files.h"
#include "data/bpe_tokenizer.h"

namespace stp::testing {

inline const std::string kTokenizerDir = std::string(STP_SOURCE_DIR) + "/tests/data/tokenizer";

inline const BpeTokenizer& gpt2_tokenizer() {
  static const BpeTokenizer t = BpeTokenizer::load(kTokenizerDir + "/gpt2");
  return t;
}

inline BpeTokenizer gpt2_with_chatml(const std::string& pattern = kGpt2Pattern) {
  BpeSpec spec = read_bpe_files(kTokenizerDir + "/gpt2");
  spec.pattern = pattern;
  spec.specials.push_back({"<|im_start|>", 50257});
  spec.specials.push_back({"<|im_end|>", 50258});
  return BpeTokenizer(spec);
}

}  // namespace stp::testing
