#include "data/tokenizer_files.h"

#include <filesystem>
#include <utility>

#include "base/error.h"
#include "base/file_io.h"

namespace stp {
namespace {

namespace fs = std::filesystem;

// The tokenizer forms of a folder, in read_bpe_files' order: (name in the folder, name carried).
const std::vector<std::vector<std::pair<const char*, const char*>>> kForms = {
    {{"tokenizer.json", "tokenizer.json"}},
    {{"vocab.json", "vocab.json"}, {"merges.txt", "merges.txt"}},
    {{"encoder.json", "vocab.json"}, {"vocab.bpe", "merges.txt"}},
};

// Settings transformers reads beside the vocabulary (special tokens, chat template).
constexpr const char* kSettings[] = {"tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"};

// The first form whose files are all in `dir`; nullptr when none is.
const std::vector<std::pair<const char*, const char*>>* form_of(const fs::path& dir) {
  std::error_code ec;
  for (const auto& form : kForms) {
    bool all = true;
    for (const auto& [file, carried] : form) all = all && fs::exists(dir / file, ec);
    if (all) return &form;
  }
  return nullptr;
}

}  // namespace

bool holds_tokenizer(const std::string& folder) {
  std::error_code ec;
  return fs::is_directory(folder, ec) && form_of(folder) != nullptr;
}

std::vector<TokenizerFile> read_tokenizer_files(const std::string& path, const std::string& what) {
  std::error_code ec;
  STP_CHECK(fs::exists(path, ec), what, " '", path, "' does not exist");
  std::vector<TokenizerFile> files;
  if (!fs::is_directory(path, ec)) {
    files.push_back({"tokenizer.json", read_regular_file(path, what)});
    return files;
  }
  const fs::path dir(path);
  const auto* form = form_of(dir);
  STP_CHECK(form, what, " '", path,
            "' is a folder holding none of tokenizer.json, vocab.json + merges.txt, encoder.json + vocab.bpe");
  for (const auto& [file, carried] : *form) files.push_back({carried, read_regular_file((dir / file).string(), what)});
  for (const char* file : kSettings)
    if (fs::exists(dir / file, ec)) files.push_back({file, read_regular_file((dir / file).string(), what)});
  return files;
}

}  // namespace stp
