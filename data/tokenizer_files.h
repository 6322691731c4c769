// The files of a byte-level BPE tokenizer as a model folder carries them (docs/design.md, Files):
// what a checkpoint copies so that `stp generate` and Hugging Face transformers find the tokenizer
// the model was trained with.
//
// PATH is what data/bpe_files.h reads:
//   * a file: an HF tokenizer.json, carried as "tokenizer.json";
//   * a folder: its first tokenizer form in read_bpe_files' order, under Hugging Face's names:
//       tokenizer.json                 as it is;
//       vocab.json + merges.txt        as they are;
//       encoder.json + vocab.bpe       (the GPT-2 release's names for the same two files) as
//                                      vocab.json + merges.txt, the names transformers' GPT-2
//                                      tokenizer reads;
//     and with it the tokenizer's settings in the folder when present: tokenizer_config.json,
//     special_tokens_map.json, chat_template.jinja.
// The bytes are read whole (base/file_io.h: regular files only) when the list is made, so what a
// run carries is the tokenizer as it was when the run started, whatever happens to PATH later.
// Errors (stp::Error): PATH missing, a folder holding no tokenizer form, a file that cannot be read.
#pragma once

#include <string>
#include <vector>

namespace stp {

struct TokenizerFile {
  std::string name;   // its name in a model folder: "tokenizer.json", "merges.txt", ...
  std::string bytes;  // the file's content
};

// The files of the tokenizer at `path` (above); `what` names the path in messages ("data.tokenizer").
std::vector<TokenizerFile> read_tokenizer_files(const std::string& path, const std::string& what);

// True when `folder` is a folder holding one of the tokenizer forms above (an HF model folder
// with its tokenizer, or a checkpoint that carries one).
bool holds_tokenizer(const std::string& folder);

}  // namespace stp
