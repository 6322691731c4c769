// A byte-level BPE tokenizer of the GPT-2 / Llama-3 / Qwen2 kind (files: data/bpe_files.h).
//
// encode(text):
//   1. text must be valid UTF-8 (data/utf8.h), else stp::Error naming the byte offset
//      (utf8::replace_invalid() substitutes U+FFFD first, for callers that want that).
//   2. Special (added) tokens are found literally, longest first at each position, and cut the
//      text into segments; each becomes its own id.
//   3. Each segment is cut into pieces by the pre-split pattern (data/regex_split.h).
//   4. Each piece's bytes start as single-byte tokens; the adjacent pair of lowest merge rank is
//      merged, every occurrence left to right in one pass, until no pair has a rank (GPT-2's
//      procedure). With ignore_merges, a piece that is itself in the vocabulary is that one token.
// Long texts are scanned and merged in chunks in parallel (oneTBB); the ids are the same as a
// sequential encode, in order. Words are cached per thread, for the tokenizer's lifetime (at most
// 2^20 pieces of up to 64 bytes per thread, then the cache starts over).
//
// decode(ids) concatenates each token's bytes (it may end inside a UTF-8 character); an id outside
// the vocabulary is an stp::Error. decode(encode(x)) == x for every valid UTF-8 x.
//
// A BpeTokenizer is cheap to copy (shared, immutable state) and safe to use from many threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace stp {

struct BpeSpec;

class BpeTokenizer {
 public:
  // A tokenizer.json file or a folder (data/bpe_files.h); throws stp::Error with the reason.
  static BpeTokenizer load(const std::string& path);
  explicit BpeTokenizer(const BpeSpec& spec);

  std::vector<std::int32_t> encode(std::string_view text) const;
  // The same, calling progress(bytes encoded so far) now and then, from one thread at a time.
  using Progress = std::function<void(std::size_t)>;
  std::vector<std::int32_t> encode(std::string_view text, const Progress& progress) const;
  std::string decode(const std::vector<std::int32_t>& ids) const;
  std::int32_t vocab_size() const;  // 1 + the largest id of the vocabulary and the added tokens

  // Streaming (data/text_stream.h): the first safe cut of text at or after `from`, or npos when
  // none lies in [from, text.size() - 1 - the longest added token). A safe cut p splits the
  // encoding: encode(text) == encode(text[0, p)) ++ encode(text[p, ...)), whatever follows text.
  // Only a tokenizer whose pre-split pattern is GPT-2's, Llama-3's or Qwen2's
  // (data/bpe_files.h) has safe cuts (stream_cuts()); for any other pattern, or none, this is
  // npos. p is a safe cut when
  //   * text[p - 1] is a newline and text[p - 2] and text[p] are printable ASCII other than space
  //     (0x21..0x7E), and
  //   * no added token's bytes straddle p (one starting before p and ending after it).
  // Why the pre-split cannot join across such a p: in these patterns a newline is matched only by
  // \s, by [\r\n] and by the trailing [\r\n]* of ` ?[^\s\p{L}\p{N}]+[\r\n]*`, never by a class
  // that goes on to a printable character, so a piece ends at p. Because text[p - 2] is not
  // whitespace, the piece ending at p is "\n" alone or punctuation + "\n", whether the matcher
  // sees the printable text[p] or the end of the subject (`\s+(?!\S)` fails before a printable
  // character and `\s+` or `\s*[\r\n]+` then takes the same "\n"). The patterns have no
  // look-behind, so the scan from p does not depend on what came before it.
  // tests/data/text_stream_test.cpp checks the three on texts built around these cases.
  std::size_t stream_cut(std::string_view text, std::size_t from) const;
  bool stream_cuts() const;  // whether the pre-split pattern is one that has safe cuts

  // The id of a token given by its bytes (vocabulary or added token), if there is one.
  std::optional<std::int32_t> token_id(std::string_view bytes) const;
  bool pre_split_jit() const;  // whether PCRE2 JIT-compiled the pattern

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace stp
