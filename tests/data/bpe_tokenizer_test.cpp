// The byte-level BPE tokenizer against the gpt-3-encoder npm package's own encoder (reference ids
// in tests/data/tokenizer/, written by tools/reference/gen_tokenizer_reference.sh), round trips, invalid
// UTF-8, tokenizer.json loading, special tokens, the chunked parallel encode, and load errors.
// The whole fortunes text is compared through `stp tokenize` (tests/tools/tokenize_test.sh).
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/bpe_files.h"
#include "data/bpe_tokenizer.h"
#include "data/byte_unicode.h"
#include "data/regex_split.h"
#include "data/data.h"
#include "data/utf8.h"
#include "tests/support/files.h"

using namespace stp;
using stp::testing::expect_error;
using stp::testing::read_bytes;
using stp::testing::ScratchDir;
using stp::testing::write_bytes;

namespace {

const std::string kDir = std::string(STP_SOURCE_DIR) + "/tests/data/tokenizer";

const BpeTokenizer& gpt2() {
  static const BpeTokenizer t = BpeTokenizer::load(kDir + "/gpt2");
  return t;
}

std::vector<std::int32_t> read_ids(const std::string& path) {
  std::istringstream in(read_bytes(path));
  std::vector<std::int32_t> ids;
  for (std::int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

// EXPECT equal, reporting the first difference with the text around it.
void expect_ids(const BpeTokenizer& tok, const std::vector<std::int32_t>& got, const std::vector<std::int32_t>& want) {
  EXPECT_EQ(got.size(), want.size());
  const std::size_t n = std::min(got.size(), want.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (got[i] == want[i]) continue;
    const std::size_t lo = i < 5 ? 0 : i - 5;
    std::vector<std::int32_t> ctx(want.begin() + std::ptrdiff_t(lo), want.begin() + std::ptrdiff_t(std::min(n, i + 5)));
    ADD_FAILURE() << "first difference at id " << i << ": got " << got[i] << " want " << want[i] << " near '"
                  << tok.decode(ctx) << "'";
    return;
  }
}

// tokenizer.json text for GPT-2's files, with merges as "a b" strings or [a, b] pairs.
std::string gpt2_tokenizer_json(bool pair_merges, const std::string& pre_tokenizer) {
  nlohmann::json vocab = nlohmann::json::parse(read_bytes(kDir + "/gpt2/encoder.json"));
  nlohmann::json merges = nlohmann::json::array();
  std::istringstream in(read_bytes(kDir + "/gpt2/vocab.bpe"));
  std::string line;
  std::getline(in, line);  // #version
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const std::size_t sp = line.find(' ');
    if (pair_merges) merges.push_back({line.substr(0, sp), line.substr(sp + 1)});
    else merges.push_back(line);
  }
  nlohmann::json j = {{"version", "1.0"},
                      {"added_tokens", {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}}},
                      {"normalizer", nullptr},
                      {"pre_tokenizer", nlohmann::json::parse(pre_tokenizer)},
                      {"decoder", {{"type", "ByteLevel"}}},
                      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  return j.dump();
}

// A tokenizer.json over the 256 bytes plus "ab" (no merges) and the given flags.
std::string tiny_tokenizer_json(bool ignore_merges) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_unicode::from_bytes(std::string(1, char(b)))] = b;
  vocab["ab"] = 256;
  nlohmann::json j = {
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}, {"ignore_merges", ignore_merges}}}};
  return j.dump();
}

}  // namespace

TEST(BpeTokenizer, MatchesTheReferenceOnAdversarialUnicode) {
  const std::string text = read_bytes(kDir + "/adversarial.txt");
  const std::vector<std::int32_t> want = read_ids(kDir + "/adversarial.ids");
  ASSERT_GT(want.size(), 2000u);
  expect_ids(gpt2(), gpt2().encode(text), want);
  EXPECT_EQ(gpt2().vocab_size(), 50257);
}

TEST(BpeTokenizer, DecodeOfEncodeIsTheIdentity) {
  EXPECT_EQ(gpt2().decode(gpt2().encode("")), "");
  const std::string adversarial = read_bytes(kDir + "/adversarial.txt");
  EXPECT_EQ(gpt2().decode(gpt2().encode(adversarial)), adversarial);
  // Pseudo-random valid UTF-8 over all of Unicode's planes (no surrogates).
  std::string text;
  std::uint64_t z = 7;
  for (int i = 0; i < 20000; ++i) {
    const std::uint64_t r = splitmix64(z++);
    char32_t cp = char32_t(r % 4 == 0 ? r % 0x110000 : r % 4 == 1 ? r % 0x800 : r % 0x80);
    if (cp >= 0xD800 && cp < 0xE000) cp = ' ';
    utf8::append(text, cp);
  }
  ASSERT_EQ(utf8::first_invalid(text), std::string::npos);
  EXPECT_EQ(gpt2().decode(gpt2().encode(text)), text);
  // The fortunes text, where installed.
  const std::filesystem::path fortunes = "/usr/share/games/fortunes/fortunes";
  if (std::filesystem::exists(fortunes)) {
    const std::string f = read_bytes(fortunes.string());
    EXPECT_EQ(gpt2().decode(gpt2().encode(f)), f);
  }
}

TEST(BpeTokenizer, InvalidUtf8IsAnErrorOrReplacedAsDocumented) {
  const std::string bad = read_bytes(kDir + "/invalid_utf8.txt");
  EXPECT_EQ(utf8::first_invalid(bad), 12u);  // "valid start " then a lone continuation byte
  expect_error([&] { gpt2().encode(bad); }, {"not valid UTF-8", "0x80", "offset 12"});
  expect_ids(gpt2(), gpt2().encode(utf8::replace_invalid(bad)), read_ids(kDir + "/invalid_utf8.replaced.ids"));
  // Strict UTF-8: overlong forms, surrogates, code points above U+10FFFF, truncation.
  for (const char* s : {"\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\xE2\x82"})
    EXPECT_EQ(utf8::first_invalid(std::string("ok") + s), 2u) << s;
  EXPECT_EQ(utf8::first_invalid("\xF4\x8F\xBF\xBF \xEF\xBF\xBF"), std::string::npos);
  EXPECT_EQ(utf8::replace_invalid("a\xF0\x9F\x98"
                                  "b\x80\x80"),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(BpeTokenizer, TokenizerJsonEncodesLikeTheVocabAndMergesFiles) {
  ScratchDir dir;
  const std::string text = read_bytes(kDir + "/adversarial.txt");
  const std::vector<std::int32_t> want = gpt2().encode(text);
  write_bytes(dir.file("bytelevel.json"),
              gpt2_tokenizer_json(false, R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})"));
  nlohmann::json split = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", kGpt2Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  std::filesystem::create_directories(dir.path() / "folder");
  write_bytes(dir.file("folder/tokenizer.json"), gpt2_tokenizer_json(true, split.dump()));
  for (const std::string& path : {dir.file("bytelevel.json"), dir.file("folder")}) {
    BpeTokenizer t = BpeTokenizer::load(path);
    EXPECT_EQ(t.vocab_size(), 50257) << path;
    expect_ids(t, t.encode(text), want);
  }
}

TEST(BpeTokenizer, SpecialTokensAreMatchedBeforeThePreSplit) {
  const BpeTokenizer& t = gpt2();
  ASSERT_EQ(t.token_id("<|endoftext|>"), std::optional<std::int32_t>(50256));
  std::vector<std::int32_t> want = t.encode("Hello");
  want.push_back(50256);
  want.push_back(50256);
  for (std::int32_t id : t.encode(" world")) want.push_back(id);
  const std::string text = "Hello<|endoftext|><|endoftext|> world";
  EXPECT_EQ(t.encode(text), want);
  EXPECT_EQ(t.decode(want), text);
  expect_error([&] { t.decode({50257}); }, {"id 50257", "not in the vocabulary"});
}

TEST(BpeTokenizer, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  ScratchDir dir;
  write_bytes(dir.file("plain.json"), tiny_tokenizer_json(false));
  write_bytes(dir.file("ignore.json"), tiny_tokenizer_json(true));
  EXPECT_EQ(BpeTokenizer::load(dir.file("plain.json")).encode("ab"), (std::vector<std::int32_t>{97, 98}));
  EXPECT_EQ(BpeTokenizer::load(dir.file("ignore.json")).encode("ab"), (std::vector<std::int32_t>{256}));
}

// Long texts are scanned in chunks joined where their cuts agree; cuts inside whitespace runs
// force a rescan. Each unit below ends on a piece boundary, so a text of k units encodes as k
// copies of one unit's ids.
TEST(BpeTokenizer, ChunkedEncodeEqualsTheWholeText) {
  const std::string units[] = {read_bytes(kDir + "/adversarial.txt"), "." + std::string(9998, ' ') + "x",
                               "\n\n" + std::string(5000, '\t') + "end."};
  for (const std::string& unit : units) {
    const std::vector<std::int32_t> one = gpt2().encode(unit);
    std::string text;
    std::vector<std::int32_t> want;
    while (text.size() < 3'000'000) {
      text += unit;
      want.insert(want.end(), one.begin(), one.end());
    }
    expect_ids(gpt2(), gpt2().encode(text), want);
  }
}

TEST(BpeTokenizer, LoadErrorsNameTheProblem) {
  ScratchDir dir;
  expect_error([&] { BpeTokenizer::load(dir.file("missing.json")); }, {"missing.json", "does not exist"});
  expect_error([&] { BpeTokenizer::load(dir.path().string()); }, {"tokenizer.json", "vocab.json + merges.txt"});
  write_bytes(dir.file("bad.json"), "{\"model\": ");
  expect_error([&] { BpeTokenizer::load(dir.file("bad.json")); }, {"bad.json", "not valid JSON"});
  write_bytes(dir.file("wordpiece.json"), R"({"model": {"type": "WordPiece", "vocab": {}}})");
  expect_error([&] { BpeTokenizer::load(dir.file("wordpiece.json")); }, {"WordPiece", "only BPE"});
  nlohmann::json j = nlohmann::json::parse(tiny_tokenizer_json(false));
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  write_bytes(dir.file("pre.json"), j.dump());
  expect_error([&] { BpeTokenizer::load(dir.file("pre.json")); }, {"pre_tokenizer type 'Whitespace'"});
  j = nlohmann::json::parse(tiny_tokenizer_json(false));
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  write_bytes(dir.file("regex.json"), j.dump());
  expect_error([&] { BpeTokenizer::load(dir.file("regex.json")); }, {"does not compile with PCRE2", "(unclosed"});
  j = nlohmann::json::parse(tiny_tokenizer_json(false));
  j["model"]["vocab"].erase(byte_unicode::from_bytes("\n"));
  write_bytes(dir.file("nobyte.json"), j.dump());
  expect_error([&] { BpeTokenizer::load(dir.file("nobyte.json")); }, {"no token for byte 10"});
  j = nlohmann::json::parse(tiny_tokenizer_json(false));
  j["model"]["merges"] = {"a c"};
  write_bytes(dir.file("merge.json"), j.dump());
  expect_error([&] { BpeTokenizer::load(dir.file("merge.json")); }, {"merge 0", "not all in the vocabulary"});
}

// Token ids are below 2^22 (data/bpe_files.h): a larger id is an error naming the file and the id,
// raised while the file is read, before anything is allocated per id. 2^31 - 1 used to overflow
// the vocabulary size (an out-of-bounds write), 2e9 to allocate a string per id up to it.
TEST(BpeTokenizer, IdsAtOrAboveTheCapAreRefusedBeforeAllocation) {
  ScratchDir dir;
  const std::pair<const char*, const char*> ids[] = {
      {"2147483647", "2147483647"},
      {"2000000000", "2000000000"},
      {"4194304", "4194304"},
      {"2e9", "2000000000.0"},  // a JSON number with an exponent is not an integer
      {"-1", "-1"}};
  for (const auto& [id_json, id] : ids) {
    nlohmann::json j = nlohmann::json::parse(tiny_tokenizer_json(false));
    j["model"]["vocab"]["ab"] = nlohmann::json::parse(id_json);
    write_bytes(dir.file("vocab.json"), j.dump());
    expect_error([&] { BpeTokenizer::load(dir.file("vocab.json")); }, {"vocab.json", "'ab'", id, "2^22"});
    j = nlohmann::json::parse(tiny_tokenizer_json(false));
    j["added_tokens"] = {{{"id", nlohmann::json::parse(id_json)}, {"content", "<|s|>"}}};
    write_bytes(dir.file("added.json"), j.dump());
    expect_error([&] { BpeTokenizer::load(dir.file("added.json")); }, {"added.json", "<|s|>", id, "2^22"});
  }
  // A spec built in code is held to the same cap.
  BpeSpec spec;
  spec.source = "'in code'";
  for (int b = 0; b < 256; ++b) spec.vocab.push_back({std::string(1, char(b)), b});
  spec.specials.push_back({"<|s|>", 2147483647});
  expect_error([&] { BpeTokenizer tok(spec); }, {"in code", "2147483647", "2^22"});
  // The largest id allowed loads: a vocabulary of 2^22 ids.
  nlohmann::json j = nlohmann::json::parse(tiny_tokenizer_json(false));
  j["model"]["vocab"]["ab"] = (1 << 22) - 1;
  write_bytes(dir.file("largest.json"), j.dump());
  EXPECT_EQ(BpeTokenizer::load(dir.file("largest.json")).vocab_size(), 1 << 22);
}

// Tokenizer files are regular files: a device such as /dev/zero never ends, so it is refused
// before it is read.
TEST(BpeTokenizer, ADeviceIsRefusedBeforeItIsRead) {
  expect_error([&] { BpeTokenizer::load("/dev/zero"); }, {"/dev/zero", "character device"});
}

// Llama-3's and Qwen2's pre-split patterns (as their tokenizer.json files give them, named in
// data/bpe_files.h: those tokenizers stream in chunks, data/text_stream.h) compile with
// PCRE2 and cut as Unicode properties say: case-insensitive contractions, digits in runs of at
// most 3 (Llama-3) or 1 (Qwen2), punctuation keeping its newlines, letters of any script.
TEST(RegexSplitter, Llama3AndQwen2Patterns) {
  const std::string llama3 = kLlama3Pattern;
  const std::string qwen2 = kQwen2Pattern;
  auto pieces = [](const std::string& pattern, const std::string& text) {
    RegexSplitter split(pattern);
    std::vector<std::size_t> ends;
    split.scan(text, 0, text.size(), ends);
    std::vector<std::string> out;
    std::size_t begin = 0;
    for (std::size_t e : ends) {
      out.push_back(text.substr(begin, e - begin));
      begin = e;
    }
    return out;
  };
  const std::string text = "Hello wörld 12345!!\n\nI'M \xD0\x9C\xD0\xB8\xD1\x80  x";  // "Мир"
  EXPECT_EQ(pieces(llama3, text), (std::vector<std::string>{"Hello", " wörld", " ", "123", "45", "!!\n\n", "I", "'M",
                                                            " \xD0\x9C\xD0\xB8\xD1\x80", " ", " x"}));
  EXPECT_EQ(pieces(qwen2, "a 123"), (std::vector<std::string>{"a", " ", "1", "2", "3"}));
  // The GPT-2 pattern is case-sensitive: "'M" is punctuation, then a letter.
  EXPECT_EQ(pieces(kGpt2Pattern, "I'M it's"), (std::vector<std::string>{"I", "'", "M", " it", "'s"}));
}
