// The byte-level BPE alphabet of GPT-2 and its descendants (Llama-3, Qwen2): each of the 256 byte
// values is written as one printable Unicode character, so that vocabulary files can be text.
// Bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves (as code points); the other 68
// bytes, in increasing order, become U+0100, U+0101, ... U+0143.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace stp::byte_unicode {

char32_t to_char(unsigned char byte);  // the character byte is written as

// The bytes a vocabulary string (UTF-8 of mapped characters) stands for; nothing when it holds a
// character outside the 256 of the map, or is not valid UTF-8.
std::optional<std::string> to_bytes(std::string_view mapped);

// The vocabulary string for raw bytes (inverse of to_bytes).
std::string from_bytes(std::string_view bytes);

}  // namespace stp::byte_unicode
