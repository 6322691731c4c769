// Streaming the encoding of a text file (data/text_stream.h): cut at BpeTokenizer::stream_cut,
// the ids are those of encoding the whole file, for GPT-2's, Llama-3's and Qwen2's patterns, at
// chunk sizes down to one byte, on the adversarial text and on random texts built from the
// characters around which the patterns' pieces change.
#include <random>

#include "data/bpe_files.h"
#include "data/text_stream.h"
#include "data/utf8.h"
#include "tests/data/tokenizer_fixture.h"
#include "tests/support/files.h"

using namespace stp;
using stp::testing::expect_error;
using stp::testing::read_bytes;
using stp::testing::ScratchDir;
using stp::testing::write_bytes;

namespace {

const std::string& kDir = stp::testing::kTokenizerDir;
const BpeTokenizer& gpt2() { return stp::testing::gpt2_tokenizer(); }
BpeTokenizer with_pattern(const std::string& pattern) { return stp::testing::gpt2_with_chatml(pattern); }

std::vector<std::int32_t> stream(const BpeTokenizer& tok, const std::string& path, std::size_t chunk,
                                 std::size_t* chunks = nullptr, bool replace = false) {
  TextStreamOptions o;
  o.chunk_bytes = chunk;
  o.replace_invalid = replace;
  std::vector<std::int32_t> ids;
  std::size_t n = 0;
  encode_text_file(tok, path, "INPUT", o, [&](const std::vector<std::int32_t>& part) {
    ids.insert(ids.end(), part.begin(), part.end());
    ++n;
  });
  if (chunks) *chunks = n;
  return ids;
}

// Texts of units around which the pieces of the patterns change: whitespace runs before and
// after newlines, punctuation before newlines, contractions, digits, letters of other scripts,
// added tokens and their prefixes.
std::string random_text(std::uint32_t seed, std::size_t units) {
  static const char* const kUnits[] = {"\n",
                                       "\n",
                                       "\n",
                                       " ",
                                       "  ",
                                       "\t",
                                       "\r\n",
                                       "\r",
                                       "a",
                                       "Z",
                                       "word",
                                       "'s",
                                       "'T",
                                       "1",
                                       "123",
                                       ".",
                                       "!!",
                                       "?\n",
                                       "\xC3\xA9",
                                       "\xE4\xB8\xAD",
                                       "\xC2\xA0",
                                       "\xE3\x80\x80",
                                       "<|endoftext|>",
                                       "<|im_start|>",
                                       "<|im_end|>",
                                       "<|",
                                       "|>",
                                       "<|endof",
                                       "x\ny",
                                       ".\nA",
                                       " \nb",
                                       "\n\nc",
                                       "-"};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::size_t> pick(0, std::size(kUnits) - 1);
  std::string text;
  for (std::size_t i = 0; i < units; ++i) text += kUnits[pick(rng)];
  return text;
}

}  // namespace

TEST(TextStream, TinyChunksGiveTheIdsOfTheWholeText) {
  ScratchDir dir;
  struct Case {
    std::string name, text;
  };
  std::vector<Case> cases = {{"adversarial", read_bytes(kDir + "/adversarial.txt")}};
  for (std::uint32_t seed = 1; seed <= 6; ++seed)
    cases.push_back({"random" + std::to_string(seed), random_text(seed, 3000)});
  const BpeTokenizer llama3 = with_pattern(kLlama3Pattern), qwen2 = with_pattern(kQwen2Pattern);
  const std::pair<const BpeTokenizer*, const char*> tokenizers[] = {
      {&gpt2(), "GPT-2"}, {&llama3, "Llama-3"}, {&qwen2, "Qwen2"}};
  for (const auto& [tok, pattern] : tokenizers) {
    ASSERT_TRUE(tok->stream_cuts()) << pattern;
    for (const Case& c : cases) {
      write_bytes(dir.file("in.txt"), c.text);
      const std::vector<std::int32_t> whole = tok->encode(c.text);
      for (std::size_t chunk :
           {std::size_t(1), std::size_t(2), std::size_t(5), std::size_t(64), std::size_t(1000), std::size_t(1) << 24}) {
        std::size_t chunks = 0;
        EXPECT_EQ(stream(*tok, dir.file("in.txt"), chunk, &chunks), whole)
            << c.name << ", chunk " << chunk << ", " << pattern << " pattern";
        if (chunk <= 64) {
          EXPECT_GT(chunks, c.name == "adversarial" ? 4u : 50u) << c.name << ": the text was not cut";
        }
      }
    }
  }
}

// A safe cut is a newline between two printable ASCII characters that no added token straddles.
TEST(TextStream, CutsAreNewlinesBetweenPrintableCharacters) {
  const BpeTokenizer& t = gpt2();
  EXPECT_EQ(t.stream_cut("ab\ncd" + std::string(20, 'x'), 0), 3u);
  EXPECT_EQ(t.stream_cut("a \ncd" + std::string(20, 'x'), 0), std::string::npos);        // whitespace before
  EXPECT_EQ(t.stream_cut("ab\n cd" + std::string(20, 'x'), 0), std::string::npos);       // whitespace after
  EXPECT_EQ(t.stream_cut("ab\n\xC3\xA9" + std::string(20, 'x'), 0), std::string::npos);  // not ASCII
  EXPECT_EQ(t.stream_cut("ab\ncd\nef" + std::string(20, 'x'), 4), 6u);
  // The last 13 bytes (the longest added token, <|endoftext|>) are never cut: what follows decides.
  EXPECT_EQ(t.stream_cut("ab\ncd", 0), std::string::npos);
  BpeSpec spec = read_bpe_files(kDir + "/gpt2");
  spec.specials.push_back({"x\ny", 50257});
  const BpeTokenizer s(spec);
  EXPECT_EQ(s.stream_cut("ax\nyb\nc" + std::string(20, 'z'), 0), 6u);  // not inside "x\ny"
}

// A tokenizer with another pre-split pattern, or none, is not cut: the file is encoded whole.
TEST(TextStream, OtherPatternsAreNotCut) {
  ScratchDir dir;
  const std::string text = random_text(7, 2000);
  write_bytes(dir.file("in.txt"), text);
  for (const std::string& pattern : {std::string(), std::string(R"(\p{L}+|\s+|.)")}) {
    const BpeTokenizer t = with_pattern(pattern);
    EXPECT_FALSE(t.stream_cuts());
    EXPECT_EQ(t.stream_cut("ab\ncd" + std::string(20, 'x'), 0), std::string::npos);
    std::size_t chunks = 0;
    EXPECT_EQ(stream(t, dir.file("in.txt"), 16, &chunks), t.encode(text));
    EXPECT_EQ(chunks, 1u);
  }
}

// Invalid UTF-8: the error names the file and the offset in the file, not in the chunk; with
// replace_invalid the ids are those of replacing in the whole text.
TEST(TextStream, InvalidUtf8IsNamedByFileOffsetOrReplacedAsAWhole) {
  ScratchDir dir;
  std::string text;
  for (int i = 0; i < 50; ++i) text += "line " + std::to_string(i) + ".\n";
  const std::size_t bad = text.size() + 3;
  text += "abc\xFF\xC3 tail.\nmore text\n";
  write_bytes(dir.file("bad.txt"), text);
  expect_error([&] { stream(gpt2(), dir.file("bad.txt"), 16); }, {"bad.txt", "0xFF", "offset " + std::to_string(bad)});
  EXPECT_EQ(stream(gpt2(), dir.file("bad.txt"), 16, nullptr, true), gpt2().encode(utf8::replace_invalid(text)));
  write_bytes(dir.file("empty.txt"), "");
  EXPECT_TRUE(stream(gpt2(), dir.file("empty.txt"), 16).empty());
}
