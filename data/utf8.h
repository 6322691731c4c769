// Strict UTF-8 (RFC 3629): no overlong forms, no surrogates (U+D800..U+DFFF), nothing above
// U+10FFFF. The tokenizer's input must be valid UTF-8 (data/bpe_tokenizer.h).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace stp::utf8 {

// Length of the valid UTF-8 sequence starting at text[i], or 0 when none starts there.
std::size_t sequence_length(std::string_view text, std::size_t i);

// Byte offset of the first byte that does not start a valid sequence, or npos when text is valid.
std::size_t first_invalid(std::string_view text);

// text with every ill-formed subsequence replaced by U+FFFD, one per maximal subpart (the
// "substitution of maximal subparts" practice of the Unicode standard, chapter 3, which WHATWG's
// TextDecoder also follows). Valid text comes back unchanged.
std::string replace_invalid(std::string_view text);

// The UTF-8 encoding of code point cp (< 0x110000, not a surrogate).
void append(std::string& out, char32_t cp);

}  // namespace stp::utf8
