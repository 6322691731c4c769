// Writing token files (stp tokenize) and reading the wide format (data.format tok32).
//
// llmc   llm.c's format: 256 little-endian int32 (magic 20240520, version 1, token count, zeros),
//        then the uint16 tokens. Read by data/data.cpp.
// tok32  stp's wide format, for vocabularies beyond 65536 ids (Qwen2 has 151k), little-endian:
//          bytes  0..7   magic "STPTOK32"
//          bytes  8..11  uint32 version = 1
//          bytes 12..15  uint32 vocab_size: every id is < vocab_size
//          bytes 16..23  uint64 token count N
//          bytes 24..31  uint64 reserved, 0
//          bytes 32..    N uint32 ids
//        parse_tok32_header() rejects (stp::Error, naming the file and the field) a file shorter
//        than the header, another magic or version, a nonzero reserved field and a size other than
//        32 + 4 N; data/data.h's reader also rejects an id >= vocab_size, naming its position.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace stp {

// Writes ids as llmc when vocab_size <= 65536, else tok32; returns the format written. The file
// appears whole or not at all (data/token_writer.h, which writes them as the ids arrive).
std::string write_token_file(const std::string& path, const std::vector<std::int32_t>& ids, std::int32_t vocab_size);

inline constexpr std::size_t kTok32HeaderBytes = 32;

struct Tok32Header {
  std::uint32_t vocab_size = 0;
  std::uint64_t count = 0;  // N: the ids are bytes 32 .. 32 + 4 N
};

// The header of the tok32 file whose bytes (all of them: the size is checked) are `bytes`; `path`
// names it in messages.
Tok32Header parse_tok32_header(std::string_view bytes, const std::string& path);

}  // namespace stp
