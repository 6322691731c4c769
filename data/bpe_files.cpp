#include "data/bpe_files.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/file_io.h"
#include "base/json_fields.h"
#include "data/byte_unicode.h"

namespace stp {

const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_text(const fs::path& path) { return read_regular_file(path.string(), "tokenizer:"); }

// A token id from the file: an integer in [0, kMaxVocabSize), checked before anything is sized by it.
std::int32_t token_id(const json& id, const std::string& where, const std::string& token) {
  STP_CHECK(id.is_number_integer() && id.get<std::int64_t>() >= 0 && id.get<std::int64_t>() < kMaxVocabSize,
            "tokenizer: ", where, ": token '", token, "' has id ", id.dump(),
            ", not an integer in [0, 2^22 = ", kMaxVocabSize,
            ") (stp's limit on token ids: docs/config.md, Token files)");
  return id.get<std::int32_t>();
}

json parse_json(const fs::path& path) {
  try {
    return json::parse(read_text(path));
  } catch (const json::exception& e) {
    throw Error(str("tokenizer: '", path.string(), "' is not valid JSON: ", json_error_text(e)));
  }
}

// A vocabulary string's bytes: mapped back through the byte alphabet, else taken literally.
std::string token_bytes(const std::string& s) {
  auto b = byte_unicode::to_bytes(s);
  return b ? *b : s;
}

std::string merge_part(const std::string& s, const std::string& where) {
  auto b = byte_unicode::to_bytes(s);
  STP_CHECK(b.has_value() && !b->empty(), "tokenizer: ", where, ": merge part '", s,
            "' is not a string of the byte-level alphabet");
  return *b;
}

void read_vocab(const json& v, const std::string& where, BpeSpec& spec) {
  STP_CHECK(v.is_object(), "tokenizer: ", where, ": the vocabulary is not a JSON object of token: id");
  spec.vocab.reserve(v.size());
  for (auto it = v.begin(); it != v.end(); ++it)
    spec.vocab.push_back({token_bytes(it.key()), token_id(it.value(), where, it.key())});
}

void add_merge_line(const std::string& line, const std::string& where, BpeSpec& spec) {
  std::size_t sp = line.find(' ');
  STP_CHECK(sp != std::string::npos && sp > 0 && line.find(' ', sp + 1) == std::string::npos && sp + 1 < line.size(),
            "tokenizer: ", where, ": merge '", line, "' is not two tokens separated by one space");
  spec.merges.emplace_back(merge_part(line.substr(0, sp), where), merge_part(line.substr(sp + 1), where));
}

void read_merges_txt(const fs::path& path, BpeSpec& spec) {
  std::string text = read_text(path);
  std::size_t pos = 0, line_no = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    add_merge_line(line, str("'", path.string(), "' line ", line_no), spec);
  }
}

BpeSpec read_vocab_merges(const fs::path& vocab, const fs::path& merges) {
  BpeSpec spec;
  spec.source = str("'", vocab.string(), "' + '", merges.string(), "'");
  read_vocab(parse_json(vocab), str("'", vocab.string(), "'"), spec);
  read_merges_txt(merges, spec);
  spec.pattern = kGpt2Pattern;
  for (const auto& t : spec.vocab)
    if (t.bytes == "<|endoftext|>") spec.specials.push_back(t);
  return spec;
}

std::string string_field(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool bool_field(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

// The pre-split pattern of a pre_tokenizer object.
std::string read_pre_tokenizer(const json& pre, const std::string& where) {
  if (pre.is_null()) return "";
  const std::string type = string_field(pre, "type");
  if (type == "ByteLevel") {
    STP_CHECK(!bool_field(pre, "add_prefix_space", false), "tokenizer: ", where,
              ": pre_tokenizer ByteLevel with add_prefix_space true is not supported");
    return bool_field(pre, "use_regex", true) ? kGpt2Pattern : "";
  }
  if (type == "Split") {
    auto p = pre.find("pattern");
    STP_CHECK(p != pre.end() && p->is_object() && p->contains("Regex") && (*p)["Regex"].is_string(),
              "tokenizer: ", where, ": pre_tokenizer Split without a {\"Regex\": ...} pattern is not supported");
    STP_CHECK(string_field(pre, "behavior") == "Isolated" && !bool_field(pre, "invert", false), "tokenizer: ", where,
              ": pre_tokenizer Split must have behavior Isolated and invert false (got behavior '",
              string_field(pre, "behavior"), "')");
    return (*p)["Regex"].get<std::string>();
  }
  if (type == "Sequence") {
    auto list = pre.find("pretokenizers");
    STP_CHECK(list != pre.end() && list->is_array(), "tokenizer: ", where, ": pre_tokenizer Sequence without a list");
    std::string pattern;
    for (const json& p : *list) {
      std::string one = read_pre_tokenizer(p, where);
      if (one.empty()) continue;
      STP_CHECK(pattern.empty(), "tokenizer: ", where,
                ": a pre_tokenizer Sequence with two splitting steps is not supported");
      pattern = one;
    }
    return pattern;
  }
  throw Error(
      str("tokenizer: ", where, ": pre_tokenizer type '", type, "' is not supported (ByteLevel, Split, Sequence)"));
}

BpeSpec read_tokenizer_json(const fs::path& path) {
  const std::string where = str("'", path.string(), "'");
  json j = parse_json(path);
  STP_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(), "tokenizer: ", where,
            " has no \"model\" object (not an HF tokenizer.json)");
  const json& model = j["model"];
  const std::string type = string_field(model, "type");
  STP_CHECK(type.empty() || type == "BPE", "tokenizer: ", where, ": model type '", type,
            "' is not supported (only BPE)");
  STP_CHECK(!bool_field(model, "byte_fallback", false), "tokenizer: ", where, ": byte_fallback BPE is not supported");
  STP_CHECK(
      string_field(model, "continuing_subword_prefix").empty() && string_field(model, "end_of_word_suffix").empty(),
      "tokenizer: ", where, ": continuing_subword_prefix / end_of_word_suffix are not supported");
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const std::string n = string_field(j["normalizer"], "type");
    STP_CHECK(n == "NFC", "tokenizer: ", where, ": normalizer '", n, "' is not supported (null or NFC)");
  }
  BpeSpec spec;
  spec.source = where;
  STP_CHECK(model.contains("vocab") && model.contains("merges") && model["merges"].is_array(), "tokenizer: ", where,
            ": model needs \"vocab\" and a \"merges\" list");
  read_vocab(model["vocab"], where, spec);
  for (const json& m : model["merges"]) {
    if (m.is_string()) {
      add_merge_line(m.get<std::string>(), where, spec);
    } else {
      STP_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), "tokenizer: ", where, ": merge ",
                m.dump(), " is neither \"a b\" nor [\"a\", \"b\"]");
      spec.merges.emplace_back(merge_part(m[0].get<std::string>(), where), merge_part(m[1].get<std::string>(), where));
    }
  }
  spec.ignore_merges = bool_field(model, "ignore_merges", false);
  spec.pattern = read_pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json(), where);
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& a : j["added_tokens"]) {
      STP_CHECK(a.is_object() && a.contains("id") && a.contains("content") && a["content"].is_string() &&
                    !a["content"].get<std::string>().empty(),
                "tokenizer: ", where, ": added token ", a.dump(), " needs an integer id and a non-empty content");
      const std::string content = a["content"].get<std::string>();
      spec.specials.push_back({content, token_id(a["id"], where, "added token " + content)});
    }
  }
  return spec;
}

}  // namespace

BpeSpec read_bpe_files(const std::string& path) {
  std::error_code ec;
  STP_CHECK(fs::exists(path, ec), "tokenizer: '", path, "' does not exist");
  if (!fs::is_directory(path, ec)) return read_tokenizer_json(path);
  const fs::path dir(path);
  if (fs::exists(dir / "tokenizer.json", ec)) return read_tokenizer_json(dir / "tokenizer.json");
  if (fs::exists(dir / "vocab.json", ec) && fs::exists(dir / "merges.txt", ec))
    return read_vocab_merges(dir / "vocab.json", dir / "merges.txt");
  if (fs::exists(dir / "encoder.json", ec) && fs::exists(dir / "vocab.bpe", ec))
    return read_vocab_merges(dir / "encoder.json", dir / "vocab.bpe");
  throw Error(str("tokenizer: folder '", path,
                  "' holds none of tokenizer.json, vocab.json + merges.txt, encoder.json + vocab.bpe"));
}

}  // namespace stp
